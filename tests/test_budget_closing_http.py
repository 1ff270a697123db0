"""finish_reason through the real HTTP app (FakeEngine, hermes) when budget closing ended a call.

The FakeEngine counts one token per scripted chunk plus EOS on a "stop" reply, as vLLM
does. A constrained request whose output used all of max_tokens was closed by budget
closing (callgate/decoding/closing.py): the call is returned, parsed and validated, but
finish_reason is "length", not "tool_calls".
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.settings import Settings
from tests.test_server_app import ASK, MODEL, WEATHER, SchemaCheck, call_text

CALL = call_text("get_weather", {"city": "O"})  # "O" is all a closed value got
N_TOKENS = len(CALL) + 1  # one token per character, then EOS


@pytest.fixture
async def post() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    async def send(
        body: dict[str, Any], *, constrained: bool = True, path: str = "/v1/chat/completions"
    ) -> httpx.Response:
        settings = replace(Settings(served_model_name=MODEL, max_model_len=4096), constrained=constrained)
        app = create_app(settings, engine=FakeEngine(replies=[list(CALL)]), validator=SchemaCheck())
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://callgate.test")
        clients.append(client)
        return await client.post(path, json=body)

    yield send
    for client in clients:
        await client.aclose()


def body(max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": max_tokens, **kw}


@pytest.mark.parametrize(("max_tokens", "finish"), [(N_TOKENS, "length"), (N_TOKENS + 1, "tool_calls")])
async def test_a_constrained_call_that_used_every_token_reports_length(post: Any, max_tokens: int, finish: str) -> None:
    resp = await post(body(max_tokens))
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == finish
    (call,) = choice["message"]["tool_calls"]  # the closed call is still returned
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "O"}
    assert resp.json()["usage"]["completion_tokens"] == N_TOKENS


async def test_streamed_responses_report_length_too(post: Any) -> None:
    resp = await post(body(N_TOKENS, stream=True))
    events = [json.loads(line[6:]) for line in resp.text.split("\n") if line.startswith("data: {")]
    finishes = [c["choices"][0]["finish_reason"] for c in events if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert any("tool_calls" in c["choices"][0]["delta"] for c in events if c["choices"])


async def test_an_unconstrained_request_that_ends_at_max_tokens_with_eos_is_not_length(post: Any) -> None:
    resp = await post(body(N_TOKENS), constrained=False)
    assert resp.json()["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_budget_below_the_shortest_call_is_a_400_naming_max_tokens(post: Any) -> None:
    """Under `required` a call must be written whole; a max_tokens that cannot hold the
    shortest one the tools allow would only get a call cut short, so it is refused."""
    resp = await post(body(5))
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "max_tokens"
    assert "max_tokens: 5 cannot hold the shortest call" in error["message"]
    assert "raise max_tokens to at least" in error["message"]
    named = await post(body(5, tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert named.status_code == 400 and named.json()["error"]["param"] == "max_tokens"
    streamed = await post(body(5, stream=True))
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "max_tokens"


async def test_the_responses_surface_names_its_own_field_in_that_400(post: Any) -> None:
    tool = {"type": "function", **WEATHER["function"]}
    resp = await post(
        {
            "model": MODEL,
            "input": "Weather in Oslo?",
            "tools": [tool],
            "tool_choice": "required",
            "max_output_tokens": 5,
        },
        path="/v1/responses",
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "max_output_tokens"
    assert "max_output_tokens: 5 cannot hold the shortest call" in error["message"]
    assert "raise max_output_tokens to at least" in error["message"] and "max_tokens" not in error["message"]


async def test_auto_and_unconstrained_requests_keep_a_small_budget(post: Any) -> None:
    """Under `auto` text is a whole answer, and an unconstrained server plans nothing (the
    scripted call is then cut at 5 tokens: a 502 carrying the raw output, not a 400)."""
    assert (await post(body(5, tool_choice="auto"))).status_code == 200
    assert (await post(body(5), constrained=False)).status_code == 502
