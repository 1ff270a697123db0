"""Stop sequences applied to the text outside tool calls, on the parser's event stream.

Knows: events (content, reasoning, calls) and stop strings. Does not know: formats,
engines or HTTP.

Why not the engine's own stop strings: vLLM applies them to the whole output, so a stop
string that occurs in a call's markup or arguments (`"\\n"` in hermes' `<tool_call>\\n{`,
`"}"`, a city name) would cut the call and leave an unreadable block; one inside a reasoning
block would leave it unterminated (`missing_think_end`). OpenAI applies stop sequences to
the generated text and never cuts a tool call; so when calls or reasoning may be written
(serving/conform.py `stops_outside_markup`), the engine gets no stop strings and this
filter ends the output at the first stop string in content or reasoning: one in reasoning
ends the turn with the reasoning so far, as `max_tokens` does there. Text that may be the
start of a stop string is held back until it is known not to be one (a stop string can
span deltas, not a call or a block boundary).
"""

from __future__ import annotations

from collections.abc import Sequence

from callgate.parsers.base import ResultBuilder
from callgate.types import Event, ParseResult, ReasoningDelta, TextDelta

_Text = TextDelta | ReasoningDelta


class StopFilter:
    """Per-request: `feed(events)` passes the events up to the first stop string (cut
    before it, the stop string excluded) and sets `stopped`; after that it passes nothing.
    `finish(events)` also releases held-back text. `result()` is the ParseResult of the
    passed events (the output as if generation had ended at the stop string); `matched` is
    the stop string that ended it."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._held = ""
        self._held_kind: type[_Text] = TextDelta
        self._builder = ResultBuilder()
        self.stopped = False
        self.matched: str | None = None

    def feed(self, events: Sequence[Event]) -> list[Event]:
        out: list[Event] = []
        for ev in events:
            if self.stopped:
                break
            if isinstance(ev, (TextDelta, ReasoningDelta)):
                self._text(ev, out)
            else:
                self._release(out)
                out.append(ev)
        return self._builder.add(out)

    def finish(self, events: Sequence[Event]) -> list[Event]:
        out = self.feed(events)
        if not self.stopped:
            tail: list[Event] = []
            self._release(tail)
            out += self._builder.add(tail)
        return out

    def result(self) -> ParseResult:
        return self._builder.result()

    def _text(self, ev: _Text, out: list[Event]) -> None:
        if type(ev) is not self._held_kind:
            self._release(out)
            self._held_kind = type(ev)
        text = self._held + ev.text
        hits = [(i, s) for s in self._stop if (i := text.find(s)) >= 0]
        if hits:
            hit, self.matched = min(hits)
            self.stopped = True
            self._held = ""
            if hit:
                out.append(self._held_kind(text[:hit]))
            return
        keep = self._prefix_len(text)
        self._held = text[len(text) - keep :]
        if len(text) > keep:
            out.append(self._held_kind(text[: len(text) - keep]))

    def _release(self, out: list[Event]) -> None:
        if self._held:
            out.append(self._held_kind(self._held))
            self._held = ""

    def _prefix_len(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of a stop string."""
        longest = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest
