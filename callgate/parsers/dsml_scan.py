"""Incremental text scanning for the DSML parser: a buffer with absolute offsets, a set of
markers searched with a bounded hold-back, and a matcher for literal alternatives.

Knows: strings and offsets only. Does not know: DSML, events or diagnostics.

Cost: each call looks at the unconsumed tail of the buffer, which is the new delta plus at
most one marker's length of held-back text, so feeding a text costs O(len(text)) overall.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


class Buffer:
    """Unconsumed output text. `offset` is the absolute position of the next character."""

    __slots__ = ("_base", "_pos", "_text")

    def __init__(self) -> None:
        self._text = ""
        self._pos = 0
        self._base = 0

    def append(self, delta: str) -> None:
        # the unconsumed tail is at most one marker long after each run, so this copy is small
        self._base += self._pos
        self._text = self._text[self._pos :] + delta
        self._pos = 0

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def rest(self) -> str:
        return self._text[self._pos :]

    def __len__(self) -> int:
        return len(self._text) - self._pos

    def startswith(self, literal: str) -> bool:
        return self._text.startswith(literal, self._pos)

    def find(self, char: str) -> int:
        """Relative index of `char` in the unconsumed text, or -1."""
        i = self._text.find(char, self._pos)
        return -1 if i < 0 else i - self._pos

    def peek(self, n: int) -> str:
        return self._text[self._pos : self._pos + n]

    def take(self, n: int) -> str:
        out = self._text[self._pos : self._pos + n]
        self._pos += len(out)
        return out


@dataclass(frozen=True, slots=True)
class Hit:
    text: str  # the text before the marker (safe to emit)
    marker: str | None  # the marker found, or None when the scan stopped before a possible one


class MarkerSet:
    """Finds the earliest of several markers; holds back a possible partial marker at the end.

    No marker may be a prefix of another (so the earliest match never depends on how the
    text was split)."""

    __slots__ = ("_longest", "_prefixes", "_rx")

    def __init__(self, markers: Sequence[str]) -> None:
        ordered = sorted(set(markers), key=len, reverse=True)
        self._rx = re.compile("|".join(re.escape(m) for m in ordered))
        self._prefixes = frozenset(m[:k] for m in ordered for k in range(1, len(m)))
        self._longest = max(map(len, self._prefixes), default=0)

    def scan(self, buf: Buffer, *, final: bool) -> Hit:
        """Consume text up to (and including) the earliest marker, or up to a possible partial
        marker at the end (everything when `final`)."""
        rest = buf.rest()
        hit = self._rx.search(rest)
        if hit is not None:
            text = buf.take(hit.start())
            buf.take(len(hit.group()))
            return Hit(text, hit.group())
        hold = 0 if final else self._held(rest)
        return Hit(buf.take(len(rest) - hold), None)

    def _held(self, rest: str) -> int:
        for k in range(min(len(rest), self._longest), 0, -1):
            if rest[-k:] in self._prefixes:
                return k
        return 0


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
    best, common, waiting = 0, -1, False
    for i, alt in enumerate(alternatives):
        n = _common_prefix(head, alt)
        if n == len(alt):
            buf.take(n)
            return Choice(i)
        if n == len(head) and not final:
            waiting = True
        if n > common:
            best, common = i, n
    return Choice(-1) if waiting else Choice(-2, best, common)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
