"""The chat-completions renderer: one turn's events (turn_events.py) -> OpenAI's
chat.completion object or its SSE stream of chat.completion.chunk events.

Knows: the order and shape of OpenAI's chunks (role first, text deltas as generated, each
accepted call as a head chunk then an arguments chunk, the finish chunk with the `callgate`
block, the usage chunk when asked for, `[DONE]`) and that errors under way become a terminal
`error` event. Does not know: how a turn runs (chat.py) or HTTP.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from callgate.errors import CallgateError
from callgate.serving.surfaces import sse
from callgate.serving.surfaces.protocol import chunk_dict, completion_dict, tool_call_dict, usage_dict
from callgate.serving.turn import ChatFailure, Turn
from callgate.serving.turn_events import (
    AcceptedCall,
    CallsAccepted,
    ContentDelta,
    ReasoningDelta,
    TurnDone,
    TurnEvent,
    TurnUsage,
)

log = logging.getLogger("callgate.chat")


async def completion(turn: Turn, events: AsyncGenerator[TurnEvent, None]) -> dict[str, Any]:
    """The non-streaming response: the final round's message. Raises ChatFailure / CallgateError."""
    async with contextlib.aclosing(events) as evs:
        async for ev in evs:
            if isinstance(ev, TurnDone):
                return _completion(turn, ev)
    raise AssertionError("a turn ends with TurnDone or raises")


async def stream(turn: Turn, events: AsyncGenerator[TurnEvent, None]) -> AsyncGenerator[bytes, None]:
    """SSE bytes of a streamed response, ending with `[DONE]`; errors become a terminal
    `error` event. Closing the generator early closes `events` (which aborts the generation)."""
    try:
        yield sse.data_event(_chunk(turn, {"role": "assistant", "content": ""}))
        async with contextlib.aclosing(events) as evs:
            async for ev in evs:
                for chunk in _chunks(turn, ev):
                    yield sse.data_event(chunk)
    except ChatFailure as exc:
        yield sse.error_event(exc.body())
    except CallgateError as exc:
        yield sse.error_event(exc.to_body())
    except Exception:  # headers are sent: the client still gets an error event and [DONE]
        log.exception("stream %s failed", turn.completion_id)
        yield sse.error_event(CallgateError("internal server error", code="internal_error").to_body())
    finally:
        turn.close()
    yield sse.DONE


def _chunks(turn: Turn, ev: TurnEvent) -> list[dict[str, Any]]:
    if isinstance(ev, ContentDelta):
        return [_chunk(turn, {"content": ev.text})] if ev.text else []
    if isinstance(ev, ReasoningDelta):
        return [_chunk(turn, {"reasoning_content": ev.text})] if ev.text else []
    if isinstance(ev, CallsAccepted):
        out: list[dict[str, Any]] = []
        for i, call in enumerate(ev.calls):
            head = {
                "index": i,
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            out.append(_chunk(turn, {"tool_calls": [head]}))
            out.append(_chunk(turn, {"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}))
        return out
    if isinstance(ev, TurnDone):
        out = [_chunk(turn, {}, finish_reason=ev.finish_reason, callgate=ev.callgate)]
        if turn.req.include_usage:
            out.append(_chunk(turn, None, usage=_usage(ev.usage)))
        return out
    return []  # RoundStart, Prefilled: nothing on this wire


def _completion(turn: Turn, done: TurnDone) -> dict[str, Any]:
    calls = [_call(c) for c in done.calls]
    message: dict[str, Any] = {"role": "assistant", "content": done.content or (None if calls else "")}
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    if calls:
        message["tool_calls"] = calls
    return completion_dict(
        completion_id=turn.completion_id,
        created=turn.created,
        model=turn.model,
        message=message,
        finish_reason=done.finish_reason,
        usage=_usage(done.usage),
        callgate=done.callgate,
    )


def _call(call: AcceptedCall) -> dict[str, Any]:
    return tool_call_dict(call.call_id, call.name, call.arguments)


def _usage(usage: TurnUsage) -> dict[str, Any]:
    return usage_dict(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def _chunk(
    turn: Turn,
    delta: Mapping[str, Any] | None,
    *,
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    callgate: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return chunk_dict(
        completion_id=turn.completion_id,
        created=turn.created,
        model=turn.model,
        delta=delta,
        finish_reason=finish_reason,
        usage=usage,
        callgate=callgate,
    )
