"""HTTP routes of the OpenAI Responses surface: `POST /v1/responses` (answered or streamed),
`GET` / `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.

Knows: the order of work of one request — parse (responses_request.py), the conversation
of `previous_response_id` from the store (404 `previous_response_not_found` when it is
unknown or evicted), the internal turn (ChatService.start / events), its rendering
(responses_output.py), the stream's SSE framing (`event: <type>` + `data:`, no `[DONE]`,
as OpenAI's Responses streams end), and keeping the response (`store`, default true) once
it completed or came back incomplete. Errors before a stream starts are OpenAI error
bodies (app.py) naming the Responses field; errors under way are an `error` event and
`response.failed`. Does not know: the turn's flow, the wire shapes, templates, parsers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from callgate.errors import CallgateError, InvalidRequestError, NotFoundError
from callgate.serving.chat import ChatService
from callgate.serving.surfaces import sse
from callgate.serving.surfaces.protocol_wire import openapi_body
from callgate.serving.surfaces.responses_input import Item, new_id
from callgate.serving.surfaces.responses_output import Event, ResponseRender, render_response
from callgate.serving.surfaces.responses_request import ResponsesRequest, parse_responses_request
from callgate.serving.surfaces.responses_store import ResponseStore, StoredResponse
from callgate.serving.surfaces.responses_wire import ResponsesWire
from callgate.serving.surfaces.routes import _check_served, _read_body, _unless_disconnected
from callgate.serving.turn import ChatFailure, Turn
from callgate.serving.turn_events import TurnDone

log = logging.getLogger("callgate.responses")

# Chat's names of the fields a Responses request maps onto, as the Responses surface names them.
_FIELDS = (
    ("reasoning_effort", "reasoning.effort"),
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


def build_responses_router(service: ChatService, store: ResponseStore) -> APIRouter:
    settings = service.settings
    router = APIRouter()

    @router.post("/v1/responses", openapi_extra=openapi_body(ResponsesWire))
    async def create(request: Request) -> Response:
        body = await _read_body(request, settings.limits.max_body_bytes)
        req = parse_responses_request(body, settings.limits)
        _check_served(req.model, settings.model_name)
        history = _history(store, req.previous_response_id)
        try:
            turn = await service.start(req.chat_request(history, settings.limits))
        except InvalidRequestError as exc:
            raise _as_responses_field(exc) from None
        tokenizer = service.engine.tokenizer
        options: dict[str, Any] = {
            "callgate": {"ignored_tools": [dict(t) for t in req.ignored_tools]},
            "count_tokens": lambda text: len(tokenizer.encode(text)),
        }
        skeleton = _skeleton(req, settings.model_name)
        if req.stream:
            stream = _stream(service, turn, ResponseRender(skeleton, **options), req, store, history)
            return StreamingResponse(
                stream, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS, background=sse.after(turn.close)
            )
        try:
            result = await _unless_disconnected(request, _answer(service, turn, skeleton, options))
        except ChatFailure as exc:
            exc.callgate["ignored_tools"] = [dict(t) for t in req.ignored_tools]
            raise
        finally:
            turn.close()
        if result is None:
            return Response(status_code=499)
        if req.store:
            store.put(result, history, req.input_items, result["output"])
        return JSONResponse(result)

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> JSONResponse:
        return JSONResponse(dict(_stored(store, response_id).response))

    @router.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> JSONResponse:
        if not store.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @router.get("/v1/responses/{response_id}/input_items")
    async def input_items(request: Request, response_id: str) -> JSONResponse:
        limit, order, after = _page_params(request)
        items = list(_stored(store, response_id).input_items)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [i.get("id") for i in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = [dict(i) for i in items[:limit]]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    return router


def _page_params(request: Request) -> tuple[int, str, str | None]:
    """`limit` (1..100, default 20), `order` (`asc` / `desc`, default `desc`) and `after`,
    read here so a bad value is a 400 in OpenAI's shape (not FastAPI's 422)."""
    query = request.query_params
    raw_limit = query.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
        raise InvalidRequestError("limit: must be an integer between 1 and 100", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order: must be 'asc' or 'desc'", param="order")
    return int(raw_limit), order, query.get("after")


def _history(store: ResponseStore, previous_id: str | None) -> tuple[Item, ...]:
    if previous_id is None:
        return ()
    entry = store.get(previous_id)
    if entry is None:
        raise NotFoundError(
            f"Previous response with id '{previous_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return entry.conversation()


def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    entry = store.get(response_id)
    if entry is None:
        raise _not_found(response_id)
    return entry


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


def _as_responses_field(exc: InvalidRequestError) -> InvalidRequestError:
    """A 400 of the internal turn naming a chat field, renamed to the Responses field."""
    for chat, responses in _FIELDS:
        if exc.param and exc.param.split(".")[0].split("[")[0] == chat:
            message = exc.message.replace(exc.param, responses) if exc.message.startswith(exc.param) else exc.message
            renamed = type(exc)(message, param=responses, code=exc.code)
            renamed.status = exc.status
            return renamed
    return exc


def _skeleton(req: ResponsesRequest, model: str) -> dict[str, Any]:
    return {"id": new_id("resp_"), "created_at": int(time.time()), "model": model, **req.echo}


async def _answer(service: ChatService, turn: Turn, skeleton: Mapping[str, Any], options: Any) -> dict[str, Any]:
    """The non-streaming response object: the turn's final round."""
    async with contextlib.aclosing(service.events(turn)) as events:
        async for ev in events:
            if isinstance(ev, TurnDone):
                return render_response(skeleton, ev, **options)
    raise AssertionError("a turn ends with TurnDone or raises")


async def _stream(
    service: ChatService,
    turn: Turn,
    render: ResponseRender,
    req: ResponsesRequest,
    store: ResponseStore,
    history: tuple[Item, ...],
) -> AsyncGenerator[bytes, None]:
    """The SSE bytes of a streamed response; closing it early aborts the generation."""
    try:
        for event in render.opening():
            yield _sse(event)
        async with contextlib.aclosing(service.events(turn)) as events:
            async for ev in events:
                for event in render.feed(ev):
                    yield _sse(event)
        if req.store:
            response = render.response()
            store.put(response, history, req.input_items, response["output"])
    except ChatFailure as exc:
        for event in _failed(render, exc.error, exc.callgate):
            yield _sse(event)
    except CallgateError as exc:
        for event in _failed(render, exc, {}):
            yield _sse(event)
    except Exception:  # headers are sent: the client still gets an error event and response.failed
        log.exception("stream %s failed", render.response()["id"])
        for event in _failed(render, CallgateError("internal server error", code="internal_error"), {}):
            yield _sse(event)
    finally:
        turn.close()


def _failed(render: ResponseRender, error: CallgateError, callgate: Mapping[str, Any]) -> list[Event]:
    return render.failed(error.code or error.error_type, error.message, error.param, callgate)


def _sse(event: Mapping[str, Any]) -> bytes:
    """One named event: `event: <type>` and its JSON on one `data:` line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + data + b"\n\n"
