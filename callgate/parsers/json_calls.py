"""One incremental machine for the JSON family: hermes, llama3-json and mistral.

Knows: the layouts described in parsers/json_spec.py (read from each format's spec), the
golden decode rules of golden/{hermes,llama3-json,mistral}/FORMAT.md, and the strictness
policy of DESIGN section 4: a malformed block yields a Diagnostic and never content or a
candidate; calls are never dropped, renamed or repaired; a call to an undeclared tool is a
candidate plus `unknown_tool`; a call inside reasoning is `call_in_reasoning`.
Does not know: templates, constraints, engines or HTTP.

llama3-json: a bare JSON object or array at the start of the output is a call attempt
unless the caller passed `tools=[]` (no tools enabled), in which case it is an answer;
`<|python_tag|>` is a call attempt either way. With `json_answer` (the request asks for a
JSON answer, response_format, while tools may be called: both may start with `{`), a
leading object is a call only when its first two keys are the call's name and arguments
keys; any other JSON value is the answer, held back until the object's keys decide
(the regex baseline's json_answer.py kept such answers out of the grammar's answer alternative).

Streaming: `feed(delta)` looks only at the delta plus a bounded hold-back (a possibly
partial marker, one held separator, a run of held newlines at the end of reasoning); the
JSON of a block is scanned once by parsers/json_scan.py. A call's CallStart is sent as soon
as its name is known and its arguments stream canonically as they arrive
(`{"key": ` then string fragments ...); whatever could not be streamed (the name came after
the arguments, or the mistral list, whose native ids follow the arguments) is sent at the
call's end. A CallStart without a CallEnd means the block turned out malformed: a
DiagnosticEvent follows and there is no candidate.

Most deltas do not run the state machine (measured: 87 of 99 per hermes benchmark output,
with 4-character deltas): with nothing held back, a delta of plain content or reasoning
becomes one event, and a delta of a block's JSON goes straight to the scanner (one step and
one fragment when it lies inside a string); a delta that only extends a held start of a
marker is held on. Each gives the events and offsets the machine gives.

This module drives the machine (`feed`, its shortcuts, `finish`); its states are read by
json_text.py (text outside blocks) and json_block.py (a block's JSON), over the shared
state of json_machine.py.

Diagnostic codes are the golden reason codes: unterminated_block, invalid_json,
duplicate_key, bad_call_object, arguments_not_object, trailing_text, text_between_calls,
unbalanced_tags, missing_think_end, call_in_reasoning, stray_think_tag, empty_call_block,
text_before_call, parallel_calls_unsupported, special_token_in_content, calls_not_array,
empty_call_list, bad_call_id, multiple_call_blocks; plus unknown_tool.
"""

from __future__ import annotations

from callgate.formats import ToolCallFormat
from callgate.parsers.base import CallIdFactory, StreamParser, Tools
from callgate.parsers.json_emit import quote
from callgate.parsers.json_machine import (
    AFTER_CALL,
    AFTER_END,
    BLOCK,
    BLOCK_TAIL,
    CONTENT,
    REASONING,
    SINGLE_TAIL,
    START,
    TRAILING,
    WS,
)
from callgate.parsers.json_scan import PLAIN_STREAMED, RUNNING
from callgate.parsers.json_spec import JsonFamilySpec, json_family_spec
from callgate.parsers.json_text import JsonTextReader
from callgate.types import Event, ParseResult, ReasoningDelta, TextDelta

# What `feed` may try before running the whole machine: pass a delta of plain content or
# reasoning on as one event, or hand a delta of a block's JSON straight to the scanner
# (nothing held back in these cases), or keep holding a text that can only wait for more.
_SLOW, _FAST_TEXT, _IN_BLOCK, _HOLD, _FAST_REASONING = range(5)


class JsonCallParser(JsonTextReader):
    """Per-request parser for one JSON-family format. See the module docstring. The
    states are those of json_machine.py, read by json_text.py and json_block.py."""

    def __init__(
        self, spec: JsonFamilySpec, tools: Tools, *, thinking: bool, call_ids: CallIdFactory, json_answer: bool = False
    ) -> None:
        super().__init__(spec, tools, call_ids=call_ids, json_answer=json_answer)
        self._text_stop = spec.text_stop.search
        self._thought_stop = spec.thought_stop.search
        self._finished = False
        self._fast = _SLOW
        self._waiting: frozenset[str] = frozenset()  # what _HOLD may keep holding
        # indexed by state
        self._handlers = (
            self._start,
            self._reasoning,
            self._content,
            self._block,
            self._block_failed,
            self._block_tail,
            self._bad_block,
            self._after_call,
            self._single_tail,
            self._trailing,
            self._after_end,
        )
        self._go(REASONING if thinking and spec.reasoning_open else START)

    # ---- StreamParser --------------------------------------------------------------------

    def feed(self, delta: str) -> list[Event]:
        # The shortcuts leave _buf fully consumed (_i == len(_buf)); moving _base past the
        # delta keeps every later offset right. Measured: most deltas take one of them.
        fast = self._fast
        if fast == _IN_BLOCK and delta:
            j = self._scan.feed_delta(delta)
            if j >= 0:  # the JSON ended in this delta (or failed): the machine takes over
                return self._block_stopped(delta, j)
            # the whole delta is JSON: at most a CallStart and a fragment, which cannot
            # change the result, so they skip the result builder
            self._base += len(delta)
            self._raw.append(delta)
            if j == PLAIN_STREAMED:
                return [self._calls.fragment(delta)]
            return self._streamed() if j == RUNNING else []
        if fast == _FAST_TEXT and delta and self._text_stop(delta) is None:
            self._base += len(delta)
            self._builder.text(delta)
            return [TextDelta(delta)]
        if fast == _FAST_REASONING and delta and self._thought_stop(delta) is None:
            self._base += len(delta)
            text = "\n" * self._r_newlines + delta if self._r_newlines else delta
            self._r_newlines = 0
            self._builder.reasoning(text)
            return [ReasoningDelta(text)]
        if fast == _HOLD and delta:
            rest = self._buf[self._i :] + delta
            if rest in self._waiting:  # still only the start of a marker: the machine would wait
                self._base += self._i
                self._buf, self._i = rest, 0
                return []
        if self._finished or not delta:
            return []
        self._buf = self._buf[self._i :] + delta
        self._base += self._i
        self._i = 0
        events = self._run()
        self._fast = self._fast_mode()
        return events

    def _fast_mode(self) -> int:
        if self._i != len(self._buf):
            self._waiting = _waiting(self._spec)[self._state]
            return _HOLD if self._waiting else _SLOW
        if self._state == CONTENT:
            return _SLOW if self._lstrip else _FAST_TEXT
        if self._state == REASONING:  # once started, leading newlines are no longer dropped
            return _FAST_REASONING if self._r_started else _SLOW
        return _IN_BLOCK if self._state == BLOCK and not self._undecided else _SLOW

    def _block_stopped(self, delta: str, j: int) -> list[Event]:
        """The JSON of a block, fed `delta` with nothing held back, stopped at `j`."""
        self._base += self._i
        self._buf, self._i = delta, 0
        self._scanned(j)
        events = self._run()
        self._fast = self._fast_mode()
        return events

    def _streamed(self) -> list[Event]:
        """What the scanner has to stream after a delta: the call's start, a fragment."""
        calls, out = self._calls, self._scan.out
        if calls.open:
            if not out:
                return []
            text = out[0] if len(out) == 1 else "".join(out)
            out.clear()
            return [calls.fragment(text)]
        self._stream_call()
        if not self._events:  # always so in the list layout, which streams nothing
            return []
        events = self._events[:]
        self._events.clear()
        return events

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        self._final = True
        self._fast = _SLOW
        released = self._run()  # text held back as a possible marker start is text after all
        self._finish_state()
        self._finished = True
        return released + self._flush()

    def result(self) -> ParseResult:
        return self._builder.result()

    # ---- end of text ---------------------------------------------------------------------

    def _finish_state(self) -> None:
        state, spec = self._state, self._spec
        end = self._abs(len(self._buf))
        if state == REASONING:
            self._diag("missing_think_end", quote(spec.reasoning_close), "end of text", (self._r_start, end))
        elif state == BLOCK:
            self._scan.finish()
            if self._scan.done and spec.layout != "object":
                self._close_block(len(self._buf))
                return
            self._diag("unterminated_block", "the rest of the call", "end of text", (self._block_start, end))
        elif state == BLOCK_TAIL:
            self._diag("unterminated_block", quote(spec.block_close), "end of text", (self._block_start, end))
        elif state in (TRAILING, SINGLE_TAIL):
            self._diag(
                "trailing_text",
                "the end of the turn",
                f"{end - self._trail_start} characters",
                (self._trail_start, end),
            )
        elif state == AFTER_END and self._end_trail_start >= 0:
            span = (self._end_trail_start, end)
            self._diag("trailing_text", "nothing after the end of the turn", f"{end - span[0]} characters", span)


_WAITING: dict[str, tuple[frozenset[str], ...]] = {}


def _waiting(spec: JsonFamilySpec) -> tuple[frozenset[str], ...]:
    """Per state: the held texts on which that state's handler can only wait for more
    input (consumes nothing, emits nothing, stays). Computed once per format."""
    table = _WAITING.get(spec.format)
    if table is None:
        by_state = {
            START: spec.start_waiting,
            REASONING: spec.reasoning_markers.waiting,
            CONTENT: spec.content_markers.waiting,
            BLOCK_TAIL: frozenset(p for p in spec.block_markers.waiting if p[0] not in WS),
            AFTER_CALL: spec.after_call_waiting,
        }
        table = _WAITING[spec.format] = tuple(by_state.get(s, frozenset()) for s in range(AFTER_END + 1))
    return table


def make_parser(
    fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory, json_answer: bool = False
) -> StreamParser:
    """A fresh parser for one response in a JSON-family format. `json_answer`: the request
    asks for a JSON answer while tools may be called (see the module docstring)."""
    spec = json_family_spec(fmt.name)
    return JsonCallParser(spec, tools, thinking=thinking, call_ids=call_ids, json_answer=json_answer)
