"""The DSML calls block, read incrementally: from right after `\\n\\n<｜DSML｜` to the block's
closing tag (golden/dsml/FORMAT.md sections 5 and 6).

Knows: the block grammar (from the format spec's markers), the golden decode reason codes
(used as diagnostic codes), and how arguments stream: `{"key": ` as soon as a parameter
opens, string values as escaped fragments while they arrive, `string="false"` values (each
must be valid JSON on its own) when they close. Does not know: reasoning, content, what may
follow the block, or the tools list (dsml.py handles those).

Bad text is state: the first error becomes `failure` and the reader stops. Candidates are
collected in `candidates`; the caller hands them out only once the block is well formed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from callgate import strict_json
from callgate.formats import DsmlMarkers, ToolCallFormat
from callgate.parsers.base import CallIdFactory
from callgate.parsers.dsml_block_syntax import BlockState as _S
from callgate.parsers.dsml_block_syntax import block_syntax, escaped
from callgate.parsers.dsml_scan import Buffer, match_literals, scan
from callgate.types import ArgumentsDelta, CallStart, Diagnostic, Event, ToolCallCandidate

_TEXT_STATES = frozenset((_S.VALUE, _S.NAME, _S.KEY))
# A value's end marker or the end of turn, from its third character on ("</｜", "<｜e"):
# nothing else starts so, while "<" and "</" do in ordinary text
_DISTINCT_CHARS = 3
HELD_SHORT, HELD_DISTINCT = 1, 2  # values of BlockReader.held
# An enum member is looked up through its class (~45 ns here against ~15 ns for a module
# name): `quick` and `waits_for`, on the per-delta path, compare against these.
_VALUE, _NAME, _KEY, _NAME_END, _OPEN = _S.VALUE, _S.NAME, _S.KEY, _S.NAME_END, _S.OPEN
_NAME_STOP = re.compile('["\n<>]')  # a name or key ends at '"'; the others are errors
# error code when the text matches none of a state's literals (states with a fixed code)
_MISMATCH = {
    _S.NAME_END: "bad_invoke_name",
    _S.EMPTY_CLOSE: "missing_invoke_close",
    _S.ATTR: "bad_parameter_attrs",
    _S.FLAG: "bad_string_attr",
    _S.AFTER_INVOKE: "text_between_invokes",
}


class BlockReader:
    """Reads one calls block; `run` consumes what it can decide and returns the events."""

    def __init__(self, fmt: ToolCallFormat, first_index: int, call_ids: CallIdFactory) -> None:
        m = fmt.markers_as(DsmlMarkers)
        self._fmt, self._m = fmt, m
        self._call_ids = call_ids
        syntax = block_syntax(fmt)
        self._values = syntax.values
        self._value_stop = syntax.value_stop
        self._pending = syntax.pending
        self._state = _S.OPEN
        self._index = first_index
        self.candidates: list[ToolCallCandidate] = []
        self.failure: Diagnostic | None = None
        # set by `quick` when it held back the start of a marker: HELD_SHORT ("<", "</",
        # likely text: read again with the next delta) or HELD_DISTINCT (wait for ">>")
        self.held = 0
        self._chars: list[str] = []  # the name or key being read
        self._raw: list[str] = []  # text of the current invoke
        self._invoke_start = 0
        self._call_id = ""
        self._name = ""
        self._key = ""
        self._args: dict[str, Any] = {}
        self._is_str = True
        self._value_from = 0  # _raw[_value_from:] is the text of the value being read
        self._value_start = 0
        self._literals = syntax.literals
        self._actions: dict[str, Callable[[int], list[Event]]] = {
            "open_invoke": self._open_invoke,
            "start_call": lambda _: self._start_call(),
            "end_invoke": lambda _: self._end_invoke(),
            "string_value": lambda _: self._start_value(is_str=True),
            "json_value": lambda _: self._start_value(is_str=False),
        }

    def waits_for(self, buf: Buffer) -> str:
        """What the reader needs before reading on is worth it when it stands inside tag
        text (not in a value, name or key, or holding back the start of a marker): ">" for
        the end of the tag, ">>" for the end of the tag after it, "\n" for the line after
        an invoke name (then the call starts). "" otherwise.

        ">>" where the first tag yields nothing that must stream at once: the block name,
        and a parameter's closing tag (its value ends with the next tag). A value holding
        back less than `_DISTINCT_CHARS` waits for nothing: "<" and "</" are common in text,
        and waiting there would stall the value (`run` reads the next delta)."""
        state = self._state
        held = len(buf)
        if state in _TEXT_STATES and held < _DISTINCT_CHARS:
            return ""
        if state is _VALUE:
            return ">>"
        if state is _NAME_END:
            return "\n"
        return ">>" if state is _OPEN else ">"

    @property
    def closed(self) -> bool:
        return self._state is _S.CLOSED

    def run(self, buf: Buffer, *, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            state, pos = self._state, buf.pos
            if state is _S.VALUE:
                if not final and not len(buf):
                    return events  # a value starts: `quick` reads the next delta
                events += self._read_value(buf, final)
            elif state is _S.NAME or state is _S.KEY:
                events += self._read_name(buf, final)
            elif state is _S.CLOSED or state is _S.FAILED:
                return events
            else:
                events += self._read_literal(buf, final)
            if self._state is state and buf.pos == pos:
                return events  # needs more text

    # ---- literal tags ---------------------------------------------------------------

    def _read_literal(self, buf: Buffer, final: bool) -> list[Event]:
        table, at = self._literals[self._state], buf.offset
        for literal, target in table:  # the common cases first: a literal, or a part of one
            if buf.startswith(literal):
                buf.take(len(literal))
                return self._matched(literal, target, buf, at)
        if not final:
            rest = buf.rest()
            if not rest or rest in self._pending[self._state]:
                return []
        alts = [literal for literal, _ in table]
        choice = match_literals(buf, [*alts, self._fmt.eos], final=final)
        if choice.index == -1:
            return []
        if choice.index == len(alts):
            return self._fail("unterminated_block", alts, "the end of turn", at, len(self._fmt.eos))
        if choice.index >= 0:
            return self._matched(*table[choice.index], buf, at)
        got = buf.peek(choice.common + 1)[choice.common :]
        if not got:
            return self._fail("unterminated_block", alts, "the end of output", at + choice.common, 0)
        code = self._mismatch_code(choice.best, choice.common, buf.peek(1))
        return self._fail(code, alts, repr(got), at + choice.common)

    def _matched(self, literal: str, target: _S | str, buf: Buffer, at: int) -> list[Event]:
        self._raw.append(literal)
        if isinstance(target, _S):
            return self._goto(target)
        self._value_start = buf.offset
        return self._actions[target](at)

    def _mismatch_code(self, best: int, common: int, first: str) -> str:
        m, s = self._m, self._state
        param_tag = m.param_open.index(" ")  # "<｜DSML｜parameter"
        invoke_tag = m.invoke_open.index(" ")  # "<｜DSML｜invoke"
        if s is _S.OPEN:
            return "wrong_block_name" if common < len(m.block) else "bad_block_open"
        if s is _S.FIRST_INVOKE:
            return "bad_invoke_name" if common >= invoke_tag else "bad_block_open"
        if s is _S.NEXT_INVOKE:
            return "bad_invoke_name" if best == 0 and common >= invoke_tag else "text_between_invokes"
        if s in (_S.PARAMS, _S.NEXT_PARAM):
            return "bad_parameter_attrs" if best == 0 and common >= param_tag else "missing_invoke_close"
        if s is _S.AFTER_PARAM:
            # text glued to a parameter's closing tag: the value itself held a closing tag
            return "missing_newline_between_parameters" if first == "<" else "param_value_contains_close_tag"
        return _MISMATCH[s]

    # ---- names, keys, values --------------------------------------------------------

    def _read_name(self, buf: Buffer, final: bool) -> list[Event]:
        rest, at = buf.rest(), buf.offset
        found = _NAME_STOP.search(rest)
        stop = len(rest) if found is None else found.start()
        self._chars.append(self._take(buf, stop))
        tail, eos = rest[stop:], self._fmt.eos
        if not tail:
            return self._fail("unterminated_block", ['"'], "the end of output", at + stop, 0) if final else []
        if tail.startswith(eos):
            return self._fail("unterminated_block", ['"'], "the end of turn", at + stop, len(eos))
        if eos.startswith(tail) and not final:
            return []  # maybe the end of turn: wait
        code = "bad_parameter_attrs" if self._state is _S.KEY else "bad_invoke_name"
        if tail[0] != '"':
            return self._fail(code, ['"'], repr(tail[0]), at + stop)
        text, self._chars = "".join(self._chars), []
        if self._state is _S.NAME:
            if not text:
                return self._fail(code, ["a tool name"], repr(tail[0]), at + stop)
            self._name = text
            return self._goto(_S.NAME_END)
        if text in self._args:
            return self._fail("duplicate_parameter", [f"a parameter other than {text!r}"], repr(text), at + stop)
        self._key = text
        return self._goto(_S.ATTR)

    # ---- shortcuts for feed: the same outcome as `run`, with less work ---------------

    def quick(self, buf: Buffer, delta: str) -> list[Event] | None:
        """What `run` would do after `buf.append(delta)`, done directly when that is simple.

        Only for a reader outside tag text with nothing held back:
        value or name text that cannot end it is taken whole; value text followed by the
        start of a marker is taken and the start held back (then `held` says how).
        None: `run` must read it (nothing was done)."""
        state = self._state
        if state is _VALUE:
            stop = self._value_stop.search(delta)
            if stop is None:  # the common case first: nothing that can end the value or needs escaping
                buf.base += len(delta)
                self._raw.append(delta)
                return [ArgumentsDelta(self._index, delta)] if self._is_str else []
            if "<" not in delta:
                buf.skip(len(delta))
                return self._value_text(delta)
            at = delta.index("<")
            if not self._values.waits(delta[at:]):
                return None
            buf.skip(at)
            buf.append(delta[at:])
            self.held = HELD_DISTINCT if len(delta) - at >= _DISTINCT_CHARS else HELD_SHORT
            return self._value_text(delta[:at]) if at else []
        if (state is _NAME or state is _KEY) and _NAME_STOP.search(delta) is None:
            buf.skip(len(delta))
            self._raw.append(delta)
            self._chars.append(delta)
            return []
        return None

    def quick_held(self, buf: Buffer, delta: str) -> list[Event] | None:
        """`quick` for a value holding back a short start of a marker ("<", "</"): when the
        held text and `delta` still start one, hold them too (`held` says how). None: `run`
        must read it (nothing was done)."""
        if self._state is not _VALUE:
            return None
        text = buf.rest() + delta
        if not self._values.waits(text):
            return None
        buf.append(delta)
        self.held = HELD_DISTINCT if len(text) >= _DISTINCT_CHARS else HELD_SHORT
        return []

    def _value_text(self, text: str) -> list[Event]:
        self._raw.append(text)
        return [ArgumentsDelta(self._index, escaped(text))] if self._is_str else []

    def _read_value(self, buf: Buffer, final: bool) -> list[Event]:
        at = buf.offset
        text, marker = scan(self._values, buf, final=final)
        self._raw.append(text)
        events: list[Event] = []
        if self._is_str and text:
            events.append(ArgumentsDelta(self._index, escaped(text)))
        close = self._m.param_close
        if marker == close:
            events += self._end_value()
            self._raw.append(close)
            return events
        if marker is not None:
            eos_at = at + len(text)
            return events + self._fail("missing_parameter_close", [close], "the end of turn", eos_at, len(marker))
        if final:
            return events + self._fail("unterminated_block", [close], "the end of output", buf.offset, 0)
        return events

    def _take(self, buf: Buffer, n: int) -> str:
        text = buf.take(n)
        self._raw.append(text)
        return text

    # ---- transitions ----------------------------------------------------------------

    def _goto(self, state: _S) -> list[Event]:
        self._state = state
        return []

    def _open_invoke(self, at: int) -> list[Event]:
        self._invoke_start = at
        self._raw = [self._m.invoke_open]
        self._args = {}
        return self._goto(_S.NAME)

    def _start_call(self) -> list[Event]:
        self._call_id = self._call_ids(self._index)
        self._state = _S.PARAMS
        return [CallStart(self._index, self._call_id, self._name)]

    def _start_value(self, *, is_str: bool) -> list[Event]:
        sep = ", " if self._args else "{"
        self._is_str, self._value_from = is_str, len(self._raw)
        self._args[self._key] = None  # reserved: a repeated name is an error
        self._state = _S.VALUE
        prefix = sep + json.dumps(self._key, ensure_ascii=False) + ": " + ('"' if is_str else "")
        return [ArgumentsDelta(self._index, prefix)]

    def _end_value(self) -> list[Event]:
        text = "".join(self._raw[self._value_from :])
        self._state = _S.AFTER_PARAM
        if self._is_str:
            self._args[self._key] = text
            return [ArgumentsDelta(self._index, '"')]
        try:
            value = strict_json.loads(text)
        except strict_json.StrictJsonError as err:
            shown = text if len(text) <= 40 else text[:37] + "..."
            return self._fail(
                "invalid_json_value", ["a JSON value"], f"{shown!r} ({err})", self._value_start, len(text)
            )
        self._args[self._key] = value
        return [ArgumentsDelta(self._index, json.dumps(value, ensure_ascii=False))]

    def _end_invoke(self) -> list[Event]:
        raw = "".join(self._raw)
        self.candidates.append(
            ToolCallCandidate(
                call_id=self._call_id,
                name=self._name,
                arguments=dict(self._args),
                raw=raw,
                span=(self._invoke_start, self._invoke_start + len(raw)),
                format=self._fmt.name,
            )
        )
        index, self._index = self._index, self._index + 1
        self._state = _S.AFTER_INVOKE
        return [ArgumentsDelta(index, "}" if self._args else "{}")]

    def _fail(self, code: str, expected: Sequence[str], got: str, at: int, width: int = 1) -> list[Event]:
        wanted = " or ".join(repr(e) for e in expected)
        self.failure = Diagnostic(code, f"expected {wanted}, got {got} at offset {at}", (at, at + width))
        self._state = _S.FAILED
        return []
