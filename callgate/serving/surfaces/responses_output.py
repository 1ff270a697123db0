"""One turn's events (turn_events.py) -> OpenAI Responses output: the stream's events, each
with its `sequence_number`, and the `response` object they add up to.

Knows: the Responses shapes — output items in the order the model wrote them (`reasoning`
with `reasoning_text` content, `message` with one `output_text` part, one `function_call`
per accepted call: `id` fc_..., `call_id`, `name`, `arguments`, `status`), the event
sequence (`response.created`, `response.in_progress`, per item `output_item.added`, its
content part's `added` / text `delta`s / `done`, `function_call_arguments.delta` / `.done`,
`output_item.done`, then `response.completed` / `response.incomplete`, or an `error` event
then `response.failed`), `status` / `incomplete_details` (`max_output_tokens` when the
output was cut) and usage. Does not know: how a turn runs, HTTP, SSE framing, the store.

A repair round's text was already streamed and stays in the stream's output (a stream
cannot take text back); a non-streaming response (`render_response`) holds only the final
round, which TurnDone carries. Both are rendered by the same `ResponseRender`, so the
items of the two agree. A turn that wrote nothing gets one empty message, as OpenAI's do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from callgate.serving.surfaces.responses_input import new_id
from callgate.serving.turn_events import (
    AcceptedCall,
    CallsAccepted,
    ContentDelta,
    Prefilled,
    ReasoningDelta,
    RoundStart,
    TurnDone,
    TurnEvent,
    TurnUsage,
)

Event = dict[str, Any]
TokenCounter = Callable[[str], int]


@dataclass(slots=True)
class _OpenItem:
    index: int
    kind: Literal["message", "reasoning"]
    item_id: str
    text: list[str] = field(default_factory=list)


class ResponseRender:
    """The state of one response being rendered. `skeleton` holds the fixed fields of the
    response object (id, created_at, model and the request fields it repeats); `callgate`
    is merged into the turn's `callgate` block; `count_tokens` counts the reasoning tokens
    of the usage (None: 0)."""

    def __init__(
        self,
        skeleton: Mapping[str, Any],
        *,
        callgate: Mapping[str, Any] | None = None,
        count_tokens: TokenCounter | None = None,
    ) -> None:
        self._skeleton = dict(skeleton)
        self._callgate_extra = dict(callgate or {})
        self._count_tokens = count_tokens
        self._seq = 0
        self._open: _OpenItem | None = None
        self._round_start = 0  # index in `items` of the current round's first item
        self.items: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self.callgate: dict[str, Any] = dict(self._callgate_extra)

    # ---- the response object -----------------------------------------------------------

    def response(self) -> dict[str, Any]:
        """The response object as it stands (items in progress included)."""
        out: dict[str, Any] = {
            **self._skeleton,
            "object": "response",
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            "output": [dict(i) for i in self.items],
            "usage": self.usage,
        }
        if self.status != "in_progress":
            out["callgate"] = self.callgate
        return out

    # ---- events ------------------------------------------------------------------------

    def opening(self) -> list[Event]:
        """`response.created` and `response.in_progress`."""
        return [self._event("response.created", response=self.response()), self._in_progress()]

    def _in_progress(self) -> Event:
        return self._event("response.in_progress", response=self.response())

    def feed(self, ev: TurnEvent) -> list[Event]:
        """The stream events of one turn event."""
        if isinstance(ev, RoundStart):
            out = self._close()
            self._round_start = len(self.items)
            return out
        if isinstance(ev, Prefilled):
            return []
        if isinstance(ev, ContentDelta):
            return self._text("message", ev.text)
        if isinstance(ev, ReasoningDelta):
            return self._text("reasoning", ev.text)
        if isinstance(ev, CallsAccepted):
            out = self._close()
            for call in ev.calls:
                out += self._call(call)
            return out
        return self._done(ev)

    def failed(self, code: str | None, message: str, param: str | None, callgate: Mapping[str, Any]) -> list[Event]:
        """An `error` event, then `response.failed` (as OpenAI ends a stream that fails)."""
        error = self._event("error", code=code, message=message, param=param)
        if self._open is not None:
            self.items[self._open.index]["status"] = "incomplete"
            self._open = None
        self.status = "failed"
        self.error = {"code": code or "server_error", "message": message}
        self.callgate = {**callgate, **self._callgate_extra}
        return [error, self._event("response.failed", response=self.response())]

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _text(self, kind: Literal["message", "reasoning"], text: str) -> list[Event]:
        if not text:
            return []
        out: list[Event] = []
        if self._open is None or self._open.kind != kind:
            out += self._close()
            out += self._start(kind)
        assert self._open is not None
        self._open.text.append(text)
        delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return [
            *out,
            self._event(
                delta, item_id=self._open.item_id, output_index=self._open.index, content_index=0, delta=text, **extra
            ),
        ]

    def _start(self, kind: Literal["message", "reasoning"]) -> list[Event]:
        item_id = new_id("msg_" if kind == "message" else "rs_")
        self._open = _OpenItem(len(self.items), kind, item_id)
        if kind == "message":
            item: dict[str, Any] = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        else:
            item = {"id": item_id, "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
        self.items.append(item)
        where = {"item_id": item_id, "output_index": self._open.index, "content_index": 0}
        return [
            self._event("response.output_item.added", output_index=self._open.index, item=dict(item)),
            self._event("response.content_part.added", **where, part=_part(kind, "")),
        ]

    def _close(self, status: str = "completed") -> list[Event]:
        """Finish the item being written, if any."""
        if self._open is None:
            return []
        item_open, self._open = self._open, None
        text = "".join(item_open.text)
        item = self.items[item_open.index]
        part = _part(item_open.kind, text)
        item.update(status=status, content=[part])
        where = {"item_id": item_open.item_id, "output_index": item_open.index, "content_index": 0}
        done = "response.output_text.done" if item_open.kind == "message" else "response.reasoning_text.done"
        extra: dict[str, Any] = {"logprobs": []} if item_open.kind == "message" else {}
        return [
            self._event(done, **where, text=text, **extra),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=item_open.index, item=dict(item)),
        ]

    def _call(self, call: AcceptedCall) -> list[Event]:
        index = len(self.items)
        item: dict[str, Any] = {
            "id": new_id("fc_"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": "",
        }
        added = self._event("response.output_item.added", output_index=index, item=dict(item))
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": index}
        delta = self._event("response.function_call_arguments.delta", **where, delta=call.arguments)
        args_done = self._event(
            "response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments
        )
        item.update(status="completed", arguments=call.arguments)
        return [added, delta, args_done, self._event("response.output_item.done", output_index=index, item=dict(item))]

    def _done(self, done: TurnDone) -> list[Event]:
        cut = done.finish_reason == "length"
        out = self._close("incomplete" if cut else "completed")
        if len(self.items) == self._round_start:  # the final round wrote nothing
            out += self._start("message")
            out += self._close("incomplete" if cut else "completed")
        self.status = "incomplete" if cut else "completed"
        self.incomplete_details = {"reason": "max_output_tokens"} if cut else None
        self.usage = usage_dict(done.usage, self._reasoning_tokens(done))
        self.callgate = {**done.callgate, **self._callgate_extra}
        terminal = "response.incomplete" if cut else "response.completed"
        return [*out, self._event(terminal, response=self.response())]

    def _reasoning_tokens(self, done: TurnDone) -> int:
        if not done.reasoning or self._count_tokens is None:
            return 0
        return min(done.usage.completion_tokens, self._count_tokens(done.reasoning))


def _part(kind: Literal["message", "reasoning"], text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


def usage_dict(usage: TurnUsage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def render_response(
    skeleton: Mapping[str, Any],
    done: TurnDone,
    *,
    callgate: Mapping[str, Any] | None = None,
    count_tokens: TokenCounter | None = None,
) -> dict[str, Any]:
    """The non-streaming response object of a turn: its final round, as TurnDone carries it."""
    render = ResponseRender(skeleton, callgate=callgate, count_tokens=count_tokens)
    events: list[TurnEvent] = [RoundStart(0)]
    if done.reasoning:
        events.append(ReasoningDelta(done.reasoning, 0))
    if done.content:
        events.append(ContentDelta(done.content, 0))
    if done.calls:
        events.append(CallsAccepted(0, done.calls))
    for ev in [*events, done]:
        render.feed(ev)
    return render.response()
