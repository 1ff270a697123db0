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
import math
from collections.abc import Callable, Sequence
from enum import Enum, auto
from typing import Any

from callgate.formats import ToolCallFormat
from callgate.parsers.base import CallIdFactory
from callgate.parsers.dsml_scan import Buffer, MarkerSet, match_literals
from callgate.types import ArgumentsDelta, CallStart, Diagnostic, Event, ToolCallCandidate


class _S(Enum):
    OPEN = auto()  # the block name and ">\n"
    FIRST_INVOKE = auto()
    NAME = auto()
    NAME_END = auto()
    PARAMS = auto()  # a first parameter, or the "\n" of an empty parameter list
    EMPTY_CLOSE = auto()
    KEY = auto()
    ATTR = auto()
    FLAG = auto()
    VALUE = auto()
    AFTER_PARAM = auto()
    NEXT_PARAM = auto()
    AFTER_INVOKE = auto()
    NEXT_INVOKE = auto()
    CLOSED = auto()
    FAILED = auto()


_NAME_STOP = frozenset('"\n<>')  # a name or key ends at '"'; the others are errors
# error code when the text matches none of a state's literals (states with a fixed code)
_MISMATCH = {
    _S.NAME_END: "bad_invoke_name",
    _S.EMPTY_CLOSE: "missing_invoke_close",
    _S.ATTR: "bad_parameter_attrs",
    _S.FLAG: "bad_string_attr",
    _S.AFTER_INVOKE: "text_between_invokes",
}


def strict_json(text: str) -> Any:
    """One JSON value; NaN, Infinity, overflowing floats and duplicate keys are errors."""

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    def finite(num: str) -> float:
        value = float(num)
        if math.isinf(value):
            raise ValueError(f"{num} overflows a double")
        return value

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            raise ValueError("duplicate key in object")
        return out

    return json.loads(text, parse_constant=no_constants, parse_float=finite, object_pairs_hook=unique)


class BlockReader:
    """Reads one calls block; `run` consumes what it can decide and returns the events."""

    def __init__(self, fmt: ToolCallFormat, first_index: int, call_ids: CallIdFactory) -> None:
        m = fmt.markers
        self._fmt, self._m = fmt, m
        self._call_ids = call_ids
        self._values = MarkerSet((m["param_close"], fmt.eos))
        self._tag_end = m["tag_end"]  # '">', right after a name or the string flag
        self._state = _S.OPEN
        self._index = first_index
        self.candidates: list[ToolCallCandidate] = []
        self.failure: Diagnostic | None = None
        self._chars: list[str] = []  # the name or key being read
        self._raw: list[str] = []  # text of the current invoke
        self._invoke_start = 0
        self._call_id = ""
        self._name = ""
        self._key = ""
        self._args: dict[str, Any] = {}
        self._is_str = True
        self._value: list[str] = []
        self._value_start = 0
        self._literals = self._literal_table()
        self._actions: dict[str, Callable[[int], list[Event]]] = {
            "open_invoke": self._open_invoke,
            "start_call": lambda _: self._start_call(),
            "end_invoke": lambda _: self._end_invoke(),
            "string_value": lambda _: self._start_value(is_str=True),
            "json_value": lambda _: self._start_value(is_str=False),
        }

    @property
    def closed(self) -> bool:
        return self._state is _S.CLOSED

    @property
    def done(self) -> bool:
        return self._state in (_S.CLOSED, _S.FAILED)

    def run(self, buf: Buffer, *, final: bool) -> list[Event]:
        events: list[Event] = []
        while not self.done:
            before = (self._state, buf.offset)
            events += self._step(buf, final)
            if (self._state, buf.offset) == before:
                break  # needs more text
        return events

    def _step(self, buf: Buffer, final: bool) -> list[Event]:
        if self._state in (_S.NAME, _S.KEY):
            return self._read_name(buf, final)
        if self._state is _S.VALUE:
            return self._read_value(buf, final)
        return self._read_literal(buf, final)

    # ---- literal tags ---------------------------------------------------------------

    def _literal_table(self) -> dict[_S, tuple[tuple[str, _S | str], ...]]:
        """state -> its literal alternatives, each with the next state or an action name."""
        m, end = self._m, self._tag_end
        return {
            _S.OPEN: ((m["block_open"].split(m["dsml"], 1)[1] + "\n", _S.FIRST_INVOKE),),
            _S.FIRST_INVOKE: ((m["invoke_open"], "open_invoke"),),
            _S.NAME_END: ((end + "\n", "start_call"),),
            _S.PARAMS: ((m["param_open"], _S.KEY), ("\n", _S.EMPTY_CLOSE)),
            _S.EMPTY_CLOSE: ((m["invoke_close"], "end_invoke"),),
            _S.ATTR: ((m["string_attr"], _S.FLAG),),
            _S.FLAG: (("true" + end, "string_value"), ("false" + end, "json_value")),
            _S.AFTER_PARAM: (("\n", _S.NEXT_PARAM),),
            _S.NEXT_PARAM: ((m["param_open"], _S.KEY), (m["invoke_close"], "end_invoke")),
            _S.AFTER_INVOKE: (("\n", _S.NEXT_INVOKE),),
            _S.NEXT_INVOKE: ((m["invoke_open"], "open_invoke"), (m["block_close"], _S.CLOSED)),
        }

    def _read_literal(self, buf: Buffer, final: bool) -> list[Event]:
        table, at = self._literals[self._state], buf.offset
        alts = [literal for literal, _ in table]
        choice = match_literals(buf, [*alts, self._fmt.eos], final=final)
        if choice.index == -1:
            return []
        if choice.index == len(alts):
            return self._fail("unterminated_block", alts, "the end of turn", at, len(self._fmt.eos))
        if choice.index >= 0:
            self._raw.append(alts[choice.index])
            target = table[choice.index][1]
            if isinstance(target, _S):
                return self._goto(target)
            self._value_start = buf.offset
            return self._actions[target](at)
        got = buf.peek(choice.common + 1)[choice.common :]
        if not got:
            return self._fail("unterminated_block", alts, "the end of output", at + choice.common, 0)
        code = self._mismatch_code(choice.best, choice.common, buf.peek(1))
        return self._fail(code, alts, repr(got), at + choice.common)

    def _mismatch_code(self, best: int, common: int, first: str) -> str:
        m, s = self._m, self._state
        param_tag = m["param_open"].index(" ")  # "<｜DSML｜parameter"
        invoke_tag = m["invoke_open"].index(" ")  # "<｜DSML｜invoke"
        if s is _S.OPEN:
            return "wrong_block_name" if common < len(m["block"]) else "bad_block_open"
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
        stop = next((i for i, ch in enumerate(rest) if ch in _NAME_STOP), len(rest))
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

    def _read_value(self, buf: Buffer, final: bool) -> list[Event]:
        at = buf.offset
        hit = self._values.scan(buf, final=final)
        self._raw.append(hit.text)
        self._value.append(hit.text)
        events: list[Event] = []
        if self._is_str and hit.text:
            events.append(ArgumentsDelta(self._index, json.dumps(hit.text, ensure_ascii=False)[1:-1]))
        close = self._m["param_close"]
        if hit.marker == close:
            self._raw.append(close)
            return events + self._end_value()
        if hit.marker is not None:
            eos_at = at + len(hit.text)
            return events + self._fail("missing_parameter_close", [close], "the end of turn", eos_at, len(hit.marker))
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
        self._raw = [self._m["invoke_open"]]
        self._args = {}
        return self._goto(_S.NAME)

    def _start_call(self) -> list[Event]:
        self._call_id = self._call_ids(self._index)
        self._state = _S.PARAMS
        return [CallStart(self._index, self._call_id, self._name)]

    def _start_value(self, *, is_str: bool) -> list[Event]:
        sep = ", " if self._args else "{"
        self._is_str, self._value = is_str, []
        self._args[self._key] = None  # reserved: a repeated name is an error
        self._state = _S.VALUE
        prefix = sep + json.dumps(self._key, ensure_ascii=False) + ": " + ('"' if is_str else "")
        return [ArgumentsDelta(self._index, prefix)]

    def _end_value(self) -> list[Event]:
        text = "".join(self._value)
        self._state = _S.AFTER_PARAM
        if self._is_str:
            self._args[self._key] = text
            return [ArgumentsDelta(self._index, '"')]
        try:
            value = strict_json(text)
            encoded = json.dumps(value, ensure_ascii=False)
        except (ValueError, RecursionError) as err:  # RecursionError: absurdly deep nesting
            shown = text if len(text) <= 40 else text[:37] + "..."
            return self._fail(
                "invalid_json_value", ["a JSON value"], f"{shown!r} ({err})", self._value_start, len(text)
            )
        self._args[self._key] = value
        return [ArgumentsDelta(self._index, encoded)]

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
