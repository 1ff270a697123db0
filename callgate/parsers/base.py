"""What every format's incremental parser shares: the protocol, call ids, and the
builder that turns the event stream into a ParseResult.

Knows: events and results. Does not know: any format's syntax.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

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

CallIdFactory = Callable[[int], str]
Tools = Sequence[Mapping[str, Any]] | None


def random_call_id(index: int) -> str:
    """Default call id: "call_" + 24 random hex digits (index unused, unique per call)."""
    del index
    return "call_" + secrets.token_hex(12)


def sequential_call_ids(prefix: str = "call_") -> CallIdFactory:
    """Deterministic ids (`call_0`, `call_1`, ...), for tests and reproducible runs."""
    return lambda index: f"{prefix}{index}"


def tool_names(tools: Tools) -> frozenset[str] | None:
    """Names declared in an OpenAI tools list; None when no list was given."""
    if tools is None:
        return None
    names: set[str] = set()
    for tool in tools:
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return frozenset(names)


def tool_schemas(tools: Tools) -> dict[str, Mapping[str, Any]]:
    """name -> declared `parameters` schema (an empty object schema when absent)."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, Mapping) else {"type": "object", "properties": {}}
    return out


class StreamParser(Protocol):
    """Per-request incremental parser. `feed` costs amortised O(len(delta)).

    Invariant: for any split of a text into deltas, coalesce(events) and result() are
    identical to those of feeding the whole text at once.
    """

    def feed(self, delta: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...

    def result(self) -> ParseResult: ...


class ResultBuilder:
    """Accumulates events into a ParseResult: parsers call `add` on everything they emit, or
    the method for the one kind of event at hand (`text`, `reasoning`, `candidate`,
    `diagnostic`; CallStart and ArgumentsDelta do not change the result)."""

    __slots__ = ("_candidates", "_content", "_diagnostics", "_reasoning")

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._candidates: list[ToolCallCandidate] = []
        self._diagnostics: list[Diagnostic] = []

    def add(self, events: list[Event]) -> list[Event]:
        for ev in events:
            if isinstance(ev, TextDelta):
                self._content.append(ev.text)
            elif isinstance(ev, ReasoningDelta):
                self._reasoning.append(ev.text)
            elif isinstance(ev, CallEnd):
                self._candidates.append(ev.candidate)
            elif isinstance(ev, DiagnosticEvent):
                self._diagnostics.append(ev.diagnostic)
            elif isinstance(ev, (CallStart, ArgumentsDelta)):
                pass
        return events

    def text(self, text: str) -> None:
        """`add([TextDelta(text)])` without building the event (for a parser's hot path)."""
        self._content.append(text)

    def reasoning(self, text: str) -> None:
        """`add([ReasoningDelta(text)])` without building the event."""
        self._reasoning.append(text)

    def candidate(self, candidate: ToolCallCandidate) -> None:
        """`add([CallEnd(index, candidate)])` without the event."""
        self._candidates.append(candidate)

    def diagnostic(self, diagnostic: Diagnostic) -> None:
        """`add([DiagnosticEvent(diagnostic)])` without the event."""
        self._diagnostics.append(diagnostic)

    def result(self) -> ParseResult:
        content = "".join(self._content)
        reasoning = "".join(self._reasoning)
        return ParseResult(
            content=content or None,
            reasoning=reasoning or None,
            candidates=tuple(self._candidates),
            diagnostics=tuple(self._diagnostics),
        )
