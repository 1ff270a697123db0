"""Incremental text scanning for the DSML parser: a buffer with absolute offsets, a scan
for the earliest of a MarkerSet (parsers/markers.py) with its bounded hold-back, and a
matcher for literal alternatives.

Knows: strings and offsets only. Does not know: DSML, events or diagnostics.

Cost: each call looks at the unconsumed tail of the buffer, which is the new delta plus at
most one marker's length of held-back text, so feeding a text costs O(len(text)) overall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from callgate.parsers.markers import MarkerSet


class Buffer:
    """Unconsumed output text. `offset` is the absolute position of the next character;
    `pos` (read only outside) changes only by `take` between two `append`s, so comparing
    it tells whether a step consumed anything. `base` is the offset of the text's start:
    a per-delta fast path that handles text without the buffer, while nothing is
    unconsumed, adds its length there directly (what `skip` does, without the call)."""

    __slots__ = ("_text", "base", "pos")

    def __init__(self) -> None:
        self._text = ""
        self.pos = 0
        self.base = 0

    def append(self, delta: str) -> None:
        # the unconsumed tail is at most one marker long after each run, so this copy is small
        self.base += self.pos
        self._text = self._text[self.pos :] + delta
        self.pos = 0

    def skip(self, n: int) -> None:
        """Count `n` characters handled outside the buffer (only when nothing is unconsumed)."""
        self.base += n  # the text is all consumed: offset = base + pos moves by n

    def skip_all(self, delta: str) -> bool:
        """`skip(len(delta))` when nothing is unconsumed (True); else nothing (False)."""
        if self.pos != len(self._text):
            return False
        self.base += len(delta)
        return True

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def rest(self) -> str:
        return self._text[self.pos :]

    def __len__(self) -> int:
        return len(self._text) - self.pos

    def startswith(self, literal: str) -> bool:
        return self._text.startswith(literal, self.pos)

    def find(self, char: str) -> int:
        """Relative index of `char` in the unconsumed text, or -1."""
        i = self._text.find(char, self.pos)
        return -1 if i < 0 else i - self.pos

    def peek(self, n: int) -> str:
        return self._text[self.pos : self.pos + n]

    def take(self, n: int) -> str:
        out = self._text[self.pos : self.pos + n]
        self.pos += len(out)
        return out


# (the text before the marker, safe to emit; the marker found, or None when the scan stopped
# before a possible one). A plain tuple: one is built per scan, on the per-delta path.
Hit = tuple[str, str | None]


def scan(markers: MarkerSet, buf: Buffer, *, final: bool) -> Hit:
    """Consume text up to (and including) the earliest of `markers`, or up to a possible
    partial marker at the end (everything when `final`)."""
    rest = buf.rest()
    hit = markers.pattern.search(rest)
    if hit is not None:
        text = buf.take(hit.start())
        marker = hit.group()
        buf.take(len(marker))
        return text, marker
    return buf.take(len(rest) if final else markers.hold_from(rest)), None


@dataclass(frozen=True, slots=True)
class Choice:
    """Result of matching literal alternatives at the start of the buffer.

    index >= 0: alternative `index` matched (and was consumed); index == -1: not decidable
    yet (more text needed); index == -2: no alternative can match, `common` characters
    matched the longest-agreeing alternative `best`."""

    index: int
    best: int = 0
    common: int = 0


def match_literals(buf: Buffer, alternatives: Sequence[str], *, final: bool) -> Choice:
    """Match one of `alternatives` (none a prefix of another) at the buffer start."""
    head = buf.peek(max(len(a) for a in alternatives))
    waiting = False
    for i, alt in enumerate(alternatives):
        if head.startswith(alt):
            buf.take(len(alt))
            return Choice(i)
        if not final and alt.startswith(head):
            waiting = True
    if waiting:
        return Choice(-1)
    best, common = 0, -1
    for i, alt in enumerate(alternatives):  # no match: find where the text went wrong
        n = _common_prefix(head, alt)
        if n > common:
            best, common = i, n
    return Choice(-2, best, common)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
