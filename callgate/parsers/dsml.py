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

Cost: feed(delta) looks at the delta plus a hold-back of at most one marker. Most deltas
skip the machine (`_quick`, BlockReader.quick): with nothing held back, text, value or name
text that cannot start or end a marker becomes at most one event; text that only extends
the start of a marker is held back. Inside a tag of the block, deltas are only collected
until the character that can end the tag arrives (BlockReader.waits_for; at most
_MAX_WAIT_CHARS), then the machine reads them at once: the machine gives the same events
for any split, so reading later changes nothing but when the tag's events come out.
Markers are compiled once per format.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from callgate.formats import DsmlMarkers, ToolCallFormat
from callgate.parsers.base import CallIdFactory, ResultBuilder, StreamParser, Tools, tool_names
from callgate.parsers.dsml_block import HELD_DISTINCT, HELD_SHORT, BlockReader
from callgate.parsers.dsml_scan import Buffer, match_literals, scan
from callgate.parsers.markers import MarkerSet
from callgate.types import (
    CallEnd,
    Diagnostic,
    DiagnosticEvent,
    Event,
    ParseResult,
    ReasoningDelta,
    TextDelta,
)

# Inside a tag of the block the machine can only hold text back until the tag ends (">", or
# the "\n" that starts a call after its name): deltas are held unread until that character
# comes, at most this many characters, then read at once.
_MAX_WAIT_CHARS = 128


class _S(Enum):
    REASONING = auto()
    CONTENT = auto()
    BLOCK = auto()
    AFTER_BLOCK = auto()
    AFTER_EOS = auto()
    FAILED = auto()
    DONE = auto()  # finish() ran: later deltas are ignored, as every format's parser does


# An enum member is looked up through its class (~45 ns here against ~15 ns for a module
# name): the per-delta path in `feed` compares against these.
_BLOCK, _CONTENT, _REASONING = _S.BLOCK, _S.CONTENT, _S.REASONING


@dataclass(frozen=True, slots=True)
class TextSyntax:
    """The markers of the text around the block; built once per format (see `text_syntax`)."""

    fmt: ToolCallFormat
    trigger: str  # "\n\n<｜DSML｜": the call trigger up to the block name (a wrong name is then an error)
    glued: str  # the trigger without its blank line
    markers: MarkerSet  # what ends text or reasoning


_SYNTAX: dict[str, TextSyntax] = {}


def text_syntax(fmt: ToolCallFormat) -> TextSyntax:
    """The markers around the block of `fmt`, built once per format."""
    known = _SYNTAX.get(fmt.name)
    if known is not None and known.fmt is fmt:
        return known
    m = fmt.markers_as(DsmlMarkers)
    trigger = fmt.call_trigger[: fmt.call_trigger.index(m.dsml) + len(m.dsml)]
    glued = trigger.removeprefix(m.call_prefix)
    think = (fmt.reasoning_open or "<think>", fmt.reasoning_close or "</think>")
    markers = MarkerSet.of((trigger, glued, m.dsml, fmt.eos, fmt.bos, *think))
    known = TextSyntax(fmt, trigger, glued, markers)
    _SYNTAX[fmt.name] = known
    return known


def make_parser(fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> StreamParser:
    return DsmlParser(fmt, tools, thinking=thinking, call_ids=call_ids)


class DsmlParser:
    """Per-request parser. parse(text) == feed(text) + finish(), for any split of text."""

    def __init__(self, fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> None:
        syntax = text_syntax(fmt)
        self._fmt = fmt
        self._names = tool_names(tools)
        self._call_ids = call_ids
        self._trigger, self._glued = syntax.trigger, syntax.glued
        self._markers = syntax.markers
        self._buf = Buffer()
        self._state = _S.REASONING if thinking else _S.CONTENT
        self._block: BlockReader | None = None
        self._builder = ResultBuilder()
        self._waiting: str | None = None  # deltas held, unread, until the tag they are in can end
        self._wait_char, self._wait_left = ">", 1
        self._block_held = False  # in the block, not waiting, and the buffer holds text back

    def feed(self, delta: str) -> list[Event]:
        # One function on purpose: it runs once per token, and a call costs ~50 ns here.
        waiting = self._waiting
        if waiting is not None:  # inside a tag: nothing to decide before the awaited characters
            waiting += delta  # at most _MAX_WAIT_CHARS: copying is cheaper than a list
            char = self._wait_char
            if char not in delta or (left := self._wait_left - delta.count(char)) > 0:
                if char in delta:
                    self._wait_left = left
                if len(waiting) < _MAX_WAIT_CHARS:
                    self._waiting = waiting
                    return []
            self._waiting = None
            self._buf.append(waiting)
            return self._read_block() if self._state is _BLOCK else self._read()
        state = self._state
        if state is _BLOCK:
            block = self._block
            assert block is not None
            if not delta:
                events = None
            elif self._block_held:
                events = block.quick_held(self._buf, delta)
            else:
                events = block.quick(self._buf, delta)
            if events is None:
                self._buf.append(delta)
                return self._read_block()
            held = block.held
            if held:  # it held back the start of a marker
                block.held = 0
                self._block_held = held == HELD_SHORT
                if held == HELD_DISTINCT:
                    self._wait(">>")
            return events
        if (state is _CONTENT or state is _REASONING) and delta and self._markers.starts.search(delta) is None:
            if self._buf.skip_all(delta):  # plain text, nothing held back
                if state is _CONTENT:
                    self._builder.text(delta)
                    return [TextDelta(delta)]
                self._builder.reasoning(delta)
                return [ReasoningDelta(delta)]
        elif delta and self._held_back(state, delta):
            return []
        self._buf.append(delta)
        return self._read()

    def _read(self) -> list[Event]:
        """Run the machine on what the buffer holds; wait where it stops inside a tag."""
        events = self._builder.add(self._run(final=False))
        state = self._state
        if state is _S.BLOCK:
            assert self._block is not None
            wait_for = self._block.waits_for(self._buf)
            if wait_for:
                self._wait(wait_for)
            else:
                self._block_held = len(self._buf) > 0
        elif state is _S.AFTER_BLOCK:
            self._wait(">")  # only the end of turn may follow
        return events

    def _read_block(self) -> list[Event]:
        """`_read` inside the block: argument events skip the result builder until the block
        ends (closed or failed)."""
        block = self._block
        assert block is not None
        events = block.run(self._buf, final=False)
        if block.failure is None and not block.closed:
            wait_for = block.waits_for(self._buf)
            if wait_for:
                self._wait(wait_for)
            else:  # in a value, name or key, maybe holding back a "<" that is likely text
                self._block_held = len(self._buf) > 0
            return events
        self._state = _S.AFTER_BLOCK if block.failure is None else _S.FAILED
        if block.failure is not None:
            events.append(DiagnosticEvent(block.failure))
        events += self._run(final=False)
        if self._state is _S.AFTER_BLOCK:
            self._wait(">")
        return self._builder.add(events)

    def _wait(self, chars: str) -> None:
        """Hold deltas until `chars` (one character, repeated) have come."""
        self._waiting = ""
        self._wait_char, self._wait_left = chars[0], len(chars)

    def finish(self) -> list[Event]:
        if self._waiting is not None:
            self._buf.append(self._waiting)
            self._waiting = None
        events = self._run(final=True)
        if self._state is _S.REASONING:
            close = self._fmt.reasoning_close
            events += self._fail("missing_think_end", f"expected {close!r}, got the end of output", 0)
        elif self._state is _S.AFTER_BLOCK:
            events += self._hand_out()
        self._state = _S.DONE  # `_step` drops whatever is fed from here on
        return self._builder.add(events)

    def result(self) -> ParseResult:
        return self._builder.result()

    # ---- shortcuts for feed: the same outcome as `_run`, with less work --------------

    def _held_back(self, state: _S, delta: str) -> bool:
        """True when `_run` would only hold `delta` back (the held text and it are the start
        of a marker); then it is held without the machine."""
        if state is not _S.CONTENT and state is not _S.REASONING:
            return False
        text = self._buf.rest() + delta
        if not self._markers.waits(text):
            return False
        self._buf.append(delta)
        return True

    # ---- the machine ----------------------------------------------------------------

    def _run(self, *, final: bool) -> list[Event]:
        events: list[Event] = []
        buf = self._buf
        while True:
            state, pos = self._state, buf.pos
            events += self._step(final)
            # the block reader runs until it needs more text: no second look while in it
            if self._state is state and (state is _S.BLOCK or buf.pos == pos):
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
        self._buf.take(len(self._buf))  # FAILED: the rest is neither content nor calls; DONE: after the end
        return []

    def _text(self, final: bool) -> list[Event]:
        reasoning = self._state is _S.REASONING
        text, marker = scan(self._markers, self._buf, final=final)
        events: list[Event] = []
        if text:
            events.append(ReasoningDelta(text) if reasoning else TextDelta(text))
        if marker is not None:
            events += self._marker(marker, reasoning)
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
