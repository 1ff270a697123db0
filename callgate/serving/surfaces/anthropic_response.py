"""The Anthropic Messages renderer: one turn's events (turn_events.py) -> a `message`
object, or its SSE stream.

Knows: Anthropic's shapes — content blocks in the order the model wrote them (thinking,
text, tool_use with `toolu_` ids and the arguments as `input`), `stop_reason` (end_turn,
tool_use, max_tokens, stop_sequence) and `stop_sequence`, usage (input_tokens without the
prefix-cache hits, cache_read_input_tokens, output_tokens) — and its stream: message_start,
ping, per block content_block_start / content_block_delta (text_delta, thinking_delta,
input_json_delta) / content_block_stop, message_delta (stop_reason, usage, callgate's block),
message_stop; a failure under way is an `error` event and ends the stream. A repair round's
text opens new blocks (a stream cannot take back what it sent; the message shows only the
final round's). Does not know: how a turn runs, HTTP.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from callgate.errors import CallgateError
from callgate.serving.surfaces import sse
from callgate.serving.surfaces.anthropic_errors import error_body
from callgate.serving.surfaces.anthropic_request import tool_use_id
from callgate.serving.turn import ChatFailure, Turn
from callgate.serving.turn_events import (
    CallsAccepted,
    ContentDelta,
    Prefilled,
    ReasoningDelta,
    RoundStart,
    TurnDone,
    TurnEvent,
    TurnUsage,
)

log = logging.getLogger("callgate.anthropic")


def message_id(turn: Turn) -> str:
    return "msg_" + turn.completion_id.removeprefix("chatcmpl-")


def stop_reason(done: TurnDone) -> str:
    if done.finish_reason == "length":
        return "max_tokens"
    if done.calls:
        return "tool_use"
    return "stop_sequence" if done.stop_sequence is not None else "end_turn"


def usage_dict(usage: TurnUsage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


async def message(
    turn: Turn, events: AsyncGenerator[TurnEvent, None], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The non-streaming `message`; `extra` joins its `callgate` block. Raises ChatFailure / CallgateError."""
    async with contextlib.aclosing(events) as evs:
        async for ev in evs:
            if isinstance(ev, TurnDone):
                return _message(turn, ev, extra or {})
    raise AssertionError("a turn ends with TurnDone or raises")


def _message(turn: Turn, done: TurnDone, extra: Mapping[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
    if done.content:
        content.append({"type": "text", "text": done.content})
    for call in done.calls:
        content.append(
            {"type": "tool_use", "id": tool_use_id(call.call_id), "name": call.name, "input": _input(call.arguments)}
        )
    return {
        **_head(turn, content),
        "stop_reason": stop_reason(done),
        "stop_sequence": done.stop_sequence,
        "usage": usage_dict(done.usage),
        "callgate": {**done.callgate, **extra},
    }


def model_list(model: str, created: int) -> dict[str, Any]:
    """GET /v1/models as Anthropic's API lists models (one page)."""
    return {"data": [model_object(model, created)], "has_more": False, "first_id": model, "last_id": model}


def model_object(model: str, created: int) -> dict[str, Any]:
    """One model as Anthropic's API describes it (`created_at` in RFC 3339)."""
    at = datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": model, "display_name": model, "created_at": at}


def _head(turn: Turn, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": message_id(turn), "type": "message", "role": "assistant", "model": turn.model, "content": content}


def _input(arguments: str) -> dict[str, Any]:
    value = json.loads(arguments)
    return value if isinstance(value, dict) else {}


async def stream(
    turn: Turn, events: AsyncGenerator[TurnEvent, None], extra: Mapping[str, Any] | None = None
) -> AsyncGenerator[bytes, None]:
    """Anthropic SSE bytes of a streamed message (`extra` joins the `callgate` block of its
    message_delta); a failure ends it with an `error` event. Closing the generator early
    closes `events` (which aborts the generation)."""
    blocks = _Blocks(extra or {})
    started = False
    try:
        async with contextlib.aclosing(events) as evs:
            async for ev in evs:
                if not started and not isinstance(ev, RoundStart):  # Prefilled, unless the engine wrote nothing
                    # once the engine has read the prompt, as Anthropic's: its usage splits the
                    # input into uncached and prefix-cache reads as message_delta's will
                    started = True
                    yield _event("message_start", {"type": "message_start", "message": _start(turn, ev)})
                    yield _event("ping", {"type": "ping"})
                for name, payload in blocks.render(ev):
                    yield _event(name, payload)
    except ChatFailure as exc:
        yield _event("error", error_body(exc.error, exc.callgate))
    except CallgateError as exc:
        yield _event("error", error_body(exc))
    except Exception:  # headers are sent: the client still gets an error event
        log.exception("stream %s failed", turn.completion_id)
        yield _event("error", error_body(CallgateError("internal server error", code="internal_error")))
    finally:
        turn.close()


def _start(turn: Turn, ev: TurnEvent) -> dict[str, Any]:
    """message_start's message: no content yet; the usage known at `ev` (a Prefilled's; the
    turn's so far when the engine wrote nothing and `ev` is its TurnDone)."""
    usage = ev.usage if isinstance(ev, Prefilled) else turn.usage
    return {**_head(turn, []), "stop_reason": None, "stop_sequence": None, "usage": usage_dict(usage)}


class _Blocks:
    """The content blocks of one stream: which is open, the next index."""

    def __init__(self, extra: Mapping[str, Any]) -> None:
        self._open: str | None = None  # "text" or "thinking"
        self._index = 0
        self._extra = extra

    def render(self, ev: TurnEvent) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(ev, ContentDelta | ReasoningDelta):
            kind = "text" if isinstance(ev, ContentDelta) else "thinking"
            out = [] if self._open == kind else [*self._close(), self._start(kind)]
            delta = (
                {"type": "text_delta", "text": ev.text}
                if kind == "text"
                else {"type": "thinking_delta", "thinking": ev.text}
            )
            return [
                *out,
                ("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}),
            ]
        if isinstance(ev, RoundStart):
            return self._close()
        if isinstance(ev, CallsAccepted):
            out = self._close()
            for call in ev.calls:
                block = {"type": "tool_use", "id": tool_use_id(call.call_id), "name": call.name, "input": {}}
                out.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": self._index, "content_block": block},
                    )
                )
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                out.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})
                )
                out.append(("content_block_stop", {"type": "content_block_stop", "index": self._index}))
                self._index += 1
            return out
        if isinstance(ev, TurnDone):
            done: dict[str, Any] = {"stop_reason": stop_reason(ev), "stop_sequence": ev.stop_sequence}
            end = {
                "type": "message_delta",
                "delta": done,
                "usage": usage_dict(ev.usage),
                "callgate": {**ev.callgate, **self._extra},
            }
            return [*self._close(), ("message_delta", end), ("message_stop", {"type": "message_stop"})]
        return []

    def _start(self, kind: str) -> tuple[str, dict[str, Any]]:
        self._open = kind
        block = (
            {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
        )
        return "content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block}

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        self._open = None
        self._index += 1
        return [("content_block_stop", {"type": "content_block_stop", "index": self._index - 1})]


def _event(name: str, payload: Mapping[str, Any]) -> bytes:
    return sse.named_event(name, payload)
