"""The ASGI application: `create_app(settings, engine=..., validator=...)`.

Knows: how the parts are wired (engine, validator, chat service, metrics, routes), the
API-key check (`Authorization: Bearer KEY`; Anthropic's `x-api-key: KEY` on its requests), and how
every error reaches the client: as OpenAI's error body, or on Anthropic's requests (/v1/messages...,
and /v1/models from a client sending `anthropic-version`) as Anthropic's, with its retry headers
(anthropic_errors.py).
Does not know: how an engine or validator is built from the CLI (`__main__` does that),
the chat flow, or the wire shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callgate.errors import AuthenticationError, CallgateError, ShuttingDownError
from callgate.serving.chat import ChatFailure, ChatService
from callgate.serving.engines.engine import Engine
from callgate.serving.handoff.validation import JsonSchemaValidator, Validator
from callgate.serving.handoff.validation_http import HttpValidator
from callgate.serving.metrics import Metrics
from callgate.serving.settings import Settings
from callgate.serving.surfaces import anthropic_errors, sse
from callgate.serving.surfaces.anthropic_routes import build_messages_router, is_anthropic
from callgate.serving.surfaces.responses_routes import build_responses_router
from callgate.serving.surfaces.responses_store import ResponseStore
from callgate.serving.surfaces.routes import build_router

log = logging.getLogger("callgate.serving")

_OPEN_PATHS = frozenset({"/health"})


def create_app(settings: Settings, *, engine: Engine, validator: Validator | None = None) -> FastAPI:
    """The server app. `validator` defaults to the HTTP validator at `settings.validator_url`
    when set, else the built-in JSON-Schema validator. The engine is shut down with the app."""
    metrics = Metrics()
    metrics.track_running(engine.num_running)
    service = ChatService(settings, engine, validator or default_validator(settings), metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warming = asyncio.create_task(service.warm_grammars())  # in the background: /health is ready at once
        yield
        warming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await warming
        await engine.shutdown()

    app = FastAPI(title="callgate", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.service = service
    app.include_router(build_router(service, metrics))
    app.state.responses = ResponseStore(settings.responses_store_max, settings.responses_store_max_bytes)
    app.include_router(build_responses_router(service, app.state.responses))
    app.include_router(build_messages_router(service))
    _install_error_handlers(app)
    app.add_middleware(_Gate, api_key=settings.api_key, metrics=metrics)
    return app


def default_validator(settings: Settings) -> Validator:
    """HttpValidator(url) with --validator-url, else the built-in JsonSchemaValidator."""
    if settings.validator_url:
        return HttpValidator(settings.validator_url, timeout_s=settings.validator_timeout_s)
    return JsonSchemaValidator()


class _Gate:
    """Pure ASGI middleware: the API-key check (constant time) and request counting. Pure
    ASGI rather than BaseHTTPMiddleware, so streamed chunks pass through untouched."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, metrics: Metrics) -> None:
        self._app = app
        self._expected = api_key.encode() if api_key else None
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        route = _route_label(scope["path"])
        if self._expected is not None and scope["path"] not in _OPEN_PATHS and not self._authorised(scope):
            err = AuthenticationError("missing or invalid API key", code="invalid_api_key")
            await _error(err, scope)(scope, receive, send)
            self._metrics.request(route, 401)
            return
        status = 500
        started = streaming = False

        async def send_counted(message: Message) -> None:
            nonlocal status, started, streaming
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                streaming = (b"content-type", sse.MEDIA_TYPE.encode()) in {
                    (k.lower(), v.split(b";")[0]) for k, v in message.get("headers", [])
                }
            await send(message)

        try:
            await self._app(scope, receive, send_counted)
        except asyncio.CancelledError:
            # Only uvicorn cancels a request task: the server is stopping and its grace period
            # is over. The client gets a clear ending instead of a bare 500 or a cut stream.
            status = 503 if not started else status
            await _shutting_down(send, started, streaming, scope)
        finally:
            self._metrics.request(route, status)

    def _authorised(self, scope: Scope) -> bool:
        """`Authorization: Bearer KEY`, the scheme in any case (RFC 9110 section 11.1); on
        the Anthropic paths `x-api-key: KEY` instead where sent, as Anthropic's clients do."""
        assert self._expected is not None
        headers = dict(scope["headers"])
        if b"x-api-key" in headers and is_anthropic(scope):
            return hmac.compare_digest(headers[b"x-api-key"], self._expected)
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        matches = hmac.compare_digest(key, self._expected)  # always: constant time whatever was sent
        return matches and scheme.lower() == b"bearer"


async def _shutting_down(send: Send, started: bool, streaming: bool, scope: Scope) -> None:
    """End a request cancelled by the server's shutdown: a 503 error, or (a stream already
    under way) a terminal SSE error event and `[DONE]`."""
    err = ShuttingDownError()
    if started:
        if not streaming:
            body = b""
        elif is_anthropic(scope):
            body = sse.named_event("error", anthropic_errors.error_body(err))
        else:
            body = sse.error_event(err.to_body()) + sse.DONE
        await send({"type": "http.response.body", "body": body})
        return
    response = _error(err, scope)
    await send({"type": "http.response.start", "status": 503, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def _install_error_handlers(app: FastAPI) -> None:
    async def callgate_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CallgateError)
        return _error(exc, request.scope)

    async def chat_failure(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ChatFailure)
        if is_anthropic(request.scope):
            return _error(exc.error, request.scope, exc.callgate)
        return JSONResponse(exc.body(), status_code=exc.error.status, headers=exc.error.headers())

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(CallgateError.for_status(exc.status_code, str(exc.detail)), request.scope)

    async def client_gone(request: Request, exc: Exception) -> Response:
        # the client closed its connection before its body arrived: nothing failed here,
        # and nobody reads the answer; counted 499, as a client that leaves later is
        log.info("client disconnected while sending its request to %s", request.url.path)
        return Response(status_code=499)

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return _error(CallgateError("internal server error", code="internal_error"), request.scope)

    app.add_exception_handler(CallgateError, callgate_error)
    app.add_exception_handler(ChatFailure, chat_failure)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(Exception, unexpected)


def _error(exc: CallgateError, scope: Scope, callgate: Mapping[str, Any] | None = None) -> JSONResponse:
    """The surface's error body (Anthropic's on its requests, else OpenAI's), with the
    headers that say whether a retry can help (errors.py)."""
    if is_anthropic(scope):
        body = anthropic_errors.error_body(exc, callgate)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers() or anthropic_errors.retry_headers(exc))
    return JSONResponse(exc.to_body(), status_code=exc.status, headers=exc.headers())


_ROUTE_LABELS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/quick",
        "/v1/models",
        "/health",
        "/metrics",
    }
)


def _route_label(path: str) -> str:
    """The metrics label of `path`: a route of the app, else "other" (a closed set, so unknown
    paths cannot grow the series without bound)."""
    if path in _ROUTE_LABELS:
        return path
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"
