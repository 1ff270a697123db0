"""The value types shared by every layer: frozen dataclasses, and immutable events.

Knows: the shapes of parse results, candidates, diagnostics and streaming events.
Does not know: any format, any engine, any web framework.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass
from typing import Any, ClassVar, Literal, NoReturn, TypeAlias


@dataclass(frozen=True, slots=True)
class ToolCallCandidate:
    """A tool call the model wrote. A request, never a fact: nothing executes it."""

    call_id: str  # "call_" + random, or the model-native id where the format has one
    name: str  # as written by the model; never dropped or corrected
    arguments: dict[str, Any]  # decoded JSON object
    raw: str  # exact text of this call in the model output
    span: tuple[int, int]  # [start, end) character offsets of `raw` in the output
    format: str  # format name, e.g. "dsml-v4"
    truncated: bool = False  # budget closing (max_tokens) cut its arguments short


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """Bad model output, as a value: a stable snake_case code, a message and where."""

    code: str
    message: str  # "expected X, got Y at offset N"
    span: tuple[int, int]


@dataclass(frozen=True, slots=True)
class ParseResult:
    content: str | None  # text outside reasoning and call blocks; None when empty
    reasoning: str | None  # None when empty
    candidates: tuple[ToolCallCandidate, ...]
    diagnostics: tuple[Diagnostic, ...]


def arguments_json(arguments: dict[str, Any]) -> str:
    """The canonical JSON text of a call's arguments.

    Streaming `ArgumentsDelta` fragments of one call concatenate to exactly this.
    """
    return json.dumps(arguments, ensure_ascii=False)


# ---- streaming events -------------------------------------------------------------------
#
# Not dataclasses: a parser builds one event per 4-character delta, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs about 2x a class whose __init__
# stores through the slot descriptors directly. These classes keep the frozen-dataclass
# contract: slotted, immutable (FrozenInstanceError), equal by type and field values, hashed
# and printed like frozen dataclasses. `kind` is a per-class constant.


class _Event:
    """What every event shares: immutability, equality, hashing, repr and pickling."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]]  # the dataclass fields, `kind` last

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            assert isinstance(other, _Event)
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({shown})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[type[_Event], tuple[Any, ...]]:
        return type(self), self._values()[:-1]


def _setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The slot descriptor's store: what a frozen __init__ may call."""
    store: Callable[[Any, Any], None] = vars(cls)[name].__set__
    return store


class TextDelta(_Event):
    __slots__ = ("text",)
    __match_args__ = ("text", "kind")
    _fields = ("text", "kind")
    text: str
    kind: ClassVar[Literal["text"]] = "text"

    def __init__(self, text: str) -> None:
        _text_delta_text(self, text)


class ReasoningDelta(_Event):
    __slots__ = ("text",)
    __match_args__ = ("text", "kind")
    _fields = ("text", "kind")
    text: str
    kind: ClassVar[Literal["reasoning"]] = "reasoning"

    def __init__(self, text: str) -> None:
        _reasoning_delta_text(self, text)


class CallStart(_Event):
    __slots__ = ("call_id", "index", "name")
    __match_args__ = ("index", "call_id", "name", "kind")
    _fields = ("index", "call_id", "name", "kind")
    index: int  # 0-based position of the call in this output
    call_id: str
    name: str
    kind: ClassVar[Literal["call_start"]] = "call_start"

    def __init__(self, index: int, call_id: str, name: str) -> None:
        _call_start_index(self, index)
        _call_start_call_id(self, call_id)
        _call_start_name(self, name)


class ArgumentsDelta(_Event):
    __slots__ = ("index", "text")
    __match_args__ = ("index", "text", "kind")
    _fields = ("index", "text", "kind")
    index: int
    text: str  # a fragment of arguments_json(final arguments)
    kind: ClassVar[Literal["arguments"]] = "arguments"

    def __init__(self, index: int, text: str) -> None:
        _arguments_delta_index(self, index)
        _arguments_delta_text(self, text)


class CallEnd(_Event):
    __slots__ = ("candidate", "index")
    __match_args__ = ("index", "candidate", "kind")
    _fields = ("index", "candidate", "kind")
    index: int
    candidate: ToolCallCandidate
    kind: ClassVar[Literal["call_end"]] = "call_end"

    def __init__(self, index: int, candidate: ToolCallCandidate) -> None:
        _call_end_index(self, index)
        _call_end_candidate(self, candidate)


class DiagnosticEvent(_Event):
    __slots__ = ("diagnostic",)
    __match_args__ = ("diagnostic", "kind")
    _fields = ("diagnostic", "kind")
    diagnostic: Diagnostic
    kind: ClassVar[Literal["diagnostic"]] = "diagnostic"

    def __init__(self, diagnostic: Diagnostic) -> None:
        _diagnostic_event_diagnostic(self, diagnostic)


_text_delta_text = _setter(TextDelta, "text")
_reasoning_delta_text = _setter(ReasoningDelta, "text")
_call_start_index = _setter(CallStart, "index")
_call_start_call_id = _setter(CallStart, "call_id")
_call_start_name = _setter(CallStart, "name")
_arguments_delta_index = _setter(ArgumentsDelta, "index")
_arguments_delta_text = _setter(ArgumentsDelta, "text")
_call_end_index = _setter(CallEnd, "index")
_call_end_candidate = _setter(CallEnd, "candidate")
_diagnostic_event_diagnostic = _setter(DiagnosticEvent, "diagnostic")

Event: TypeAlias = TextDelta | ReasoningDelta | CallStart | ArgumentsDelta | CallEnd | DiagnosticEvent


def coalesce(events: list[Event]) -> list[Event]:
    """Merge adjacent text / reasoning / argument deltas of the same kind (and call index).

    Two event streams for the same output split into different deltas are equal after
    coalescing; that is the streaming invariant the tests check.
    """
    out: list[Event] = []
    for ev in events:
        if out:
            last = out[-1]
            if isinstance(ev, TextDelta) and isinstance(last, TextDelta):
                out[-1] = TextDelta(last.text + ev.text)
                continue
            if isinstance(ev, ReasoningDelta) and isinstance(last, ReasoningDelta):
                out[-1] = ReasoningDelta(last.text + ev.text)
                continue
            if isinstance(ev, ArgumentsDelta) and isinstance(last, ArgumentsDelta) and ev.index == last.index:
                out[-1] = ArgumentsDelta(last.index, last.text + ev.text)
                continue
        if isinstance(ev, (TextDelta, ReasoningDelta, ArgumentsDelta)) and not ev.text:
            continue
        out.append(ev)
    return out
