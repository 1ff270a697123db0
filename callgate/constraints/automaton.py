"""The byte automaton under an outlines-core Index, and every state's distance to the end.

Knows: outlines-core's Index (`get_initial_state`, `get_next_state`, `is_final_state`) and
the engine's ordinary tokens by their bytes. Does not know: masks, budgets, vLLM, formats.

The Index is a DFA over bytes lifted to tokens, and byte-level BPE has a one-byte token for
every byte its tokens use, so asking the Index for each state's one-byte tokens recovers
the DFA itself: `table[s, b]`, the state after byte b (-1: not allowed), over dense state
numbers 0..n-1 (0 is the initial state; `ids` maps back to the Index's numbering). Every
Index state is reached that way (each token's path passes through states its one-byte
tokens reach too). Measured on BFCL grammars and SmolLM2: 380-1 400 states, 5-40 ms.

A token's next state is then its bytes walked through `table` (walk.py, in C): the same
state `get_next_state` gives (checked in the tests), without asking the Index per token.

`distance[s]` (D) is an upper bound on the tokens from s to a final state, kept
consistent: every state with 0 < D < UNREACHABLE has an allowed token to a state with
D - 1. How: B(s), the bytes of a shortest completion, by a breadth-first search backwards
from the final states; the canonical completion of s follows, from each state, the lowest
byte that lowers B; D(s) is the fewest tokens that spell that text (each token a prefix of
it, states taken in order of B, so the rest is already known). A state that cannot reach
a final state has D = UNREACHABLE.

`reach[s]` is the largest D among the states that a path of 1 to `longest` bytes leads to
from s (`longest`: the vocabulary's longest token), -1 where no byte leaves s. Any
token allowed at s ends in one of them, so no token there needs more than reach[s] + 2
tokens to close (walk.py's need): with that many tokens left, budget closing has nothing
to restrict at s and skips its plan. Computed with the rest (a few ms: at most `longest`
rounds over the distinct edges) and shipped in the same file.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy

UNREACHABLE = 1 << 30
DEFAULT_MAX_STATES = 20_000  # ~0.5 s of Index queries; a larger grammar is left alone (LookupError)


@dataclass(frozen=True, slots=True)
class Spelling:
    """What the distance search needs of a vocabulary: one-byte tokens by byte, every
    ordinary token's bytes, and every prefix of them (to stop a spelling early)."""

    singles: tuple[tuple[int, int], ...]  # (byte, token id), ascending bytes
    tokens: frozenset[bytes]
    prefixes: frozenset[bytes]

    @classmethod
    def of(cls, by_bytes: Mapping[bytes, Sequence[int]]) -> Spelling:
        tokens = frozenset(data for data, ids in by_bytes.items() if data and ids)
        singles = tuple(sorted((data[0], ids[0]) for data, ids in by_bytes.items() if len(data) == 1 and ids))
        prefixes = frozenset(data[:k] for data in tokens for k in range(1, len(data) + 1))
        return cls(singles, tokens, prefixes)

    @classmethod
    def usable(cls, by_bytes: Mapping[bytes, Sequence[int]]) -> Spelling | None:
        """The vocabulary's Spelling, None when a token uses a byte without a one-byte
        token (the byte automaton cannot walk it)."""
        found = cls.of(by_bytes)
        return found if found.covers(by_bytes) else None

    def covers(self, data: Iterable[bytes]) -> bool:
        """True when every byte of every token in `data` has a one-byte token."""
        have = {b for b, _ in self.singles}
        return all(set(piece) <= have for piece in data)


@dataclass(frozen=True, slots=True)
class ByteAutomaton:
    """One grammar's DFA over bytes (dense states) and its distances D."""

    ids: numpy.ndarray  # [n] int64: dense state -> Index state
    dense: Mapping[int, int]  # Index state -> dense state
    table: numpy.ndarray  # [n, 256] int32: next dense state, -1 where the byte is not allowed
    final: numpy.ndarray  # [n] bool
    distance: numpy.ndarray  # [n] int32: D, UNREACHABLE without a completion
    to_end: numpy.ndarray  # [n] int64: B, bytes of a shortest completion (UNREACHABLE: none)
    reach: numpy.ndarray  # [n] int32: the largest D one token's bytes can lead to (-1: none)
    loops: numpy.ndarray  # [n, 4] uint64: bit b of row s set when byte b leads from s back to s
    # addresses of `table` and `distance` for walk.py's C calls (numpy's `.ctypes.data`
    # costs about a microsecond each time)
    table_ptr: int = field(init=False, repr=False, compare=False)
    distance_ptr: int = field(init=False, repr=False, compare=False)
    loops_ptr: int = field(init=False, repr=False, compare=False)
    # the largest D of any state (UNREACHABLE when some state has no completion): no
    # token anywhere in this grammar needs more than farthest + 2 tokens to close
    farthest: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, array in (("table", self.table), ("distance", self.distance), ("loops", self.loops)):
            if not array.flags.c_contiguous:
                raise ValueError(f"ByteAutomaton.{name} must be C-contiguous")
        object.__setattr__(self, "table_ptr", int(self.table.ctypes.data))
        object.__setattr__(self, "distance_ptr", int(self.distance.ctypes.data))
        object.__setattr__(self, "loops_ptr", int(self.loops.ctypes.data))
        object.__setattr__(self, "farthest", int(self.distance.max(initial=0)))

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.table, self.final, self.distance, self.to_end, self.reach, self.loops)
        return sum(int(a.nbytes) for a in arrays) + 64 * len(self.dense)

    def shortest_text(self, state: int) -> bytes | None:
        """The canonical shortest completion of dense state `state` (what D spells); None
        when no final state is reachable."""
        if self.to_end[state] >= UNREACHABLE:
            return None
        out = bytearray()
        while not self.final[state]:
            nxt = self.table[state]
            byte = next(b for b in range(256) if nxt[b] >= 0 and self.to_end[nxt[b]] == self.to_end[state] - 1)
            out.append(byte)
            state = int(nxt[byte])
        return bytes(out)

    def state(self, index_state: int) -> int:
        """The dense number of an Index state. Raises LookupError for a state the byte
        search did not reach (never seen: see the module doc)."""
        found = self.dense.get(index_state)
        if found is None:
            raise LookupError(f"Index state {index_state} is not in the byte automaton")
        return found


def build_automaton(index: Any, spelling: Spelling, max_states: int = DEFAULT_MAX_STATES) -> ByteAutomaton:
    """The byte automaton and distances of `index`. Raises LookupError when it has more
    than `max_states` states."""
    ids, table = _byte_table(index, spelling.singles, max_states)
    final = numpy.fromiter((bool(index.is_final_state(s)) for s in ids), dtype=numpy.bool_, count=len(ids))
    by_bytes = _bytes_to_end(table, final)
    distance = _token_distances(table, final, by_bytes, spelling)
    reach = _reach(table, distance, max(map(len, spelling.tokens), default=1))
    dense = {int(s): i for i, s in enumerate(ids)}
    ids_array = numpy.asarray(ids, dtype=numpy.int64)
    return ByteAutomaton(ids_array, dense, table, final, distance, by_bytes, reach, _loops(table))


def _loops(table: numpy.ndarray) -> numpy.ndarray:
    """Per state, the bytes that lead back to it, as 256 bits (four little-endian words)."""
    back = table == numpy.arange(len(table), dtype=table.dtype)[:, None]
    packed = numpy.packbits(back, axis=1, bitorder="little")  # [n, 32] bytes
    words: numpy.ndarray = numpy.ascontiguousarray(packed).view("<u8").astype(numpy.uint64)
    return words


def _byte_table(index: Any, singles: Sequence[tuple[int, int]], max_states: int) -> tuple[list[int], numpy.ndarray]:
    start = int(index.get_initial_state())
    ids, dense, rows = [start], {start: 0}, []
    step = index.get_next_state
    for s in ids:  # grows while it is read: a breadth-first search
        row = [-1] * 256
        for byte, token in singles:
            n = step(s, token)
            if n is None:
                continue
            d = dense.get(n)
            if d is None:
                if len(ids) >= max_states:
                    raise LookupError(f"the grammar has more than {max_states} byte states")
                d = dense[n] = len(ids)
                ids.append(int(n))
            row[byte] = d
        rows.append(row)
    return ids, numpy.asarray(rows, dtype=numpy.int32).reshape(len(ids), 256)


def _bytes_to_end(table: numpy.ndarray, final: numpy.ndarray) -> numpy.ndarray:
    """B: bytes of a shortest completion per state (UNREACHABLE: none), backwards BFS."""
    n = len(final)
    src = numpy.repeat(numpy.arange(n, dtype=numpy.int64), 256)
    dst = table.reshape(-1).astype(numpy.int64)
    keep = dst >= 0
    src, dst = src[keep], dst[keep]
    order = numpy.argsort(dst, kind="stable")
    src = src[order]
    starts = numpy.searchsorted(dst[order], numpy.arange(n + 1))
    dist = numpy.full(n, UNREACHABLE, dtype=numpy.int64)
    frontier = numpy.flatnonzero(final)
    dist[frontier] = 0
    level = 0
    while frontier.size:
        level += 1
        lo, hi = starts[frontier], starts[frontier + 1]
        lens = hi - lo
        if not lens.sum():
            break
        # the predecessors of every frontier state, gathered in one go
        idx = numpy.repeat(lo - numpy.concatenate(([0], numpy.cumsum(lens)[:-1])), lens) + numpy.arange(lens.sum())
        preds = numpy.unique(src[idx])
        frontier = preds[dist[preds] == UNREACHABLE]
        dist[frontier] = level
    return dist


def _token_distances(
    table: numpy.ndarray, final: numpy.ndarray, by_bytes: numpy.ndarray, spelling: Spelling
) -> numpy.ndarray:
    """D per state: the fewest tokens spelling the canonical shortest completion."""
    n = len(final)
    after = numpy.where(table >= 0, by_bytes[numpy.maximum(table, 0)], UNREACHABLE)
    best_byte = numpy.argmin(after, axis=1)  # lowest byte among the ties
    nxt = table[numpy.arange(n), best_byte]
    distance = numpy.full(n, UNREACHABLE, dtype=numpy.int64)
    distance[final] = 0
    tokens, prefixes = spelling.tokens, spelling.prefixes
    nxt_l, byte_l, b_l = nxt.tolist(), best_byte.tolist(), by_bytes.tolist()
    for s in numpy.argsort(by_bytes, kind="stable").tolist():
        if final[s] or b_l[s] >= UNREACHABLE:
            continue
        piece, state, best = b"", s, UNREACHABLE
        for _ in range(b_l[s]):
            piece += bytes((byte_l[state],))
            state = nxt_l[state]
            if piece not in prefixes:
                break
            if piece in tokens:
                best = min(best, 1 + int(distance[state]))
            if final[state]:
                break
        distance[s] = best
    return numpy.minimum(distance, UNREACHABLE).astype(numpy.int32)


def _reach(table: numpy.ndarray, distance: numpy.ndarray, longest: int) -> numpy.ndarray:
    """reach[s]: the largest D over the states 1..`longest` bytes from s (-1: none)."""
    n = len(distance)
    src, byte = numpy.nonzero(table >= 0)  # sorted by source state
    pairs = numpy.unique(src.astype(numpy.int64) * n + table[src, byte])  # distinct edges, by source
    src, dst = pairs // n, pairs % n
    starts = numpy.searchsorted(src, numpy.arange(n))
    has_edges = numpy.bincount(src, minlength=n) > 0

    def widest(values: numpy.ndarray) -> numpy.ndarray:  # per state, the largest value over its edges
        out = numpy.full(n, -1, dtype=numpy.int64)
        if len(dst):
            out[has_edges] = numpy.maximum.reduceat(values[dst], starts[has_edges])
        return out

    one = widest(distance.astype(numpy.int64))
    reach = one
    for _ in range(longest - 1):
        wider = numpy.maximum(one, widest(reach))
        if numpy.array_equal(wider, reach):
            break
        reach = wider
    clamped: numpy.ndarray = numpy.minimum(reach, UNREACHABLE).astype(numpy.int32)
    return clamped


_ARRAYS: dict[str, Any] = {
    "ids": numpy.int64,
    "table": numpy.int32,
    "final": numpy.bool_,
    "distance": numpy.int32,
    "to_end": numpy.int64,
    "reach": numpy.int32,
    "loops": numpy.uint64,
}


def automaton_bytes(automaton: ByteAutomaton) -> bytes:
    """The arrays of `automaton` as an .npz archive (no pickle)."""
    out = io.BytesIO()
    numpy.savez(out, **{name: getattr(automaton, name) for name in _ARRAYS})
    return out.getvalue()


def automaton_from_bytes(data: bytes) -> ByteAutomaton:
    """What `automaton_bytes` wrote. Raises ValueError when it is not a well-formed automaton."""
    try:
        with numpy.load(io.BytesIO(data), allow_pickle=False) as archive:
            arrays = {name: numpy.ascontiguousarray(archive[name]) for name in _ARRAYS}
    except (OSError, KeyError, ValueError, EOFError) as exc:
        raise ValueError(f"not a closing-table archive: {exc}") from exc
    n = len(arrays["ids"])
    shapes = {
        "ids": (n,),
        "table": (n, 256),
        "final": (n,),
        "distance": (n,),
        "to_end": (n,),
        "reach": (n,),
        "loops": (n, 4),
    }
    for name, dtype in _ARRAYS.items():
        if arrays[name].dtype != dtype or arrays[name].shape != shapes[name]:
            raise ValueError(f"closing-table array {name}: {arrays[name].dtype} {arrays[name].shape}")
    if n == 0 or int(arrays["table"].max(initial=-1)) >= n or int(arrays["table"].min(initial=-1)) < -1:
        raise ValueError("closing-table byte table points outside its states")
    dense = {int(s): i for i, s in enumerate(arrays["ids"].tolist())}
    return ByteAutomaton(dense=dense, **arrays)
