"""Errors say whether a retry can help: `x-should-retry: false` on errors the same request
meets again (4xx but 408/409/429, 502 model_output_error, 422 tool_call_rejected),
`x-should-retry: true` and `Retry-After` on those that pass (429, the 503s). Checked on the
error classes, and with the official `openai` client (its default retries on) against the
real server on the FakeEngine, counting the requests the server saw in /metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from callgate import errors
from tests import test_server_openai
from tests.test_server_app import ASK, MODEL, WEATHER, call_text
from tests.test_server_openai import Server, requests_seen

serve = test_server_openai.serve  # the real-server fixture

FINAL: list[tuple[errors.CallgateError, int]] = [
    (errors.InvalidRequestError("bad"), 400),
    (errors.TemplateError("bad"), 400),
    (errors.SchemaTooComplexError("bad"), 400),
    (errors.PayloadTooLargeError("big"), 413),
    (errors.AuthenticationError("who"), 401),
    (errors.NotFoundError("where"), 404),
    (errors.ModelOutputError("broken"), 502),
    (errors.ToolCallRejectedError("no"), 422),
]
PASSING: list[tuple[errors.CallgateError, int]] = [
    (errors.RateLimitError("busy"), 429),
    (errors.ValidatorUnavailableError("down"), 503),
    (errors.CompilerBusyError("busy"), 503),
    (errors.ShuttingDownError(), 503),
]


@pytest.mark.parametrize(("err", "status"), FINAL, ids=lambda e: type(e).__name__ if isinstance(e, Exception) else "")
def test_errors_a_retry_cannot_fix_say_so(err: errors.CallgateError, status: int) -> None:
    assert err.status == status and err.headers() == {"x-should-retry": "false"}


@pytest.mark.parametrize(("err", "status"), PASSING, ids=lambda e: type(e).__name__ if isinstance(e, Exception) else "")
def test_errors_that_pass_say_when_to_retry(err: errors.CallgateError, status: int) -> None:
    assert err.status == status and err.headers() == {"x-should-retry": "true", "Retry-After": "1"}


def test_framework_statuses_and_unknown_failures() -> None:
    assert errors.CallgateError.for_status(404, "Not Found").headers() == {"x-should-retry": "false"}
    assert errors.CallgateError.for_status(405, "Method Not Allowed").headers() == {"x-should-retry": "false"}
    assert errors.CallgateError.for_status(409, "Conflict").headers() == {"x-should-retry": "true"}
    assert errors.EngineError("engine died").headers() == {}  # unknown: the client's own rules decide
    assert errors.CallgateError("internal server error").headers() == {}


def retrying_client(server: Server) -> Any:
    """The official client with its default retry policy (2 retries)."""
    client: Any = server.client(max_retries=openai.DEFAULT_MAX_RETRIES)
    return client


def test_the_client_does_not_retry_a_502(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: '<tool_call>\n{"name": "get_weather", "arguments": {"city"', max_repairs=0)
    with pytest.raises(openai.APIStatusError) as info:
        retrying_client(server).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0)
    assert info.value.status_code == 502 and info.value.response.headers["x-should-retry"] == "false"
    assert requests_seen(server, 502) == 1 and len(server.engine.requests) == 1


def test_the_client_does_not_retry_a_422_or_a_400(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: call_text("get_weather", {"town": 1}), max_repairs=0)
    client = retrying_client(server)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, n=2)
    assert info.value.response.headers["x-should-retry"] == "false"
    assert (requests_seen(server, 422), requests_seen(server, 400)) == (1, 1)
    unknown = httpx.get(server.url + "/v1/nowhere", timeout=5)
    assert unknown.status_code == 404 and unknown.headers["x-should-retry"] == "false"


def test_the_client_retries_a_503_after_its_retry_after(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: call_text("get_weather", {"city": "Oslo"}))
    checks = server.validator
    real = checks.validate
    calls: list[Any] = []

    async def down_once(req: Any) -> Any:
        calls.append(req)
        if len(calls) == 1:
            raise errors.ValidatorUnavailableError("validator unreachable: connection refused")
        return await real(req)

    checks.validate = down_once  # type: ignore[method-assign]
    with httpx.Client(timeout=20) as http:
        first = http.post(server.url + "/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER]})
    assert first.status_code == 503 and first.headers["retry-after"] == "1"
    assert first.headers["x-should-retry"] == "true"
    calls.clear()
    done = retrying_client(server).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    [call] = done.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and len(calls) == 2
    assert (requests_seen(server, 503), requests_seen(server, 200)) == (2, 1)
