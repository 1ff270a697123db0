"""HTTP routes: /v1/chat/completions, /v1/completions, /v1/quick, /v1/models[/{model}],
/health, /metrics.

Knows: how a route reads its body (bounded), which service call answers it, how a
non-streaming request is cancelled when its client disconnects, and how a stream is
handed to the server with its slot released even if the stream never starts.
Does not know: the chat flow (chat.py), the wire shapes (protocol.py), authentication and
error rendering (app.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from callgate.errors import NotFoundError, PayloadTooLargeError
from callgate.serving.chat import ChatService
from callgate.serving.conform import conform_quick
from callgate.serving.handoff.idempotency import ACTOR_HEADER, resolve_actor
from callgate.serving.metrics import CONTENT_TYPE, Metrics
from callgate.serving.quick.service import Conversation, QuickResult
from callgate.serving.surfaces import anthropic_response, sse
from callgate.serving.surfaces.completions import CompletionService
from callgate.serving.surfaces.protocol import (
    ChatCompletionWire,
    QuickWire,
    models_dict,
    openapi_body,
    parse_chat_request,
    parse_quick_request,
)
from callgate.serving.surfaces.protocol_completions import CompletionWire, parse_completion_request


def build_router(service: ChatService, metrics: Metrics) -> APIRouter:
    settings = service.settings
    created = int(time.time())
    router = APIRouter()
    completions = CompletionService(settings, service.engine, service.admission, metrics)

    @router.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionWire))
    async def chat_completions(request: Request) -> Response:
        body = await _read_body(request, settings.limits.max_body_bytes)
        req = parse_chat_request(body, settings.limits)
        _check_served(req.model, settings.model_name)
        actor = resolve_actor(req.actor, request.headers.get(ACTOR_HEADER), trust_header=settings.trust_actor_header)
        req = dataclasses.replace(req, actor=actor)
        turn = await service.start(req)
        return await reply(
            request, req.stream, lambda: service.stream(turn), lambda: service.complete(turn), turn.close
        )

    @router.post("/v1/completions", openapi_extra=openapi_body(CompletionWire))
    async def text_completions(request: Request) -> Response:
        body = await _read_body(request, settings.limits.max_body_bytes)
        req = parse_completion_request(body, settings.limits)
        _check_served(req.model, settings.model_name)
        job = await completions.start(req)
        return await reply(
            request, req.stream, lambda: completions.stream(job), lambda: completions.complete(job), job.close
        )

    @router.post("/v1/quick", openapi_extra=openapi_body(QuickWire))
    async def quick(request: Request) -> Response:
        body = await _read_body(request, settings.limits.max_body_bytes)
        req = conform_quick(settings.format, parse_quick_request(body, settings.limits))
        _check_served(req.model, settings.model_name)
        conversation = Conversation(req.messages, req.tools, req.thinking, req.reasoning_effort)
        service.admission.acquire()
        try:
            work = service.quick.run(conversation, req.tasks, labels=req.labels)
            result = await _unless_disconnected(request, _as_dict(work))
        finally:
            service.admission.release()
        if result is None:
            return Response(status_code=499)
        return JSONResponse({"object": "callgate.quick", "model": settings.model_name, **result})

    # Both APIs list models at /v1/models; Anthropic's SDKs send `anthropic-version`
    @router.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        if "anthropic-version" in request.headers:
            return JSONResponse(anthropic_response.model_list(settings.model_name, created))
        return JSONResponse(models_dict(settings.model_name, created, service.engine.max_model_len))

    @router.get("/v1/models/{model:path}")  # :path — served names often hold a slash (org/name)
    async def model(model: str, request: Request) -> JSONResponse:
        _check_served(model, settings.model_name)
        if "anthropic-version" in request.headers:
            return JSONResponse(anthropic_response.model_object(settings.model_name, created))
        [entry] = models_dict(settings.model_name, created, service.engine.max_model_len)["data"]
        return JSONResponse(entry)

    @router.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "in_flight": service.admission.in_flight})

    @router.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return router


def _check_served(model: str | None, served: str) -> None:
    """404 `model_not_found` unless `model` is the served model (None: the request named none)."""
    if model is not None and model != served:
        raise NotFoundError(f"model: {model!r} is not served here", param="model", code="model_not_found")


async def _as_dict(work: Awaitable[QuickResult]) -> dict[str, Any]:
    result = await work
    return {"results": result.results(), "usage": result.usage(), "prefix_cache": result.prefix_cache()}


async def _read_body(request: Request, limit_bytes: int) -> bytes:
    """The body, refusing (413) as soon as it is known to exceed `limit_bytes`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {limit_bytes}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLargeError(f"request body exceeds the limit of {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def reply(
    request: Request,
    stream: bool,
    events: Callable[[], AsyncIterator[bytes]],
    complete: Callable[[], Awaitable[dict[str, Any]]],
    close: Callable[[], None],
) -> Response:
    """A started generation's response: its `events` as server-sent events (`close` once
    the stream ends), or the `complete` JSON body (`close` once it is built; 499 when the
    client left first)."""
    if stream:
        return StreamingResponse(events(), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS, background=sse.after(close))
    try:
        result = await _unless_disconnected(request, complete())
    finally:
        close()
    if result is None:
        return Response(status_code=499)
    return JSONResponse(result)


async def _unless_disconnected(request: Request, work: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    """Await `work`, cancelling it if the client disconnects first (then None)."""
    outcome: dict[str, Any] = {}

    async def run(scope: anyio.CancelScope) -> None:
        try:
            outcome["value"] = await work
        except Exception as exc:  # re-raised below, outside the task group
            outcome["error"] = exc
        finally:
            scope.cancel()

    async def watch(scope: anyio.CancelScope) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, tg.cancel_scope)
        tg.start_soon(watch, tg.cancel_scope)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
