"""Which tokens would complete a lazy grammar's trigger (to hold back a call that cannot close).

Knows: token ids -> bytes (special tokens too, since a trigger may be one), and the tail of
free text a lazy row keeps (at most len(trigger) - 1 bytes). Does not know: grammars,
budgets, vLLM; processor.py decides when to use it.

Before its trigger a lazy row is free text. When the tokens left can no longer hold a whole
call (the trigger included) and EOS, the processor masks the tokens that would complete the
trigger, so the model writes text instead of starting a call that would be cut. A token
completes the trigger when its bytes contain it, or when they start with the rest of a
trigger that a suffix of the tail began. The sets are found by scanning the vocabulary once
per (trigger, suffix length) (~10 ms for 49k tokens) and kept.

`marks(trigger)` serves the processor's free-text bookkeeping: a flag per token id, set where
the token's bytes contain the trigger or end with a proper prefix of it. A row with no trigger
prefix begun that samples an unflagged token still has none begun and no trigger, so it skips
the token with one lookup (most free-text tokens).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy

from callgate.constraints.walk import pack_bits


class TriggerGuard:
    """Bitmask rows that allow every token except those completing a trigger."""

    def __init__(self, pieces: Mapping[int, bytes]) -> None:
        self.pieces = pieces
        self.completing: dict[tuple[bytes, int], frozenset[int]] = {}
        self.masks: dict[tuple[bytes, int, int], tuple[numpy.ndarray, int]] = {}
        self._marks: dict[bytes, bytes] = {}

    def marks(self, trigger: bytes) -> bytes:
        """Per token id (ids past the end have no bytes): 1 where the token's bytes contain
        `trigger` or end with a non-empty proper prefix of it, else 0. Kept per trigger."""
        found = self._marks.get(trigger)
        if found is None:
            flags = bytearray(max(self.pieces, default=-1) + 1)
            first = trigger[:1]
            for i, data in self.pieces.items():
                if first in data and (trigger in data or begun_prefix(data, trigger)):
                    flags[i] = 1
            found = self._marks[trigger] = bytes(flags)
        return found

    def row(self, trigger: bytes, tail: bytes, n_words: int) -> tuple[numpy.ndarray, int]:
        """The allowed-bits row (int32) for a row whose free text ends with `tail`, and the
        address of its first word. Kept per trigger, width and the longest trigger prefix the
        tail ends with (which fixes every shorter one it ends with: each is a suffix of that
        prefix); kept rows are never freed, so the address stays valid."""
        longest = len(begun_prefix(tail, trigger))
        slot = (trigger, longest, n_words)
        found = self.masks.get(slot)
        if found is None:
            begun = [m for m in range(1, longest + 1) if tail.endswith(trigger[:m])]
            banned = set(self._completing(trigger, 0)).union(*(self._completing(trigger, m) for m in begun))
            row = (~pack_bits(sorted(i for i in banned if i < 32 * n_words), n_words)).numpy()
            found = self.masks[slot] = (row, int(row.ctypes.data))
        return found

    def _completing(self, trigger: bytes, begun: int) -> frozenset[int]:
        """Tokens that complete `trigger` when its first `begun` bytes precede them."""
        slot = (trigger, begun)
        found = self.completing.get(slot)
        if found is None:
            rest = trigger[begun:]
            if begun:
                found = frozenset(i for i, data in self.pieces.items() if data.startswith(rest))
            else:
                found = frozenset(i for i, data in self.pieces.items() if rest in data)
            self.completing[slot] = found
        return found


def begun_prefix(text: bytes, trigger: bytes) -> bytes:
    """The longest non-empty proper prefix of `trigger` that `text` ends with (b"" when none)."""
    for m in range(min(len(trigger) - 1, len(text)), 0, -1):
        if text.endswith(trigger[:m]):
            return trigger[:m]
    return b""
