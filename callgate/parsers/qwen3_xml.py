"""The strict incremental parser of the qwen3-xml family (Qwen3-Coder XML tool calls).

Knows: the completion grammar of golden/qwen3-xml/FORMAT.md section 6, spelled with the
markers of the format spec. Does not know: templates, engines, HTTP.

    [<think> reasoning </think>] content (<tool_call>\\n<function=NAME>\\n
        (<parameter=P>\\nVALUE\\n</parameter>\\n)* </function>\\n</tool_call>)  joined by \\n
    [<|im_end|>]

One state machine serves both paths: `feed` hands each state the unconsumed text from
its position; a state consumes what it can decide and, when the rest may be the start
of a marker, keeps it (at most the longest marker) for the next delta, so `feed` costs
O(len(delta)) amortised and never re-scans. parse(text) == feed(text) + finish().
A delta that arrives with nothing held and holds no character that can start one of
the current state's markers skips the machine (text, reasoning and value fragments; value
text followed by the start of its end marker too). Inside tag text the machine can only
hold text back until the tag ends, so deltas are collected unread until the newline that
follows the tag arrives (at most _MAX_WAIT_CHARS), then read at once (`_wait_in_tag`).
Markers and their MarkerSets come from qwen3_xml_syntax; typed values from qwen3_xml_values.

Decisions where the golden rules leave room, all documented here:
* Content before the first call is trimmed (the template trims it); content without a
  call is kept as written. Streaming cannot take back text, so only whitespace that is
  still held back is dropped: trailing whitespace before a call always, leading
  whitespace only when nothing but whitespace precedes the first call.
* `<think>` opens reasoning only at the very start (or `thinking=True`); each
  `<tool_call>` inside reasoning is `call_in_reasoning` and stays reasoning text.
* A malformed block yields one diagnostic and no candidate; the parser then skips to
  that block's `</tool_call>` (or to the next `<tool_call>`, which starts a new call, or
  to `<|im_end|>`), so later calls are still read and nothing becomes content.
* Text after the calls or after `<|im_end|>` is neither content nor dropped silently:
  `trailing_text`, or `text_between_calls` when another call follows it.
* `CallStart` is emitted once the function name is read; a string-typed value streams
  as escaped JSON fragments while it arrives, other values when they are complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from callgate.formats import ToolCallFormat
from callgate.parsers.base import CallIdFactory, ResultBuilder, Tools, tool_names, tool_schemas
from callgate.parsers.qwen3_xml_syntax import NEEDS_ESCAPE, Call, Syntax, choose, syntax_of
from callgate.parsers.qwen3_xml_values import declared_types, decode, streams_as_text
from callgate.types import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    Diagnostic,
    DiagnosticEvent,
    Event,
    ParseResult,
    ReasoningDelta,
    TextDelta,
    ToolCallCandidate,
)

_NAME = re.compile(r"[^\s<>=\"'/]*")
_MAX_NAME_CHARS = 256  # keeps the hold-back of a tag name bounded
_MAX_SHOWN_CHARS = 20
_MAX_WAIT_CHARS = 128  # at most this much text is held unread inside a tag
# Held text that starts a marker from its fourth character on ("\n</p", "</fu", "<too"):
# shorter starts ("<", "</", "\n<") are common in text and values, which must not stall
# waiting for a ">", so they are read again with the next delta instead.
_DISTINCT_CHARS = 4
# json.dumps(..., ensure_ascii=False) builds an encoder per call (~1.5 us here); value text
# is escaped once per delta while it streams
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def make_parser(fmt: ToolCallFormat, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> Qwen3XmlParser:
    """A fresh parser for one output. `thinking`: the output starts inside reasoning."""
    return Qwen3XmlParser(syntax_of(fmt), tools, thinking=thinking, call_ids=call_ids)


# A state reads buf from pos and returns where it stopped; ~index (negative) when it needs
# more text and keeps buf[index:] for the next delta.
State = Callable[[str, int], int]


class Qwen3XmlParser:
    """Per-request incremental parser; see the module docstring for the grammar."""

    def __init__(self, syntax: Syntax, tools: Tools, *, thinking: bool, call_ids: CallIdFactory) -> None:
        self._sx = syntax
        self._tools = tools
        self._tool_info: tuple[frozenset[str] | None, dict[str, Mapping[str, Any]]] | None = None
        self._call_ids = call_ids
        self._builder = ResultBuilder()
        self._out: list[Event] = []
        self._held = ""  # unconsumed tail: at most a partial marker
        self._base = 0  # offset of the current buffer's first character in the output
        self._done = False
        self._state: State = self._reasoning if thinking else self._start
        self._ws = ""  # whitespace held back at the end of the content so far
        self._skip_newlines = False  # after </think>: the content loses its leading newlines
        self._nl = ""  # newlines held back at the end of the reasoning so far
        self._reasoning_start = True
        self._index = 0
        self._stray_start = 0
        self._call = Call(0)
        # state -> what it does with a delta when nothing is held, without the machine;
        # None: the machine must read it
        self._fast: dict[State, Callable[[str], list[Event]]] = {
            self._start: self._quick_start,
            self._content: self._quick_content,
            self._reasoning: self._quick_reasoning,
            self._value: self._quick_value,
        }
        # tag states -> what they wait for before reading on (see `_wait_in_tag`)
        sep, end = syntax.sep[-1], syntax.tag_end
        self._tag_waits: dict[State, tuple[str, int]] = {
            self._name: (sep, 1),
            self._body: (sep, 1),
            self._recover: (end, 1),
            self._stray: (end, 1),
        }
        self._waiting = ""  # deltas held unread until the awaited characters (feed is _feed_wait)
        self._wait_char = "\n"  # the character awaited ...
        self._wait_left = 1  # ... and how many more times
        # `feed` is an attribute, not a method: the current state's fast path, the wait, or
        # the machine, so that a delta costs one call. It is set where the state, the held
        # text or the wait change (`_read`, `_wait_in_tag`, the fast paths, `finish`).
        self.feed: Callable[[str], list[Event]] = self._fast.get(self._state) or self._feed_read
        self._plain_value = syntax.plain_value.search  # the per-delta searches, bound once
        self._content_start = syntax.content.starts.search
        # `in` is ~4x cheaper than the search: content deltas seldom hold a marker's first
        # character; "" (always in) when the markers start with different characters
        self._content_first = syntax.content.firsts if len(syntax.content.firsts) == 1 else ""

    # ---- driving -------------------------------------------------------------------------

    def _feed_read(self, delta: str) -> list[Event]:
        return self._read(delta) if delta else []

    def _feed_wait(self, delta: str) -> list[Event]:
        """Inside a tag: nothing to decide before the awaited characters (`_wait_in_tag`)."""
        waiting = self._waiting + delta  # at most _MAX_WAIT_CHARS: copying is cheaper than a list
        char = self._wait_char
        if char in delta:
            left = self._wait_left = self._wait_left - delta.count(char)
            if left <= 0:
                self._waiting = ""
                return self._read(waiting)
        if len(waiting) >= _MAX_WAIT_CHARS:
            self._waiting = ""
            return self._read(waiting)
        self._waiting = waiting
        return []

    @staticmethod
    def _feed_done(delta: str) -> list[Event]:
        del delta
        return []

    def _read(self, delta: str) -> list[Event]:
        """Run the machine on the held text and `delta`; wait where it stops inside a tag."""
        out: list[Event] = []
        self._out = out
        buf = self._held + delta if self._held else delta
        pos, n = 0, len(buf)
        while pos < n:
            pos = self._state(buf, pos)
            if pos < 0:  # the state needs more text: it keeps buf[~pos:]
                pos = ~pos
                break
        held = self._held = buf[pos:]
        self._base += pos
        quick = None if held else self._fast.get(self._state)
        if quick is None:
            self._wait_in_tag()
        else:  # a fast path needs no wait
            self.feed = quick
        return out

    def _wait_in_tag(self) -> None:
        """Where the machine stopped inside tag text, hold the next deltas unread until
        reading on can yield something. Every tag of a block is followed by a newline, so the
        wait counts newlines: the one after the tag being read (before a value or the next
        tag); after a value's closing tag, the one after the next tag too (it yields nothing
        before it); after a call opener, the ones after the function tag and the first
        parameter tag (`CallStart` comes with the first parameter's key: one machine run
        instead of two). Text outside blocks waits for the ">" of its tag. Reading later
        changes nothing but when the tags' events come out: the machine gives the same
        events for any split. Sets `feed`."""
        state = self._state
        wait = self._tag_waits.get(state)
        if wait is None:
            held, sx = self._held, self._sx
            if state == self._value:
                if len(held) < _DISTINCT_CHARS:
                    self.feed = self._quick_held_value if held else self._quick_value
                    return
                wait = (sx.sep[-1], 2)
            elif state == self._literal:
                call = self._call
                to_value = call.literal == sx.sep and call.literal_then == self._open_value
                wait = (sx.sep[-1], call.literal.count(sx.sep[-1]) + (not to_value))
            elif state == self._between:  # "\n<tool_call>" yields nothing: as after a call opener
                wait = (sx.sep[-1], 4 - held.count(sx.sep[-1]))
            elif (state == self._content or state == self._reasoning) and len(held) >= _DISTINCT_CHARS:
                opener = state == self._content and sx.call_open.startswith(held)
                wait = (sx.sep[-1], 3) if opener else (sx.tag_end, 1)
            else:
                self.feed = self._feed_read
                return
        self._waiting = ""
        self._wait_char, self._wait_left = wait
        self.feed = self._feed_wait

    def finish(self) -> list[Event]:
        if self._done:
            return []
        events: list[Event] = []
        if self.feed == self._feed_wait:
            events = self._read(self._waiting)
            self._waiting = ""
        self._done = True
        self.feed = self._feed_done
        self._out = []
        end = self._base + len(self._held)
        self._finish_state(self._held, end)
        self._held = ""
        return events + self._out

    def result(self) -> ParseResult:
        return self._builder.result()

    def _finish_state(self, held: str, end: int) -> None:
        state = self._state
        if state in (self._start, self._content):
            self._emit_content(held)
            self._emit_text(self._ws)
        elif state == self._reasoning:
            self._emit_reasoning(held)
            self._diagnose("missing_think_end", self._sx.think_close, "end of text", self._base, end, self._base)
        elif state == self._between:
            if held:
                self._diagnose("trailing_text", "end of text", held, self._base, end, self._base)
        elif state == self._stray:
            self._diagnose("trailing_text", "end of text", "text", self._stray_start, end, self._stray_start)
        elif state not in (self._recover, self._ended):
            self._diagnose("unterminated_block", "the rest of the call", "end of text", self._call.start, end, end)

    # ---- emitting ------------------------------------------------------------------------

    def _abs(self, pos: int) -> int:
        return self._base + pos

    def _diagnose(self, code: str, expected: str, got: str, start: int, end: int, at: int) -> None:
        shown = got if len(got) <= _MAX_SHOWN_CHARS else got[:_MAX_SHOWN_CHARS] + "..."
        message = f"expected {expected!r}, got {shown!r} at offset {at}"
        diagnostic = Diagnostic(code, message, (start, end))
        self._builder.diagnostic(diagnostic)
        self._out.append(DiagnosticEvent(diagnostic))

    def _emit_text(self, text: str) -> None:
        if text:
            self._builder.text(text)
            self._out.append(TextDelta(text))

    def _emit_content(self, text: str) -> None:
        if self._skip_newlines:
            text = text.lstrip("\n")
            if not text:
                return
            self._skip_newlines = False
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        self._emit_text(self._ws + body)
        self._ws = text[len(body) :]

    def _emit_reasoning(self, text: str) -> None:
        if self._reasoning_start:
            text = text.lstrip("\n")
            if not text:
                return
            self._reasoning_start = False
        body = text.rstrip("\n")
        if not body:
            self._nl += text
            return
        reasoning = self._nl + body
        self._builder.reasoning(reasoning)
        self._out.append(ReasoningDelta(reasoning))
        self._nl = text[len(body) :]

    # ---- outside calls -------------------------------------------------------------------

    def _start(self, buf: str, pos: int) -> int:
        opener = self._sx.think_open
        if buf.startswith(opener, pos):
            self._state = self._reasoning
            return pos + len(opener)
        if opener.startswith(buf[pos:]):
            return ~pos
        self._state = self._content
        return pos

    def _content(self, buf: str, pos: int) -> int:
        sx = self._sx
        m = sx.content.pattern.search(buf, pos)
        if m is None:
            end = sx.content.hold_from(buf, pos)
            self._emit_content(buf[pos:end])
            return ~end
        i, tag = m.start(), m.group()
        self._emit_content(buf[pos:i])
        if tag == sx.call_open:
            self._ws = ""
            return self._open_call(i)
        if tag == sx.eos:
            self._emit_text(self._ws)
            self._ws = ""
            self._state = self._ended
            return m.end()
        if tag == sx.fn_open:
            self._ws = ""
            self._call = Call(self._abs(i))
            self._fail("missing_tool_call_open", sx.call_open, tag, self._abs(i))
            return i
        self._diagnose("unbalanced_tags", "text or a call", tag, self._abs(i), self._abs(m.end()), self._abs(i))
        self._emit_content(tag)
        return m.end()

    def _reasoning(self, buf: str, pos: int) -> int:
        sx = self._sx
        m = sx.reasoning.pattern.search(buf, pos)
        if m is None:
            end = sx.reasoning.hold_from(buf, pos)
            self._emit_reasoning(buf[pos:end])
            return ~end
        i, tag = m.start(), m.group()
        self._emit_reasoning(buf[pos:i])
        if tag == sx.think_close:
            self._state = self._content
            self._skip_newlines = True
            return m.end()
        if tag == sx.eos:
            self._diagnose("missing_think_end", sx.think_close, tag, self._abs(i), self._abs(m.end()), self._abs(i))
            self._state = self._ended
            return m.end()
        self._diagnose("call_in_reasoning", sx.think_close, tag, self._abs(i), self._abs(m.end()), self._abs(i))
        self._emit_reasoning(tag)
        return m.end()

    def _between(self, buf: str, pos: int) -> int:
        sx = self._sx
        option = choose(sx.between, buf, pos, (sx.sep + sx.call_open, sx.eos))
        if option == "":
            return ~pos
        if option == sx.eos:
            self._state = self._ended
            return pos + len(option)
        if option:
            return self._open_call(pos + len(sx.sep))
        self._stray_start = self._abs(pos)
        self._state = self._stray
        return pos

    def _ended(self, buf: str, pos: int) -> int:
        self._stray_start = self._abs(pos)
        self._state = self._stray
        return pos

    def _stray(self, buf: str, pos: int) -> int:
        markers = self._sx.stray
        m = markers.pattern.search(buf, pos)
        if m is None:
            return ~markers.hold_from(buf, pos)
        i = m.start()
        self._diagnose(
            "text_between_calls", "\\n<tool_call>", "text", self._stray_start, self._abs(i), self._stray_start
        )
        return self._open_call(i)

    def _recover(self, buf: str, pos: int) -> int:
        sx = self._sx
        m = sx.recover.pattern.search(buf, pos)
        if m is None:
            return ~sx.recover.hold_from(buf, pos)
        tag = m.group()
        if tag == sx.call_open:
            return self._open_call(m.start())
        self._state = self._between if tag == sx.call_close else self._ended
        return m.end()

    # ---- inside a call -------------------------------------------------------------------

    def _open_call(self, i: int) -> int:
        """Start a block whose `<tool_call>` is at buf index i; returns the index after it."""
        sx = self._sx
        self._call = Call(self._abs(i))
        self._call.raw.append(sx.call_open)
        self._expect(sx.sep + sx.fn_open, "bad_function_tag", self._read_function_name)
        return i + len(sx.call_open)

    def _expect(self, literal: str, code: str, then: Callable[[int], None]) -> None:
        """Require `literal` next; `then(offset after it)` runs once it is complete."""
        call = self._call
        call.literal, call.literal_code, call.literal_then = literal, code, then
        self._state = self._literal

    def _literal(self, buf: str, pos: int) -> int:
        call = self._call
        lit = call.literal
        seg = buf[pos : pos + len(lit)]
        if lit.startswith(seg):
            call.raw.append(seg)
            if len(seg) == len(lit):
                call.literal_then(self._abs(pos + len(seg)))
                return pos + len(seg)
            call.literal = lit[len(seg) :]
            return ~(pos + len(seg))
        k = next(j for j, (a, b) in enumerate(zip(seg, lit, strict=False)) if a != b)
        self._fail(call.literal_code, lit[k:], seg[k], self._abs(pos + k))
        return pos + k

    def _read_function_name(self, at: int) -> None:
        self._read_name(at, "bad_function_tag", self._function_named)

    def _read_name(self, at: int, code: str, then: Callable[[str], str | None]) -> None:
        call = self._call
        call.name_code, call.name_then, call.name_parts = code, then, []
        call.name_start = at
        self._state = self._name

    def _name(self, buf: str, pos: int) -> int:
        call = self._call
        j = _NAME.match(buf, pos).end()  # type: ignore[union-attr]  # `*` always matches
        call.name_parts.append(buf[pos:j])
        name = "".join(call.name_parts)
        if len(name) > _MAX_NAME_CHARS:
            at = call.name_start + _MAX_NAME_CHARS
            self._fail(call.name_code, f"a name of at most {_MAX_NAME_CHARS} characters", name[_MAX_NAME_CHARS], at)
            return pos
        if j == len(buf):
            call.raw.append(buf[pos:j])
            return ~j
        if buf[j] != self._sx.tag_end or not name:
            self._fail(call.name_code, "a name and " + self._sx.tag_end, buf[j], self._abs(j))
            return j
        error = call.name_then(name)
        if error is not None:
            self._fail(error, "a parameter not given before", name, self._abs(j) - len(name))
            return j
        call.raw.append(buf[pos : j + 1])
        return j + 1

    def _function_named(self, name: str) -> str | None:
        call = self._call
        call.name, call.index = name, self._index
        call.call_id = self._call_ids(self._index)
        self._index += 1
        self._out.append(CallStart(call.index, call.call_id, name))
        self._expect(self._sx.sep, "text_in_call", self._to_body)
        return None

    def _to_body(self, at: int) -> None:
        del at
        self._state = self._body

    def _body(self, buf: str, pos: int) -> int:
        sx = self._sx
        option = choose(sx.body, buf, pos, (sx.p_open, sx.fn_close, sx.call_close, sx.call_open, sx.eos))
        if option == "":
            return ~pos
        if option == sx.p_open:
            self._call.raw.append(option)
            self._read_name(self._abs(pos + len(option)), "bad_parameter_tag", self._parameter_named)
            return pos + len(option)
        if option == sx.fn_close:
            self._call.raw.append(option)
            self._expect(sx.sep + sx.call_close, "text_in_call", self._close_call)
            return pos + len(option)
        codes = {sx.call_close: "missing_function_close", sx.call_open: "unbalanced_tags", sx.eos: "unterminated_block"}
        got = option or buf[pos]
        self._fail(codes.get(got, "text_in_call"), sx.p_open + " or " + sx.fn_close, got, self._abs(pos))
        return pos

    def _parameter_named(self, name: str) -> str | None:
        call = self._call
        if name in call.arguments or name == call.value_name:
            return "duplicate_parameter"
        prefix = "{" if call.value_name is None else ", "
        call.value_name = name
        call.value_types = self._types(call.name, name)
        self._out.append(ArgumentsDelta(call.index, prefix + json.dumps(name, ensure_ascii=False) + ": "))
        self._expect(self._sx.sep, "bad_parameter_tag", self._open_value)
        return None

    def _declared(self) -> tuple[frozenset[str] | None, dict[str, Mapping[str, Any]]]:
        """Declared tool names and schemas, read on the first call (plain answers never pay)."""
        if self._tool_info is None:
            self._tool_info = (tool_names(self._tools), tool_schemas(self._tools))
        return self._tool_info

    def _types(self, tool: str, parameter: str) -> tuple[str, ...]:
        schema = self._declared()[1].get(tool)
        props = schema.get("properties") if schema is not None else None
        return declared_types(props.get(parameter), schema) if isinstance(props, Mapping) else ()

    def _open_value(self, at: int) -> None:
        call = self._call
        call.value_streams = streams_as_text(call.value_types)
        call.value_start = at
        call.value_from = len(call.raw)
        if call.value_streams:
            self._out.append(ArgumentsDelta(call.index, '"'))
        self._state = self._value

    def _value(self, buf: str, pos: int) -> int:
        sx = self._sx
        m = sx.value.pattern.search(buf, pos)
        if m is None:
            end = sx.value.hold_from(buf, pos)
            self._value_text(buf[pos:end])
            return ~end
        i, tag = m.start(), m.group()
        self._value_text(buf[pos:i])
        if tag != sx.sep + sx.p_close:
            code = "unterminated_block" if tag == sx.eos else "missing_parameter_close"
            self._fail(code, sx.sep + sx.p_close, tag, self._abs(i))
            return i
        return self._close_value(buf, i, m.end())

    # ---- shortcuts for feed: the machine's outcome, with less work ------------------------

    def _quick_value(self, delta: str) -> list[Event]:
        """A value delta without a whole marker: its text is taken, up to where a marker may
        start (held back, as `_value` does)."""
        call = self._call
        if self._plain_value(delta) is None and delta:  # the common case: nothing to escape
            self._base += len(delta)
            call.raw.append(delta)
            # argument fragments do not change the result: the builder needs not see them
            return [ArgumentsDelta(call.index, delta)] if call.value_streams else []
        markers = self._sx.value
        start = markers.starts.search(delta)
        if start is None:  # only characters to escape
            at = len(delta)
        elif delta[start.start() :] in markers.waiting:  # the start of the end marker, say
            at = start.start()
        elif markers.pattern.search(delta) is None:  # a newline in the value, say
            at = markers.hold_from(delta, 0)
        else:
            return self._read(delta)
        self._base += at
        out: list[Event] = []
        self._out = out
        self._value_text(delta[:at])
        if at < len(delta):
            self._held = delta[at:]
            self._wait_in_tag()
        return out

    def _quick_held_value(self, delta: str) -> list[Event]:
        """A value holding back a short start of a marker ("\n", "\n<", "</"): when the held
        text and `delta` still start one, hold them too."""
        held = self._held + delta
        if held not in self._sx.value.waiting:
            return self._read(delta)
        self._held = held
        self._wait_in_tag()
        return []

    def _quick_start(self, delta: str) -> list[Event]:
        """The first delta, when it cannot start the reasoning opener: content."""
        opener = self._sx.think_open
        if not delta or opener.startswith(delta[: len(opener)]):
            return self._feed_read(delta)
        self._state = self._content
        self.feed = self._quick_content
        return self._quick_content(delta)

    def _quick_content(self, delta: str) -> list[Event]:
        start = self._content_start(delta) if self._content_first in delta else None
        if start is not None:  # text and then the start of a tag (more than a "<") is held back
            at = start.start()
            held = delta[at:]
            if len(held) < 2 or held not in self._sx.content.waiting:
                return self._read(delta)
            self._base += at
            self._out = []
            self._emit_content(delta[:at])
            self._held = held
            self._wait_in_tag()
            return self._out
        self._base += len(delta)
        body = delta.rstrip()
        if self._skip_newlines or not body:
            self._out = []
            self._emit_content(delta)
            return self._out
        text = self._ws + body if self._ws else body  # what _emit_content emits, directly
        self._ws = delta[len(body) :]
        self._builder.text(text)
        return [TextDelta(text)]

    def _quick_reasoning(self, delta: str) -> list[Event]:
        if self._sx.reasoning.starts.search(delta) is not None:
            return self._read(delta)
        self._base += len(delta)
        self._out = []
        self._emit_reasoning(delta)
        return self._out

    def _value_text(self, text: str) -> None:
        if text:
            call = self._call
            call.raw.append(text)
            if call.value_streams:
                escaped = _ENCODE(text)[1:-1] if NEEDS_ESCAPE.search(text) else text
                self._out.append(ArgumentsDelta(call.index, escaped))

    def _close_value(self, buf: str, i: int, end: int) -> int:
        call = self._call
        text = "".join(call.raw[call.value_from :])
        typed = decode(text, call.value_types)
        if typed.error is not None:
            expected = f"{typed.expected} ({typed.reason})" if typed.reason else typed.expected
            self._fail(typed.error, expected, text, call.value_start)
            return i
        name = call.value_name or ""
        call.arguments[name] = typed.value
        closing = '"' if call.value_streams else json.dumps(typed.value, ensure_ascii=False)
        self._out.append(ArgumentsDelta(call.index, closing))
        call.raw.append(buf[i:end])
        self._expect(self._sx.sep, "text_in_call", self._to_body)
        return end

    def _close_call(self, at: int) -> None:
        del at
        call = self._call
        raw = "".join(call.raw)
        self._out.append(ArgumentsDelta(call.index, "{}" if call.value_name is None else "}"))
        span = (call.start, call.start + len(raw))
        candidate = ToolCallCandidate(call.call_id, call.name, call.arguments, raw, span, self._sx.fmt.name)
        self._builder.candidate(candidate)
        self._out.append(CallEnd(call.index, candidate))
        names = self._declared()[0]
        if names is not None and call.name not in names:
            known = ", ".join(sorted(names)) or "no tools"
            self._diagnose("unknown_tool", known, call.name, span[0], span[1], span[0])
        self._state = self._between

    def _fail(self, code: str, expected: str, got: str, at: int) -> None:
        """Report the malformed block (at: output offset of the fault) and skip to its end."""
        start = self._call.start
        # Text that is (the start of) a call opener is read again by recovery and may open the
        # next block, a candidate: the malformed span stops before it.
        opener = self._sx.call_open
        end = at if opener.startswith(got) or got.startswith(opener) else at + len(got)
        self._diagnose(code, expected, got, start, max(end, start + 1), at)
        self._state = self._recover
