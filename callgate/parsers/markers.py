"""A fixed set of markers found in streamed text, with the hold-back a stream parser keeps.

Knows: strings only -- where the earliest marker starts, and how much of a text's end
could still become a marker once more text arrives. Does not know: any format, state
machine, buffer or event. Every parser family (json_*, qwen3_xml*, dsml*) finds its
markers with this one primitive.

Contract, for a set built by `MarkerSet.of(markers)`:
* `find(text, start)` is the leftmost marker at or after `start`; at one position the
  longest marker wins.
* `hold_from(text, start)` is the first index i >= start such that text[i:] is a proper,
  non-empty prefix of a marker (len(text) when there is none). A stream parser passes
  text[start:i] on and keeps text[i:] (at most `longest - 1` characters) for the next delta.
* `waits(text)`: text is a proper prefix of a marker and holds no whole marker, so a
  parser that finds nothing in it and holds back from its start can only wait.
* Split invariance: when no marker occurs inside a proper prefix of another marker (true
  of every set the parsers build; then `waiting == prefixes`), taking text up to `find`,
  or else up to `hold_from`, and scanning on after appending the next delta finds the same
  markers at the same offsets for any split of the text.

Cost: `hold_from` looks only at the last `longest - 1` characters, so a stream that holds
back at most that much costs O(len(delta)) per delta.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_NEVER = re.compile(r"(?!x)x")  # the pattern of an empty set: matches nothing


@dataclass(frozen=True, slots=True)
class MarkerSet:
    """Finds the earliest of a fixed set of markers and the tail of a text that may still
    become one. Build with `MarkerSet.of`; frozen, so one set serves every request."""

    markers: tuple[str, ...]  # longest first, then in code-point order
    pattern: re.Pattern[str]  # the alternation of `markers`, in that order
    prefixes: frozenset[str]  # the proper, non-empty prefixes of the markers
    waiting: frozenset[str]  # those with no whole marker inside: such a text can only wait
    firsts: str  # the distinct first characters of the markers, sorted
    starts: re.Pattern[str]  # finds any of `firsts`: a text without one holds no (part of a) marker
    longest: int  # the length of the longest marker (0 for an empty set)

    @staticmethod
    def of(markers: Iterable[str]) -> MarkerSet:
        """The set of `markers` (duplicates collapse). Raises ValueError on an empty marker,
        which would match everywhere."""
        ordered = tuple(sorted(set(markers), key=lambda m: (-len(m), m)))
        if "" in ordered:
            raise ValueError("a marker must not be empty")
        if not ordered:
            return MarkerSet((), _NEVER, frozenset(), frozenset(), "", _NEVER, 0)
        pattern = re.compile("|".join(re.escape(m) for m in ordered))
        prefixes = frozenset(m[:k] for m in ordered for k in range(1, len(m)))
        firsts = "".join(sorted({m[0] for m in ordered}))
        return MarkerSet(
            markers=ordered,
            pattern=pattern,
            prefixes=prefixes,
            waiting=frozenset(p for p in prefixes if pattern.search(p) is None),
            firsts=firsts,
            starts=re.compile("[" + "".join(re.escape(c) for c in firsts) + "]"),
            longest=len(ordered[0]),
        )

    def find(self, text: str, start: int = 0) -> re.Match[str] | None:
        """The leftmost marker in text[start:] (the longest one at that position), or None."""
        return self.pattern.search(text, start)

    def at(self, text: str, pos: int) -> str | None:
        """The marker that starts exactly at `pos`, if any (the longest one)."""
        m = self.pattern.match(text, pos)
        return m.group() if m else None

    def hold_from(self, text: str, start: int = 0) -> int:
        """The first index >= start from which text's tail is a proper prefix of a marker
        (len(text) when none): the text from there must wait for more input."""
        n = len(text)
        found = self.starts.search(text, max(start, n - self.longest + 1))
        while found is not None:  # None at once in the common case: no first character
            i = found.start()
            if text[i:] in self.prefixes:
                return i
            found = self.starts.search(text, i + 1)
        return n

    def could_start(self, text: str, pos: int) -> bool:
        """text[pos:] is a proper prefix of a marker: more input could complete one."""
        return text[pos : pos + self.longest] in self.prefixes

    def waits(self, text: str) -> bool:
        """`text` is the start of a marker and holds no whole one (see the module docstring)."""
        return text in self.waiting
