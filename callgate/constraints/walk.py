"""Budget closing's token walk: a state's allowed tokens grouped by what they need, in C.

Knows: a ByteAutomaton (byte table, distances D), the engine's ordinary tokens as one byte
string with offsets, and the bitmask layout (bit j of word w is token 32 * w + j). Does
not know: outlines-core, vLLM, requests; budget.py calls `Walker.groups` once per
(grammar, state) and keeps the result.

The need of a token t allowed at state s is D(next) + 2 (the token, the rest of the
completion, EOS); EOS itself needs 1 where s is final. Needs of `cap` or more are one
group (`cap`): budget closing never has that many tokens left.

Why C: a free-string state allows ~49k tokens, and walking each one's bytes through the
table is ~320k lookups: ~0.6 ms in C, ~100 ms in Python. Most of them never leave the
state (every byte of the token loops back to it), which one test of the token's byte set
against the state's looping bytes (ByteAutomaton.loops) tells without the walk; most of
the others take one byte into a state where the rest loops (a string's first character,
then the string), which one lookup and the same test on the token's later bytes tell.
One pass sets each token's bit in its need's row of a scratch matrix.
`group_by_need_reference` is the Python twin (the tests compare the two); it is used when
no C compiler is found.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from callgate.constraints.automaton import ByteAutomaton
from callgate.kernels.native import NativeUnavailable, compile_library

log = logging.getLogger("callgate.constraints.walk")

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
static inline int within(const uint64_t *set, const uint64_t *loop) {
  return !((set[0] & ~loop[0]) | (set[1] & ~loop[1]) | (set[2] & ~loop[2]) | (set[3] & ~loop[3]));
}
/* One pass over the allowed bits: each token's need, and its bit set in row `need` of
   `out` (a row is zeroed the first time its need occurs; `present` marks it). */
int64_t callgate_groups(const int32_t *table, const int32_t *dist, const uint64_t *loops,
                        const uint8_t *data, const int64_t *offsets, const uint64_t *bytesets,
                        const uint64_t *tails, int64_t n_tokens, const uint32_t *allowed,
                        int64_t n_words, int64_t start, int64_t eos, int64_t is_final, int32_t cap,
                        uint8_t *present, uint32_t *out) {
  const uint64_t *loop = loops + 4 * start;
  const int32_t *from = table + start * 256;
  int32_t stay = dist[start] < cap - 2 ? dist[start] + 2 : cap;
  int64_t count = 0;
  for (int64_t w = 0; w < n_words; w++) {
    uint32_t m = allowed[w];
    while (m) {
      int j = __builtin_ctz(m);
      m &= m - 1;
      int64_t t = 32 * w + j;
      int32_t k = cap;
      if (t == eos) {
        k = is_final ? 1 : cap;
      } else if (t < n_tokens && offsets[t] < offsets[t + 1]) {
        if (within(bytesets + 4 * t, loop)) {
          k = stay; /* every byte loops back: the token ends where it starts */
        } else {
          int64_t s = from[data[offsets[t]]];
          /* the first byte moves, the rest loop there: one lookup instead of the walk */
          if (s >= 0 && !within(tails + 4 * t, loops + 4 * s))
            for (int64_t p = offsets[t] + 1; p < offsets[t + 1] && s >= 0; p++) s = table[s * 256 + data[p]];
          if (s >= 0 && dist[s] < cap - 2) k = dist[s] + 2;
        }
      }
      uint32_t *row = out + (int64_t)k * n_words;
      if (!present[k]) {
        memset(row, 0, (size_t)n_words * 4);
        present[k] = 1;
      }
      row[w] |= 1u << j;
      count++;
    }
  }
  return count;
}
"""


@dataclass(frozen=True, slots=True)
class TokenBytes:
    """Every ordinary token's bytes: token t is `data[offsets[t]:offsets[t + 1]]` (empty
    for ids that are not ordinary tokens: EOS, special tokens, gaps)."""

    data: numpy.ndarray  # uint8
    offsets: numpy.ndarray  # int64 [n_tokens + 1]
    bytesets: numpy.ndarray  # uint64 [n_tokens, 4]: bit b set when byte b occurs in the token
    tails: numpy.ndarray  # uint64 [n_tokens, 4]: the same for the token's bytes after its first

    @classmethod
    def of(cls, by_bytes: Mapping[bytes, Sequence[int]]) -> TokenBytes:
        pieces = {i: piece for piece, ids in by_bytes.items() for i in ids}
        n = max(pieces, default=-1) + 1
        ordered = [pieces.get(i, b"") for i in range(n)]
        lengths = numpy.fromiter((len(p) for p in ordered), dtype=numpy.int64, count=n)
        offsets = numpy.concatenate(([0], numpy.cumsum(lengths))).astype(numpy.int64)
        data = numpy.frombuffer(b"".join(ordered), dtype=numpy.uint8).copy()
        owner = numpy.repeat(numpy.arange(n, dtype=numpy.int64), lengths)
        bits = numpy.left_shift(numpy.uint64(1), (data & 63).astype(numpy.uint64))
        bytesets = numpy.zeros((n, 4), dtype=numpy.uint64)
        numpy.bitwise_or.at(bytesets, (owner, data >> 6), bits)
        later = numpy.ones(len(data), dtype=numpy.bool_)
        later[offsets[:-1][lengths > 0]] = False  # each token's first byte
        tails = numpy.zeros((n, 4), dtype=numpy.uint64)
        numpy.bitwise_or.at(tails, (owner[later], data[later] >> 6), bits[later])
        return cls(data, offsets, bytesets, tails)

    @property
    def n_tokens(self) -> int:
        return len(self.offsets) - 1


@dataclass(frozen=True, slots=True)
class Groups:
    """The allowed tokens of one state by need: `needs` ascending and distinct, `single[k]`
    the bitmask of group k alone ([len(needs), words] int32)."""

    needs: tuple[int, ...]
    single: numpy.ndarray


class Walker:
    """Groups a state's allowed tokens by need, in C, with scratch buffers kept between
    calls (one per engine)."""

    def __init__(self, tokens: TokenBytes, eos: int, cap: int) -> None:
        self.tokens, self.eos, self.cap = tokens, eos, cap
        self.present = numpy.zeros(cap + 1, dtype=numpy.uint8)
        self.out = numpy.empty((cap + 1, 0), dtype=numpy.int32)  # one row per need, grown to the width
        # numpy's `.ctypes.data` costs about a microsecond a call: take the addresses once
        self.data_ptr, self.offsets_ptr = int(tokens.data.ctypes.data), int(tokens.offsets.ctypes.data)
        self.bytesets_ptr, self.tails_ptr = int(tokens.bytesets.ctypes.data), int(tokens.tails.ctypes.data)
        self.present_ptr, self.out_ptr = int(self.present.ctypes.data), 0

    def groups(self, automaton: ByteAutomaton, state: int, allowed: numpy.ndarray) -> Groups:
        """Group the tokens set in `allowed` (the grammar's own int32 mask row of dense
        state `state`) by need. Raises LookupError when nothing is allowed."""
        groups_fn = _functions()
        if groups_fn is None:
            return group_by_need_reference(automaton, self.tokens, state, allowed, self.eos, self.cap)
        row = numpy.ascontiguousarray(allowed, dtype=numpy.int32)
        n_words = row.size
        if self.out.shape[1] != n_words:
            self.out = numpy.empty((self.cap + 1, n_words), dtype=numpy.int32)
            self.out_ptr = int(self.out.ctypes.data)
        self.present.fill(0)
        count = groups_fn(
            automaton.table_ptr,
            automaton.distance_ptr,
            automaton.loops_ptr,
            self.data_ptr,
            self.offsets_ptr,
            self.bytesets_ptr,
            self.tails_ptr,
            self.tokens.n_tokens,
            row.ctypes.data,
            n_words,
            state,
            self.eos,
            int(automaton.final[state]),
            self.cap,
            self.present_ptr,
            self.out_ptr,
        )
        if not count:
            raise LookupError("a state with no allowed token")
        found = numpy.flatnonzero(self.present)
        return Groups(tuple(found.tolist()), self.out[found])


def group_by_need_reference(
    automaton: ByteAutomaton, tokens: TokenBytes, state: int, allowed: numpy.ndarray, eos: int, cap: int
) -> Groups:
    """The same groups in plain Python (see module doc)."""
    words = numpy.asarray(allowed, dtype=numpy.int32).tolist()
    by_need: dict[int, list[int]] = {}
    table, distance, offsets, data = automaton.table, automaton.distance, tokens.offsets, tokens.data
    for w, word in enumerate(words):
        for j in range(32):
            if not (word >> j) & 1:
                continue
            t, k = 32 * w + j, cap
            if t == eos:
                k = 1 if automaton.final[state] else cap
            elif t < tokens.n_tokens and offsets[t] < offsets[t + 1]:
                s = state
                for byte in data[offsets[t] : offsets[t + 1]].tolist():
                    s = int(table[s, byte])
                    if s < 0:
                        break
                if s >= 0 and distance[s] < cap - 2:
                    k = int(distance[s]) + 2
            by_need.setdefault(k, []).append(t)
    if not by_need:
        raise LookupError("a state with no allowed token")
    needs = tuple(sorted(by_need))
    single = numpy.stack([pack_bits(by_need[k], len(words)).numpy() for k in needs])
    return Groups(needs, single)


def pack_bits(ids: Sequence[int], n_words: int) -> torch.Tensor:
    """Token ids -> one int32 bitmask row of `n_words` words (little-endian bit order)."""
    bits = numpy.zeros(n_words * 32, dtype=numpy.bool_)
    bits[numpy.asarray(ids, dtype=numpy.int64)] = True
    return torch.from_numpy(numpy.packbits(bits, bitorder="little").view("<i4").astype(numpy.int32))


@functools.cache
def _functions() -> Any | None:
    try:
        library = compile_library("walk", _SOURCE)
    except NativeUnavailable as exc:
        log.warning("budget closing walks tokens in Python (slow): %s", exc)
        return None
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    groups = library.callgate_groups
    groups.argtypes = (ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i32, ptr, ptr)
    groups.restype = i64
    return groups
