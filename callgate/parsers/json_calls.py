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

Diagnostic codes are the golden reason codes: unterminated_block, invalid_json,
duplicate_key, bad_call_object, arguments_not_object, trailing_text, text_between_calls,
unbalanced_tags, missing_think_end, call_in_reasoning, stray_think_tag, empty_call_block,
text_before_call, parallel_calls_unsupported, special_token_in_content, calls_not_array,
empty_call_list, bad_call_id, multiple_call_blocks; plus unknown_tool.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from callgate.formats import ToolCallFormat
from callgate.parsers.base import CallIdFactory, ResultBuilder, StreamParser, Tools, tool_names
from callgate.parsers.json_emit import CallEmitter, diagnostic, quote
from callgate.parsers.json_scan import PLAIN_STREAMED, RUNNING, JsonScanner
from callgate.parsers.json_shape import ShapeError, check_call_list, check_call_object
from callgate.parsers.json_spec import JsonFamilySpec, json_family_spec
from callgate.types import Event, ParseResult, ReasoningDelta, TextDelta

_WS = " \t\r\n"
_LLAMA_TAIL_SKIP = " \t\r\n;"
# What `feed` may try before running the whole machine: pass a delta of plain content or
# reasoning on as one event, or hand a delta of a block's JSON straight to the scanner
# (nothing held back in these cases), or keep holding a text that can only wait for more.
_SLOW, _FAST_TEXT, _IN_BLOCK, _HOLD, _FAST_REASONING = range(5)


# States, plain ints: an Enum member read from its class costs ~90 ns and an Enum key's
# hash a Python call, measured, on every delta.
(
    _START,
    _REASONING,
    _CONTENT,
    _BLOCK,  # scanning the JSON of a block
    _BLOCK_FAILED,  # the scanner failed; classify the offending text
    _BLOCK_TAIL,  # object layout: the JSON is complete, the close tag is due
    _BAD_BLOCK,  # skipping a malformed block up to its close (or the end of turn)
    _AFTER_CALL,
    _SINGLE_TAIL,  # single layout: text after the call object
    _TRAILING,  # text where only calls or the end of turn may be
    _AFTER_END,  # after the end-of-turn token
) = range(11)


class JsonCallParser:
    """Per-request parser for one JSON-family format. See the module docstring."""

    def __init__(
        self, spec: JsonFamilySpec, tools: Tools, *, thinking: bool, call_ids: CallIdFactory, json_answer: bool = False
    ) -> None:
        self._spec = spec
        # single layout: bare JSON at the start is a call only when tools may be called
        # (golden/llama3-json/FORMAT.md 6: "only ... when tools are enabled"); tools=[] says
        # none are, tools=None that the caller did not say.
        self._bare_calls = tools is None or len(tools) > 0
        # ... and, when a JSON answer may stand there too, only when call-shaped
        self._json_answer = json_answer and spec.layout == "single" and self._bare_calls
        self._undecided = False  # a leading object whose keys do not yet tell call from answer
        self._builder = ResultBuilder()
        self._text_stop = spec.text_stop.search
        self._thought_stop = spec.thought_stop.search
        self._events: list[Event] = []
        self._calls = CallEmitter(spec.format, tool_names(tools), call_ids, self._events)
        self._buf = ""
        self._base = 0  # absolute offset of _buf[0]
        self._i = 0  # position in _buf of the first unconsumed character
        self._final = False
        self._finished = False
        self._fast = _SLOW
        self._waiting: frozenset[str] = frozenset()  # what _HOLD may keep holding
        # indexed by state
        self._handlers: tuple[Callable[[], bool], ...] = (
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
        self._state = _START
        self._step = self._start
        self._go(_REASONING if thinking and spec.reasoning_open else _START)
        # reasoning
        self._r_start = 0
        self._r_started = False
        self._r_newlines = 0
        self._r_call_open = False
        self._lstrip = False  # content after reasoning loses its leading newlines
        # the current block
        self._block_start = 0
        self._scan_base = 0
        self._scan = JsonScanner()
        self._raw: list[str] = []  # the block's text so far; its JSON starts at _scan_base
        # trailing text
        self._trail_start = -1
        self._end_trail_start = -1

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
        if self._state == _CONTENT:
            return _SLOW if self._lstrip else _FAST_TEXT
        if self._state == _REASONING:  # once started, leading newlines are no longer dropped
            return _FAST_REASONING if self._r_started else _SLOW
        return _IN_BLOCK if self._state == _BLOCK and not self._undecided else _SLOW

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

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> list[Event]:
        while self._step():
            pass
        return self._flush()

    def _go(self, state: int) -> None:
        self._state = state
        self._step = self._handlers[state]

    def _flush(self) -> list[Event]:
        if not self._events:
            return []
        events = self._events[:]
        self._events.clear()
        return self._builder.add(events)

    def _abs(self, i: int) -> int:
        return self._base + i

    # ---- free text -----------------------------------------------------------------------

    def _start(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        rest = buf[i:]
        if spec.layout == "single":
            if rest[:1] == "{" and self._json_answer:
                self._undecided = True
                return self._open_block(i, i)
            if rest[:1] in ("{", "[") and self._bare_calls and not self._json_answer:
                return self._open_block(i, i)
            if rest.startswith(spec.block_open):
                return self._open_block(i, i + len(spec.block_open))
            if not self._final and spec.block_open.startswith(rest):
                return False
            if self._json_answer and rest:
                self._bare_calls = False  # the answer: JSON in it is text, as without tools
        elif spec.reasoning_open:
            if rest.startswith(spec.reasoning_open):
                self._i = i + len(spec.reasoning_open)
                self._r_start = self._abs(i)
                self._go(_REASONING)
                return True
            if not self._final and spec.reasoning_open.startswith(rest):
                return False
        self._go(_CONTENT)
        return True

    def _content(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        markers = spec.content_markers
        m = markers.find(buf, i)
        if m is None:
            stop = len(buf) if self._final else markers.hold_from(buf, i)
            if not self._final and spec.separator and buf.endswith(spec.separator, i, stop):
                stop -= len(spec.separator)  # dropped if a call follows
            self._text(buf[i:stop])
            self._i = stop
            return False
        k, tok = m.start(), m.group()
        action = spec.content_actions[tok]
        text = buf[i:k]
        if action == "block" and spec.separator and text.endswith(spec.separator):
            text = text[: -len(spec.separator)]
        self._text(text)
        self._i = k + len(tok)
        span = (self._abs(k), self._abs(k + len(tok)))
        if action == "block":
            return self._open_block(k, k + len(tok))
        if action == "end":
            self._go(_AFTER_END)
        elif action == "text_before_call" and tok != spec.block_open and not self._bare_calls:
            self._text(tok)  # no tools declared: JSON in an answer is just text
        elif action == "text_before_call":
            self._diag("text_before_call", "a call only at the start of the output", quote(tok), span)
            self._i = k
            self._go(_BAD_BLOCK)
        else:
            code = {"unbalanced": "unbalanced_tags", "stray_think": "stray_think_tag"}.get(
                action, "special_token_in_content"
            )
            self._diag(code, "plain text", quote(tok), span)
        return True

    def _text(self, text: str) -> None:
        if self._lstrip:
            text = text.lstrip("\n")
            if not text:
                return
            self._lstrip = False
        if text:
            self._events.append(TextDelta(text))

    def _reasoning(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        markers = spec.reasoning_markers
        m = markers.find(buf, i)
        stop = m.start() if m else (len(buf) if self._final else markers.hold_from(buf, i))
        self._think(buf[i:stop])
        self._i = stop
        if m is None:
            return False
        tok = m.group()
        self._i = stop + len(tok)
        if tok == spec.reasoning_close:
            self._r_newlines = 0
            self._lstrip = True
            self._go(_CONTENT)
        elif tok in spec.ends:
            self._diag("missing_think_end", quote(spec.reasoning_close), quote(tok), (self._r_start, self._abs(stop)))
            self._go(_AFTER_END)
        else:
            opens = tok == spec.block_open
            if opens or not self._r_call_open:
                span = (self._abs(stop), self._abs(self._i))
                self._diag("call_in_reasoning", "no call inside reasoning", quote(tok), span)
            self._r_call_open = opens
            self._think(tok)
        return True

    def _think(self, text: str) -> None:
        if not self._r_started:
            text = text.lstrip("\n")
            if not text:
                return
            self._r_started = True
        body = text.rstrip("\n")
        if body:
            self._events.append(ReasoningDelta("\n" * self._r_newlines + body))
            self._r_newlines = 0
        self._r_newlines += len(text) - len(body)

    # ---- call blocks ---------------------------------------------------------------------

    def _open_block(self, start: int, json_start: int) -> bool:
        spec = self._spec
        streaming = spec.layout != "list"
        self._scan = JsonScanner(spec.name_key if streaming else None, spec.arguments_key if streaming else None)
        self._block_start = self._abs(start)
        self._scan_base = self._abs(json_start)
        self._raw = [self._buf[start:json_start]]
        self._calls.drop()
        self._i = json_start
        self._go(_BLOCK)
        return True

    def _block(self) -> bool:
        return self._scanned(self._scan.feed(self._buf, self._i))

    def _scanned(self, j: int) -> bool:
        """The scanner has consumed the buffer up to `j`."""
        scan = self._scan
        self._raw.append(self._buf[self._i : j])
        self._i = j
        if self._undecided:
            verdict = self._verdict()
            if verdict is None:
                return False
            if verdict == "answer":
                return self._answer_so_far()
            self._undecided = False
        self._stream_call()
        if scan.done:
            if self._spec.layout == "object":
                self._go(_BLOCK_TAIL)
            else:
                self._close_block(j)
            return True
        if scan.failed:
            self._go(_BLOCK_FAILED)
            return True
        return False

    def _verdict(self) -> str | None:
        """json_answer: whether the leading object read so far is a call ("call": its first
        two keys are the name and arguments keys, or it is not JSON) or the answer; None
        while its keys do not tell."""
        scan, spec = self._scan, self._spec
        keys = scan.top_keys
        if keys[:1] not in ([], [spec.name_key]) or keys[1:2] not in ([], [spec.arguments_key]):
            return "answer"
        if len(keys) >= 2 or scan.failed:
            return "call"
        return "answer" if scan.done else None

    def _answer_so_far(self) -> bool:
        """The held object is the answer: its text is content, and so is what follows."""
        self._undecided = False
        self._bare_calls = False
        self._text("".join(self._raw))
        self._go(_CONTENT)
        return True

    def _stream_call(self) -> None:
        scan = self._scan
        if not self._calls.open and scan.name:
            self._calls.start(scan.name, None)
        if scan.out:
            self._calls.arguments(scan.take_output())

    def _block_failed(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        err = self._scan.error
        assert err is not None
        json_error, markers = err.code == "invalid_json", spec.block_markers
        tok = markers.at(buf, i) if json_error else None
        if tok is None and json_error and not self._final and markers.could_start(buf, i):
            return False
        offset = self._scan_base + err.offset
        if tok in spec.ends:
            assert tok is not None
            self._diag("unterminated_block", "the rest of the call", quote(tok), (self._block_start, self._abs(i)))
            self._i = i + len(tok)
            self._go(_AFTER_END)
            return True
        if tok is not None and tok == spec.block_close and not self._scan.started:
            self._diag("empty_call_block", "a JSON call", quote(tok), (self._block_start, self._abs(i + len(tok))))
            self._i = i + len(tok)
            self._go(_AFTER_CALL)
            return True
        if tok is not None and tok == spec.block_open and spec.layout == "object":
            self._diag("unbalanced_tags", "a JSON call object", quote(tok), (self._abs(i), self._abs(i + len(tok))))
            self._i = i + len(tok)
            self._go(_BAD_BLOCK)
            return True
        self._diag(err.code, err.expected, quote(err.got), (offset, offset + max(1, len(err.got))))
        if tok is not None and tok == spec.block_close:
            self._i = i + len(tok)
            self._go(_AFTER_CALL)
        else:
            self._go(_BAD_BLOCK)
        return True

    def _block_tail(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        k = i
        while k < len(buf) and buf[k] in _WS:
            k += 1
        self._raw.append(buf[i:k])
        self._i = k
        if k == len(buf):
            return False
        if buf.startswith(spec.block_close, k):
            self._raw.append(spec.block_close)
            self._close_block(k + len(spec.block_close))
            return True
        tok = spec.block_markers.at(buf, k)
        if tok is None and not self._final and spec.block_markers.could_start(buf, k):
            return False
        span = (self._abs(k), self._abs(k + len(tok or buf[k])))
        if tok is None and spec.block_close.startswith(buf[k:]):  # the text ends inside the close tag
            self._i = len(buf)
            self._go(_BLOCK_TAIL)
            return False
        if tok in spec.ends:
            self._diag("unterminated_block", quote(spec.block_close), quote(tok), (self._block_start, span[0]))
            self._i = span[1] - self._base
            self._go(_AFTER_END)
            return True
        code = "unbalanced_tags" if tok == spec.block_open else "invalid_json"
        self._diag(code, quote(spec.block_close), quote(tok or buf[k]), span)
        self._i = span[1] - self._base
        self._go(_BAD_BLOCK)
        return True

    def _close_block(self, end: int) -> None:
        """The block's JSON (and close tag) is complete at buffer position `end`."""
        spec = self._spec
        self._i = end
        self._go(_AFTER_CALL)
        span = (self._block_start, self._abs(end))
        raw = "".join(self._raw)
        lo = self._scan_base - self._block_start
        body = raw[lo : lo + self._scan.offset]
        if not body.strip():
            self._diag("empty_call_block", "a JSON call", quote(raw), span)
            return
        value = json.loads(body)  # the scanner read it by strict_json's rule, depth included
        if spec.layout == "single" and isinstance(value, list):
            self._diag("parallel_calls_unsupported", "one call object", "a JSON array", span)
            return
        if spec.layout != "list":
            shape = check_call_object(spec, value)
            if isinstance(shape, ShapeError):
                self._shape_error(shape, span)
            else:
                self._calls.end(shape, raw, span)
            return
        shapes = check_call_list(spec, value)
        if isinstance(shapes, ShapeError):
            self._shape_error(shapes, span)
            return
        for shape, (s, e) in zip(shapes, self._scan.element_spans, strict=True):
            lo = self._scan_base - self._block_start
            self._calls.end(shape, raw[lo + s : lo + e], (self._scan_base + s, self._scan_base + e))

    def _shape_error(self, err: ShapeError, span: tuple[int, int]) -> None:
        if self._spec.layout == "list" and err.element < len(self._scan.element_spans):
            s, e = self._scan.element_spans[err.element]
            span = (self._scan_base + s, self._scan_base + e)
        self._diag(err.code, err.expected, err.got, span)

    # ---- after a block -------------------------------------------------------------------

    def _after_call(self) -> bool:
        spec, buf, i = self._spec, self._buf, self._i
        rest = buf[i:]
        if spec.layout == "object":
            nxt = spec.separator + spec.block_open
            if rest.startswith(nxt):
                return self._open_block(i + len(spec.separator), i + len(nxt))
            if rest.startswith(spec.block_open):
                return self._open_block(i, i + len(spec.block_open))
        end = spec.ends_set.at(buf, i)
        if end is not None:
            self._i = i + len(end)
            self._go(_AFTER_END)
            return True
        if spec.layout == "list" and rest.startswith(spec.block_open):
            span = (self._abs(i), self._abs(i + len(spec.block_open)))
            self._diag("multiple_call_blocks", "one call block", quote(spec.block_open), span)
            self._go(_BAD_BLOCK)
            self._i = i + len(spec.block_open)
            return True
        if not rest or (not self._final and rest in spec.after_call_prefixes):
            return False
        self._trail_start = self._abs(i)
        self._go(_SINGLE_TAIL if spec.layout == "single" else _TRAILING)
        return True

    def _single_tail(self) -> bool:
        buf, k = self._buf, self._i
        while k < len(buf) and buf[k] in _LLAMA_TAIL_SKIP:
            k += 1
        self._i = k
        if k == len(buf):
            return False
        if buf[k] in "{[":
            span = (self._abs(k), self._abs(k + 1))
            self._diag("parallel_calls_unsupported", "one call", quote(buf[k]), span)
            self._go(_BAD_BLOCK)
            return True
        self._go(_TRAILING)
        return True

    def _trailing(self) -> bool:
        buf, i = self._buf, self._i
        markers = self._spec.trailing_markers
        m = markers.find(buf, i)
        if m is None:
            self._i = len(buf) if self._final else markers.hold_from(buf, i)
            return False
        k, tok = m.start(), m.group()
        span = (self._trail_start, self._abs(k))
        if tok == self._spec.block_open:
            self._diag("text_between_calls", "only a separator between calls", f"{span[1] - span[0]} characters", span)
            return self._open_block(k, k + len(tok))
        self._diag("trailing_text", "the end of the turn", f"{span[1] - span[0]} characters", span)
        self._i = k + len(tok)
        self._go(_AFTER_END)
        return True

    def _bad_block(self) -> bool:
        buf, i = self._buf, self._i
        markers = self._spec.skip_markers
        m = markers.find(buf, i)
        if m is None:
            self._i = len(buf) if self._final else markers.hold_from(buf, i)
            return False
        self._i = m.end()
        self._go(_AFTER_END if m.group() in self._spec.ends else _AFTER_CALL)
        return True

    def _after_end(self) -> bool:
        if self._i < len(self._buf) and self._end_trail_start < 0:
            self._end_trail_start = self._abs(self._i)
        self._i = len(self._buf)
        return False

    # ---- end of text ---------------------------------------------------------------------

    def _finish_state(self) -> None:
        state, spec = self._state, self._spec
        end = self._abs(len(self._buf))
        if state == _REASONING:
            self._diag("missing_think_end", quote(spec.reasoning_close), "end of text", (self._r_start, end))
        elif state == _BLOCK:
            self._scan.finish()
            if self._scan.done and spec.layout != "object":
                self._close_block(len(self._buf))
                return
            self._diag("unterminated_block", "the rest of the call", "end of text", (self._block_start, end))
        elif state == _BLOCK_TAIL:
            self._diag("unterminated_block", quote(spec.block_close), "end of text", (self._block_start, end))
        elif state in (_TRAILING, _SINGLE_TAIL):
            self._diag(
                "trailing_text",
                "the end of the turn",
                f"{end - self._trail_start} characters",
                (self._trail_start, end),
            )
        elif state == _AFTER_END and self._end_trail_start >= 0:
            span = (self._end_trail_start, end)
            self._diag("trailing_text", "nothing after the end of the turn", f"{end - span[0]} characters", span)

    def _diag(self, code: str, expected: str, got: str, span: tuple[int, int]) -> None:
        self._events.append(diagnostic(code, expected, got, span))


_WAITING: dict[str, tuple[frozenset[str], ...]] = {}


def _waiting(spec: JsonFamilySpec) -> tuple[frozenset[str], ...]:
    """Per state: the held texts on which that state's handler can only wait for more
    input (consumes nothing, emits nothing, stays). Computed once per format."""
    table = _WAITING.get(spec.format)
    if table is None:
        by_state = {
            _START: spec.start_waiting,
            _REASONING: spec.reasoning_markers.waiting,
            _CONTENT: spec.content_markers.waiting,
            _BLOCK_TAIL: frozenset(p for p in spec.block_markers.waiting if p[0] not in _WS),
            _AFTER_CALL: spec.after_call_waiting,
        }
        table = _WAITING[spec.format] = tuple(by_state.get(s, frozenset()) for s in range(_AFTER_END + 1))
    return table


def make_parser(
    fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory, json_answer: bool = False
) -> StreamParser:
    """A fresh parser for one response in a JSON-family format. `json_answer`: the request
    asks for a JSON answer while tools may be called (see the module docstring)."""
    spec = json_family_spec(fmt.name)
    return JsonCallParser(spec, tools, thinking=thinking, call_ids=call_ids, json_answer=json_answer)
