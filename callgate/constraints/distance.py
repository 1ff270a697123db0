"""How many tokens a grammar state is from an accepting one (for budget closing).

Knows: outlines-core's Index (`get_next_state`, `is_final_state`) and the engine's tokens
by their bytes. Does not know: masks, vLLM, formats.

The Index is a DFA over bytes lifted to tokens, and byte-level BPE has a token for every
byte, so the shortest completion of a state is found cheaply over single-byte tokens
(256 transitions a state, where a free string state allows ~49k tokens): `ShortestText`
does a breadth-first search over them and memoises the text per (grammar key, state). The
text is then spelled with the longest allowed token at each position; `TokenDistances`
gives D(state), that spelling's token count (a call SmolLM2 writes in 30 tokens is about
30, not its 90 bytes).

D is an upper bound on the true distance, and it is kept consistent: the states the
spelling walks through get D(state) - k, so every state with D > 0 has an allowed token
to a state with D at most one less. That is what budget closing needs to never be late.
A search that visits more than `max_states` states gives up (LookupError): the caller then
leaves the row alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

UNREACHABLE = 1 << 30


class ShortestText:
    """S(state): a shortest byte string from `state` to a final state, memoised."""

    def __init__(self, byte_tokens: Mapping[int, int], max_states: int, capacity: int = 1 << 16) -> None:
        self.byte_tokens = sorted(byte_tokens.items())  # (byte, token id)
        self.token_of = dict(byte_tokens)
        self.max_states, self.capacity = max_states, capacity
        self.known: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def get(self, key: str, index: Any, state: int) -> bytes | None:
        """S(state); None when no final state is reachable. Raises LookupError when the
        search visited more than `max_states` states."""
        found = self.known.get((key, state))
        if found is None and index.is_final_state(state):
            found = b""
        if found is None:
            found = self._search(key, index, state)
        return found

    def _search(self, key: str, index: Any, state: int) -> bytes | None:
        parents: dict[int, tuple[int, int]] = {state: (-1, -1)}
        frontier, depth, best = [state], 0, None
        # A state whose text is known (or final) is not expanded: every path through it
        # costs at least its depth plus that text. Stop once deeper cannot beat `best`.
        while frontier and (best is None or depth + 1 < len(best)):
            depth += 1
            frontier, best = self._expand(key, index, frontier, parents, depth, best)
            if len(parents) > self.max_states:
                raise LookupError(f"no completion of state {state} within {self.max_states} states")
        if best is not None:
            self._remember_path(key, state, best, index)
        return best

    def _expand(
        self,
        key: str,
        index: Any,
        frontier: Sequence[int],
        parents: dict[int, tuple[int, int]],
        depth: int,
        best: bytes | None,
    ) -> tuple[list[int], bytes | None]:
        nxt: list[int] = []
        for s in frontier:
            for byte, token in self.byte_tokens:
                n = index.get_next_state(s, token)
                if n is None or n in parents:
                    continue
                parents[n] = (s, byte)
                tail = b"" if index.is_final_state(n) else self.known.get((key, n))
                if tail is None:
                    nxt.append(n)
                elif best is None or depth + len(tail) < len(best):
                    best = _path(parents, n) + tail
        return nxt, best

    def _remember_path(self, key: str, state: int, text: bytes, index: Any) -> None:
        # Every suffix of a shortest completion is a shortest completion of its state.
        for i in range(len(text)):
            if (key, state) not in self.known:
                self.known[(key, state)] = text[i:]
            state = index.get_next_state(state, self.token_of[text[i]])
        while len(self.known) > self.capacity:
            self.known.popitem(last=False)


def _path(parents: Mapping[int, tuple[int, int]], state: int) -> bytes:
    out = bytearray()
    while True:
        prev, byte = parents[state]
        if prev < 0:
            return bytes(reversed(out))
        out.append(byte)
        state = prev


class TokenDistances:
    """D(state) per (grammar key, state): S(state) spelled greedily with the longest allowed tokens."""

    def __init__(
        self, by_bytes: Mapping[bytes, Sequence[int]], *, max_states: int = 5_000, capacity: int = 1 << 20
    ) -> None:
        self.by_bytes = by_bytes
        self.longest = max((len(b) for b in by_bytes), default=1)
        singles = {data[0]: ids[0] for data, ids in by_bytes.items() if len(data) == 1 and ids}
        self.text = ShortestText(singles, max_states)
        self.capacity = capacity
        self.known: OrderedDict[tuple[str, int], int] = OrderedDict()

    def get(self, key: str, index: Any, state: int) -> int:
        """D(state); UNREACHABLE when no final state is reachable. Raises LookupError when
        the search gave up (see ShortestText)."""
        found = self.known.get((key, state))
        if found is not None:
            return found
        if index.is_final_state(state):
            return self._set(key, state, 0)
        text = self.text.get(key, index, state)
        if text is None:
            return self._set(key, state, UNREACHABLE)
        walked = self._spell(index, state, text)
        return self._settle(key, state, walked)

    def _spell(self, index: Any, state: int, text: bytes) -> list[int]:
        """The states after each token of `text` spelled longest-first from `state`."""
        states, pos = [], 0
        while pos < len(text):
            for end in range(min(len(text), pos + self.longest), pos, -1):
                n = self._first_allowed(index, state, text[pos:end])
                if n is not None:
                    state, pos = n, end
                    states.append(n)
                    break
            else:
                raise LookupError(f"the shortest completion is not spelled by the Index at byte {pos}")
        return states

    def _first_allowed(self, index: Any, state: int, piece: bytes) -> int | None:
        for token in self.by_bytes.get(piece, ()):
            n = index.get_next_state(state, token)
            if n is not None:
                return int(n)
        return None

    def _settle(self, key: str, state: int, walked: list[int]) -> int:
        # D(state) is the best of the spelling and of any walked state with a known D; the
        # walked states before that point get D(state) - k (each keeps a token to D - 1).
        distance, cut = len(walked), len(walked)
        for k, n in enumerate(walked, start=1):
            known = self.known.get((key, n))
            if known is not None and k + known < distance:
                distance, cut = k + known, k
        self._set(key, state, distance)
        for k, n in enumerate(walked[:cut], start=1):
            if self.known.get((key, n), UNREACHABLE) > distance - k:
                self._set(key, n, distance - k)
        return distance

    def _set(self, key: str, state: int, distance: int) -> int:
        self.known[(key, state)] = distance
        while len(self.known) > self.capacity:
            self.known.popitem(last=False)
        return distance
