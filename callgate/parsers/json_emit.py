"""Events for the calls of one response: CallStart, ArgumentsDelta, CallEnd, and the
diagnostics that go with them.

Knows: call numbering and ids (native where the model wrote one), that the argument
fragments of a call concatenate to exactly `arguments_json(arguments)`, and that a call to
an undeclared tool is still a candidate plus `unknown_tool`. Does not know: any wire
format's syntax.
"""

from __future__ import annotations

import json

from callgate.parsers.base import CallIdFactory
from callgate.parsers.json_shape import CallShape
from callgate.types import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    Diagnostic,
    DiagnosticEvent,
    Event,
    ToolCallCandidate,
    arguments_json,
)


def quote(text: str, limit: int = 24) -> str:
    """`text` for a diagnostic message: JSON-quoted, cut after `limit` characters."""
    return json.dumps(text if len(text) <= limit else text[:limit] + "...", ensure_ascii=False)


def diagnostic(code: str, expected: str, got: str, span: tuple[int, int]) -> DiagnosticEvent:
    """A diagnostic whose message reads "expected X, got Y at offset N"."""
    return DiagnosticEvent(Diagnostic(code, f"expected {expected}, got {got} at offset {span[0]}", span))


class CallEmitter:
    """Appends the events of each call to a shared event list, in order."""

    __slots__ = ("_call_id", "_call_ids", "_events", "_format", "_index", "_n_calls", "_names", "_sent", "open")

    def __init__(self, format: str, names: frozenset[str] | None, call_ids: CallIdFactory, events: list[Event]) -> None:
        self._format = format
        self._names = names
        self._call_ids = call_ids
        self._events = events
        self._n_calls = 0
        self._index: int | None = None  # the call started and not ended
        self._call_id = ""
        self._sent: list[str] = []
        self.open = False  # a call is started and not ended (a plain field: read per delta)

    def start(self, name: str, native_id: str | None) -> None:
        self._index = self._n_calls
        self._n_calls += 1
        self._call_id = native_id or self._call_ids(self._index)
        self.open = True
        self._sent = []
        self._events.append(CallStart(self._index, self._call_id, name))

    def arguments(self, text: str) -> None:
        """A streamed fragment of the open call's canonical arguments."""
        if self._index is not None and text:
            self._sent.append(text)
            self._events.append(ArgumentsDelta(self._index, text))

    def fragment(self, text: str) -> ArgumentsDelta:
        """Like `arguments`, for a non-empty fragment of the open call, but the event is
        returned instead of appended (the parser's streaming shortcut)."""
        index = self._index
        assert index is not None, "a streamed fragment outside a call"
        self._sent.append(text)
        return ArgumentsDelta(index, text)

    def drop(self) -> None:
        """The open call's block turned out malformed: it gets no CallEnd."""
        self._index = None
        self.open = False
        self._sent = []

    def end(self, shape: CallShape, raw: str, span: tuple[int, int]) -> None:
        """Finish (or start and finish) a well-formed call as a candidate."""
        if self._index is None:
            self.start(shape.name, shape.call_id)
        index = self._index
        assert index is not None
        final = arguments_json(shape.arguments)
        sent = "".join(self._sent)
        self.drop()
        if not final.startswith(sent):  # a scanner bug must never pass as a call
            self._events.append(diagnostic("argument_stream_mismatch", quote(final), quote(sent), span))
            return
        if len(final) > len(sent):
            self._events.append(ArgumentsDelta(index, final[len(sent) :]))
        if self._names is not None and shape.name not in self._names:
            self._events.append(diagnostic("unknown_tool", "a declared tool", quote(shape.name), span))
        candidate = ToolCallCandidate(self._call_id, shape.name, shape.arguments, raw, span, self._format)
        self._events.append(CallEnd(index, candidate))
