"""Frozen dataclasses shared by every layer.

Knows: the shapes of parse results, candidates, diagnostics and streaming events.
Does not know: any format, any engine, any web framework.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias


@dataclass(frozen=True, slots=True)
class ToolCallCandidate:
    """A tool call the model wrote. A request, never a fact: nothing executes it."""

    call_id: str  # "call_" + random, or the model-native id where the format has one
    name: str  # as written by the model; never dropped or corrected
    arguments: dict[str, Any]  # decoded JSON object
    raw: str  # exact text of this call in the model output
    span: tuple[int, int]  # [start, end) character offsets of `raw` in the output
    format: str  # format name, e.g. "dsml-v4"


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


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str
    kind: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int  # 0-based position of the call in this output
    call_id: str
    name: str
    kind: Literal["call_start"] = "call_start"


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    index: int
    text: str  # a fragment of arguments_json(final arguments)
    kind: Literal["arguments"] = "arguments"


@dataclass(frozen=True, slots=True)
class CallEnd:
    index: int
    candidate: ToolCallCandidate
    kind: Literal["call_end"] = "call_end"


@dataclass(frozen=True, slots=True)
class DiagnosticEvent:
    diagnostic: Diagnostic
    kind: Literal["diagnostic"] = "diagnostic"


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
