"""The states of the qwen3-xml machine that read a call block and what follows it, and
how the machine queues events (golden/qwen3-xml/FORMAT.md section 6; the grammar and
the decisions are in qwen3_xml.py's docstring).

Knows: the block's tags (from qwen3_xml_syntax), typed values (qwen3_xml_values), the
golden reason codes. Does not know: text before the first call (qwen3_xml_text.py) or
how `feed` drives the machine (qwen3_xml.py).

A state reads buf from pos and returns where it stopped; ~index (negative) when it needs
more text and keeps buf[index:] for the next delta. Events go to self._out, the results
to self._builder; offsets are absolute (self._abs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from callgate.parsers.base import CallIdFactory, ResultBuilder, Tools, tool_names, tool_schemas
from callgate.parsers.qwen3_xml_syntax import NEEDS_ESCAPE, Call, Syntax, choose
from callgate.parsers.qwen3_xml_values import declared_types, decode, streams_as_text
from callgate.types import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    Diagnostic,
    DiagnosticEvent,
    Event,
    TextDelta,
    ToolCallCandidate,
)

_NAME = re.compile(r"[^\s<>=\"'/]*")
_MAX_NAME_CHARS = 256  # keeps the hold-back of a tag name bounded
_MAX_SHOWN_CHARS = 20
# json.dumps(..., ensure_ascii=False) builds an encoder per call (~1.5 us here); value text
# is escaped once per delta while it streams
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


# A state reads buf from pos and returns where it stopped; ~index (negative) when it needs
# more text and keeps buf[index:] for the next delta.
State = Callable[[str, int], int]


class Qwen3XmlBlockReader:
    """The block states and the event queue of one parse. The parser (qwen3_xml.py) sets
    the first state; free text before the first call is read by qwen3_xml_text.py."""

    _state: State  # the current state

    def __init__(self, syntax: Syntax, tools: Tools, *, call_ids: CallIdFactory) -> None:
        self._sx = syntax
        self._tools = tools
        self._tool_info: tuple[frozenset[str] | None, dict[str, Mapping[str, Any]]] | None = None
        self._call_ids = call_ids
        self._builder = ResultBuilder()
        self._out: list[Event] = []
        self._base = 0  # offset of the current buffer's first character in the output
        self._index = 0
        self._stray_start = 0
        self._call = Call(0)

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

    # ---- after a call --------------------------------------------------------------------

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
