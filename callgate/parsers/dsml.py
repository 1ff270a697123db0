"""DSML output parser (DeepSeek V3.2 and V4): one incremental machine for both versions.

Knows: the shape of one assistant turn (golden/dsml/FORMAT.md section 6): optional
reasoning up to `</think>` (when the prompt opened it), content, at most one calls block
introduced by a blank line, then only the end-of-sentence token. Markers come from the
format spec; the block itself is read by dsml_block.BlockReader.

Strictness: the reference's rejections are diagnostics with the golden reason codes
(`missing_think_end`, `call_in_reasoning`, `special_token_in_content`,
`block_not_preceded_by_blank_line`, `trailing_text`, and the block codes). After the first
such error the rest of the output is neither content nor calls. Candidates are handed out
(CallEnd) only when their block is well formed and followed by the end of turn or the end
of the output; each call's CallStart and ArgumentsDelta stream earlier. A completion
without the final end-of-sentence token is accepted (engines strip it), unlike the
reference. A call to a tool not in `tools` is still a candidate, with `unknown_tool`.

Cost: feed(delta) looks at the delta plus a hold-back of at most one marker.
"""

from __future__ import annotations

from enum import Enum, auto

from callgate.formats import ToolCallFormat
from callgate.parsers.base import CallIdFactory, ResultBuilder, StreamParser, Tools, tool_names
from callgate.parsers.dsml_block import BlockReader
from callgate.parsers.dsml_scan import Buffer, MarkerSet, match_literals
from callgate.types import (
    CallEnd,
    Diagnostic,
    DiagnosticEvent,
    Event,
    ParseResult,
    ReasoningDelta,
    TextDelta,
)


class _S(Enum):
    REASONING = auto()
    CONTENT = auto()
    BLOCK = auto()
    AFTER_BLOCK = auto()
    AFTER_EOS = auto()
    FAILED = auto()


def make_parser(fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> StreamParser:
    return DsmlParser(fmt, tools, thinking=thinking, call_ids=call_ids)


class DsmlParser:
    """Per-request parser. parse(text) == feed(text) + finish(), for any split of text."""

    def __init__(self, fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> None:
        m = fmt.markers
        self._fmt = fmt
        self._names = tool_names(tools)
        self._call_ids = call_ids
        # "\n\n<｜DSML｜": the call trigger up to the block name (a wrong name is then an error)
        self._trigger = fmt.call_trigger[: fmt.call_trigger.index(m["dsml"]) + len(m["dsml"])]
        self._glued = self._trigger.removeprefix(m["call_prefix"])
        think = (fmt.reasoning_open or "<think>", fmt.reasoning_close or "</think>")
        common = (self._trigger, self._glued, m["dsml"], fmt.eos, fmt.bos, think[0])
        self._markers = MarkerSet((*common, think[1]))
        self._buf = Buffer()
        self._state = _S.REASONING if thinking else _S.CONTENT
        self._block: BlockReader | None = None
        self._builder = ResultBuilder()

    def feed(self, delta: str) -> list[Event]:
        self._buf.append(delta)
        return self._builder.add(self._run(final=False))

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self._state is _S.REASONING:
            close = self._fmt.reasoning_close
            events += self._fail("missing_think_end", f"expected {close!r}, got the end of output", 0)
        elif self._state is _S.AFTER_BLOCK:
            events += self._hand_out()
        return self._builder.add(events)

    def result(self) -> ParseResult:
        return self._builder.result()

    # ---- the machine ----------------------------------------------------------------

    def _run(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            before = (self._state, self._buf.offset)
            events += self._step(final)
            if (self._state, self._buf.offset) == before:
                return events

    def _step(self, final: bool) -> list[Event]:
        s = self._state
        if s is _S.REASONING or s is _S.CONTENT:
            return self._text(final)
        if s is _S.BLOCK:
            return self._in_block(final)
        if s is _S.AFTER_BLOCK:
            return self._after_block(final)
        if s is _S.AFTER_EOS and len(self._buf):
            got = self._buf.peek(1)
            return self._fail("trailing_text", f"expected the end of output, got {got!r}", 1, self._buf.offset)
        self._buf.take(len(self._buf))  # FAILED: the rest is neither content nor calls
        return []

    def _text(self, final: bool) -> list[Event]:
        reasoning = self._state is _S.REASONING
        hit = self._markers.scan(self._buf, final=final)
        events: list[Event] = []
        if hit.text:
            events.append(ReasoningDelta(hit.text) if reasoning else TextDelta(hit.text))
        if hit.marker is not None:
            events += self._marker(hit.marker, reasoning)
        return events

    def _marker(self, marker: str, reasoning: bool) -> list[Event]:
        at = self._buf.offset - len(marker)
        fmt = self._fmt
        if reasoning and marker == fmt.reasoning_close:
            self._state = _S.CONTENT
            return []
        if reasoning and marker in (self._trigger, self._glued):
            message = f"expected {fmt.reasoning_close!r} before a call, got {marker!r}"
            return self._fail("call_in_reasoning", message, len(marker), at)
        if reasoning and marker == fmt.eos:
            return self._fail("missing_think_end", f"expected {fmt.reasoning_close!r}, got {marker!r}", len(marker), at)
        if marker == self._trigger:
            self._state = _S.BLOCK
            self._block = BlockReader(fmt, 0, self._call_ids)
            return []
        if marker == fmt.eos:
            self._state = _S.AFTER_EOS
            return []
        code = "block_not_preceded_by_blank_line" if marker == self._glued else "special_token_in_content"
        return self._fail(code, f"expected text, got the special token {marker!r}", len(marker), at)

    def _in_block(self, final: bool) -> list[Event]:
        assert self._block is not None
        events = self._block.run(self._buf, final=final)
        if self._block.failure is not None:
            self._state = _S.FAILED
            events.append(DiagnosticEvent(self._block.failure))
        elif self._block.closed:
            self._state = _S.AFTER_BLOCK
        return events

    def _after_block(self, final: bool) -> list[Event]:
        choice = match_literals(self._buf, [self._fmt.eos], final=final)
        if choice.index == 0:
            self._state = _S.AFTER_EOS
            return self._hand_out()
        got = self._buf.peek(choice.common + 1)[choice.common :]
        if choice.index == -1 or not got:
            return []
        at = self._buf.offset + choice.common
        return self._fail("trailing_text", f"expected {self._fmt.eos!r} after the calls block, got {got!r}", 1, at)

    def _hand_out(self) -> list[Event]:
        assert self._block is not None
        events: list[Event] = []
        for index, cand in enumerate(self._block.candidates):
            if self._names is not None and cand.name not in self._names:
                message = f"expected one of the declared tools, got {cand.name!r} at offset {cand.span[0]}"
                events.append(DiagnosticEvent(Diagnostic("unknown_tool", message, cand.span)))
            events.append(CallEnd(index, cand))
        self._block.candidates.clear()
        return events

    def _fail(self, code: str, message: str, width: int, at: int | None = None) -> list[Event]:
        """A fatal diagnostic at `at` (default: the current offset minus `width`)."""
        at = self._buf.offset - width if at is None else at
        self._state = _S.FAILED
        return [DiagnosticEvent(Diagnostic(code, f"{message} at offset {at}", (at, at + width)))]
