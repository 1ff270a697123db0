"""What a lazy row may write before its trigger: a format's free-text rules, as a byte walk.

Knows: the rules (the trigger; the markers content may not hold; a reasoning block the
output may open at its very start, and the markers that block may not hold) and how text
steps through them. Does not know: formats (grammar.py derives the rules from the same
family pieces the eager content grammar is built from), vocabularies or masks
(late_trigger.py), or vLLM.

The eager modes spell content as `text_without(markers)`; a lazy row's text before its
trigger is not in its grammar, so the processor keeps the same markers out of it by masking
the tokens whose text would complete one (the strict parser rejects them in content). The
walk's state is (phase, tail): the phase (START: the output so far is a proper prefix of
the reasoning opener; REASONING; CONTENT; CALL: the trigger was found, and the tail is the
text from it on) and the tail, the longest suffix of the text that is a proper prefix of a
pattern (a marker, the trigger, the opener or the closer): all that later text needs.

A marker may stand only inside the trigger (DSML's trigger holds `｜`, which content may
not): content is allowed while each marker in it starts at or after the start of the
trigger, once found, or of the longest trigger prefix the text ends with. Such a marker
is *pending*: only the rest of the trigger may follow, and the output may not end there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

START, REASONING, CONTENT, CALL = 0, 1, 2, 3
State = tuple[int, bytes]


def _finder(markers: Iterable[bytes]) -> re.Pattern[bytes] | None:
    ordered = sorted(set(markers), key=lambda m: (-len(m), m))
    return re.compile(b"|".join(re.escape(m) for m in ordered)) if ordered else None


def proper_prefixes(patterns: Iterable[bytes]) -> frozenset[bytes]:
    """Every non-empty proper prefix of each pattern."""
    return frozenset(p[:k] for p in patterns for k in range(1, len(p)))


class FreeText:
    """The free-text rules of one (format, trigger); compare by identity (kept per format)."""

    __slots__ = (
        "_content",
        "_content_prefixes",
        "_longest",
        "_reasoning",
        "_reasoning_prefixes",
        "closing",
        "content",
        "opening",
        "patterns",
        "reasoning",
        "trigger",
    )

    def __init__(
        self,
        trigger: bytes,
        content: Iterable[bytes] = (),
        *,
        opening: bytes = b"",
        closing: bytes = b"",
        reasoning: Iterable[bytes] = (),
    ) -> None:
        """`content` / `reasoning`: the markers each may not hold (the trigger and the closer
        are dropped from them: they end the part). `opening` b"": no reasoning block."""
        if not trigger or bool(opening) != bool(closing):
            raise ValueError("FreeText needs a trigger, and an opener only with a closer")
        self.trigger, self.opening, self.closing = trigger, opening, closing
        self.content = tuple(sorted({m for m in content if m and m != trigger}))
        self.reasoning = tuple(sorted({m for m in reasoning if m and m != closing})) if opening else ()
        ends = (opening, closing) if opening else ()
        self.patterns = tuple(sorted({trigger, *self.content, *self.reasoning, *ends}))
        self._content, self._reasoning = _finder(self.content), _finder(self.reasoning)
        self._content_prefixes = proper_prefixes((trigger, *self.content))
        self._reasoning_prefixes = proper_prefixes((closing, *self.reasoning)) if opening else frozenset()
        self._longest = max(len(p) for p in self.patterns)

    def start(self) -> State:
        return (START, b"") if self.opening else (CONTENT, b"")

    def step(self, state: State, data: bytes) -> State | None:
        """The state after `data` (CALL: the trigger was found; its tail is the text from
        the trigger on), None when the text breaks the rules."""
        phase, tail = state
        text = tail + data
        if phase == CONTENT:
            return self._in_content(text)
        if phase == REASONING:
            return self._in_reasoning(text)
        if phase == START:
            return self._at_start(text)
        raise ValueError("a CALL state takes no more free text")

    def may_end(self, state: State) -> bool:
        """Whether the output may end here (EOS): no reasoning block left open, no marker pending."""
        phase, tail = state
        return phase != REASONING and (self._content is None or self._content.search(tail) is None)

    def pending(self, state: State) -> bool:
        """A marker stands in the trigger prefix the text ends with: only the trigger may follow."""
        return state[0] == CONTENT and self._content is not None and self._content.search(state[1]) is not None

    def _in_content(self, text: bytes) -> State | None:
        at = text.find(self.trigger)
        hit = self._content.search(text) if self._content is not None else None
        if at >= 0:
            return None if hit is not None and hit.start() < at else (CALL, text[at:])
        if hit is not None and hit.start() < len(text) - len(begun_prefix(text, self.trigger)):
            return None
        return CONTENT, self._keep(text, self._content_prefixes)

    def _in_reasoning(self, text: bytes) -> State | None:
        end = text.find(self.closing)
        hit = self._reasoning.search(text) if self._reasoning is not None else None
        if end >= 0 and (hit is None or hit.start() >= end):
            return self._in_content(text[end + len(self.closing) :])
        if hit is not None:
            return None
        return REASONING, self._keep(text, self._reasoning_prefixes)

    def _at_start(self, text: bytes) -> State | None:
        if text.startswith(self.opening):
            return self._in_reasoning(text[len(self.opening) :])
        if self.opening.startswith(text):
            return START, text
        return self._in_content(text)

    def _keep(self, text: bytes, prefixes: frozenset[bytes]) -> bytes:
        for k in range(min(len(text), self._longest - 1), 0, -1):
            if text[-k:] in prefixes:
                return text[-k:]
        return b""


def begun_prefix(text: bytes, trigger: bytes) -> bytes:
    """The longest non-empty proper prefix of `trigger` that `text` ends with (b"" when none)."""
    for m in range(min(len(trigger) - 1, len(text)), 0, -1):
        if text.endswith(trigger[:m]):
            return trigger[:m]
    return b""
