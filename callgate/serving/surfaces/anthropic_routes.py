"""HTTP routes of the Anthropic surface: `POST /v1/messages` and
`POST /v1/messages/count_tokens` (Claude Code posts them with `?beta=true` and the
`anthropic-version` / `anthropic-beta` headers, all accepted and not needed).

Knows: which translator and renderer answer each route (anthropic_request.py,
anthropic_response.py) around the one chat service, and the body, model, disconnect and
slot handling it shares with chat completions (routes.py). Does not know: the chat flow,
the error shape (app.py renders errors on these paths with anthropic_errors.py).
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import Scope

from callgate.serving.chat import ChatService
from callgate.serving.conform import conform_chat
from callgate.serving.prompt import build_prompt
from callgate.serving.surfaces import anthropic_response
from callgate.serving.surfaces.anthropic_request import parse_count_tokens_request, parse_messages_request
from callgate.serving.surfaces.anthropic_wire import CountTokensWire, MessagesWire
from callgate.serving.surfaces.protocol import openapi_body
from callgate.serving.surfaces.routes import _check_served, _read_body, reply

PATH_PREFIX = "/v1/messages"


def is_anthropic_path(path: str) -> bool:
    """Whether `path` is on the Anthropic surface (its errors take Anthropic's shape)."""
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def is_anthropic(scope: Scope) -> bool:
    """Whether a request is on the Anthropic surface: its paths, or /v1/models[/{id}] (a path
    both APIs share) from a client that sends `anthropic-version`, as Anthropic's SDKs do."""
    path = scope["path"]
    if is_anthropic_path(path):
        return True
    return (path == "/v1/models" or path.startswith("/v1/models/")) and "anthropic-version" in Headers(scope=scope)


def build_messages_router(service: ChatService) -> APIRouter:
    settings = service.settings
    router = APIRouter()

    @router.post(PATH_PREFIX, openapi_extra=openapi_body(MessagesWire))
    async def messages(request: Request) -> Response:
        body = await _read_body(request, settings.limits.max_body_bytes)
        parsed = parse_messages_request(body, settings.limits, settings.format)
        req = parsed.chat
        _check_served(req.model, settings.model_name)
        extra = {"ignored_tools": list(parsed.ignored_tools)} if parsed.ignored_tools else None
        turn = await service.start(req)
        return await reply(
            request,
            req.stream,
            lambda: anthropic_response.stream(turn, service.events(turn), extra),
            lambda: anthropic_response.message(turn, service.events(turn), extra),
            turn.close,
        )

    @router.post(PATH_PREFIX + "/count_tokens", openapi_extra=openapi_body(CountTokensWire))
    async def count_tokens(request: Request) -> JSONResponse:
        """The tokens of the prompt the request renders to (system, tools and messages, as
        the served format writes them); 400 where a /v1/messages request would get one."""
        body = await _read_body(request, settings.limits.max_body_bytes)
        req = conform_chat(settings.format, parse_count_tokens_request(body, settings.limits, settings.format))
        _check_served(req.model, settings.model_name)
        prompt = await anyio.to_thread.run_sync(  # tokenising is CPU work: off the event loop
            build_prompt,
            settings.format,
            req,
            req.messages,
            service.engine.tokenizer,
            service.engine.max_model_len,
            settings.limits.default_max_tokens,
        )
        return JSONResponse({"input_tokens": len(prompt.ids)})

    return router
