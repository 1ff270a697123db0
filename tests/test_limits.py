"""Request limits at the wire: every bound is configurable, has a safe default, and a request
over it gets a clear 400 / 413 in OpenAI's error shape before the engine sees anything.

Knows: the `Limits` knobs and their CLI flags, the app over ASGI with a FakeEngine.
Does not know: how the limits are enforced inside protocol.py (only what a client sees).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields, replace
from typing import Any

import httpx
import pytest

from callgate.__main__ import build_parser, settings_from_args
from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.settings import Limits, Settings

ASK = [{"role": "user", "content": "hi"}]


def tool(name: str = "f", parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    params = parameters if parameters is not None else {"type": "object", "properties": {"a": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


def nested(depth: int) -> dict[str, Any]:
    """An object schema whose `properties` nest `depth` objects deep (JSON depth ~2*depth+1)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def with_refs(n: int) -> dict[str, Any]:
    props = {f"p{i}": {"$ref": "#/$defs/s"} for i in range(n)}
    return {"type": "object", "$defs": {"s": {"type": "string"}}, "properties": props}


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}


@dataclass
class Client:
    engine: FakeEngine
    http: httpx.AsyncClient

    async def chat(self, body: Any) -> httpx.Response:
        return await self.http.post("/v1/chat/completions", json=body)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    limits = Limits(
        max_body_bytes=64 * 1024,
        max_messages=4,
        max_tools=3,
        max_schema_bytes=2000,
        max_schema_depth=8,
        max_schema_refs=5,
        max_tokens=100,
        max_stop_sequences=2,
        max_stop_chars=10,
        max_quick_tasks=2,
    )
    engine = FakeEngine(respond=lambda req: "ok")
    settings = Settings(served_model_name="m", max_model_len=4096, limits=limits)
    app = create_app(settings, engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        yield Client(engine, http)


def assert_error(resp: httpx.Response, status: int, param: str | None, needle: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert needle in err["message"], err["message"]


OVER_LIMIT = [
    ("messages", {"messages": ASK * 5}, "messages", "limit 4"),
    ("tools", {"messages": ASK, "tools": [tool(f"t{i}") for i in range(4)]}, "tools", "limit 3"),
    ("schema bytes", {"messages": ASK, "tools": [tool(parameters=with_refs(0) | {"description": "x" * 2000})]},
     "tools[0].function.parameters", "bytes"),
    ("schema depth", {"messages": ASK, "tools": [tool(parameters=nested(5))]},
     "tools[0].function.parameters", "nests"),
    ("schema refs", {"messages": ASK, "tools": [tool(parameters=with_refs(6))]},
     "tools[0].function.parameters", "$ref"),
    ("response_format depth",
     {"messages": ASK, "response_format": json_schema_format(nested(5))},
     "response_format", "nests"),
    ("response_format refs",
     {"messages": ASK, "response_format": json_schema_format(with_refs(6))},
     "response_format", "$ref"),
    ("max_tokens", {"messages": ASK, "max_tokens": 101}, "max_tokens", "limit 100"),
    ("max_completion_tokens", {"messages": ASK, "max_completion_tokens": 10**9}, "max_completion_tokens", "limit"),
    ("stop count", {"messages": ASK, "stop": ["a", "b", "c"]}, "stop", "at most 2"),
    ("stop length", {"messages": ASK, "stop": ["x" * 11]}, "stop", "1..10"),
    ("empty stop", {"messages": ASK, "stop": [""]}, "stop", "1..10"),
    ("quick tasks", {"messages": ASK, "callgate": {"quick": ["title"] * 3}}, "callgate.quick", "at most 2"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "needle"), [c[1:] for c in OVER_LIMIT], ids=[c[0] for c in OVER_LIMIT])
async def test_over_a_limit_is_400_naming_the_field(client: Client, body: Any, param: str, needle: str) -> None:
    assert_error(await client.chat(body), 400, param, needle)
    assert client.engine.requests == []


async def test_at_the_limits_is_served(client: Client) -> None:
    body = {
        "messages": ASK * 4,
        "tools": [tool("t0", with_refs(5)), tool("t1", nested(3)), tool("t2")],
        "max_tokens": 100,
        "stop": ["x" * 10, "y"],
    }
    resp = await client.chat(body)
    assert resp.status_code == 200, resp.text
    assert len(client.engine.requests) == 1


async def test_declared_body_over_the_limit_is_413_before_reading(client: Client) -> None:
    resp = await client.http.post(
        "/v1/chat/completions",
        content=b"{}",
        headers={"content-length": str(10**9), "content-type": "application/json"},
    )
    assert_error(resp, 413, None, "limit")


async def test_streamed_body_without_length_is_cut_at_the_limit(client: Client) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(1000):  # 1 MB offered, no content-length
            yield b" " * 1024

    resp = await client.http.post("/v1/chat/completions", content=chunks())
    assert "content-length" not in resp.request.headers
    assert_error(resp, 413, None, "exceeds the limit")
    assert client.engine.requests == []


@pytest.mark.parametrize("opener", ["[", '{"a":'])
async def test_deeply_nested_body_is_400_not_500(client: Client, opener: str) -> None:
    body = '{"messages": ' + opener * 5000
    resp = await client.http.post("/v1/chat/completions", content=body.encode())
    assert_error(resp, 400, None, "JSON")


async def test_deep_arguments_in_history_are_400_or_served_never_500(client: Client) -> None:
    args = json.dumps(nested(150))  # under the body limit, deeper than a naive recursive check likes
    msgs = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    resp = await client.chat({"messages": msgs, "tools": [tool()]})
    assert resp.status_code in (200, 400), resp.text


def test_every_limit_is_finite_and_positive_by_default() -> None:
    defaults = Limits()
    for f in fields(Limits):
        assert 0 < getattr(defaults, f.name) < 10**9, f.name


def test_limits_are_configurable_from_the_command_line() -> None:
    flags = {
        "--max-body-bytes": "max_body_bytes",
        "--max-messages": "max_messages",
        "--max-tools": "max_tools",
        "--max-schema-bytes": "max_schema_bytes",
        "--max-schema-depth": "max_schema_depth",
        "--max-schema-refs": "max_schema_refs",
        "--max-tokens-limit": "max_tokens",
        "--max-stop-sequences": "max_stop_sequences",
    }
    argv = ["serve"]
    for k, flag in enumerate(flags):
        argv += [flag, str(k + 3)]
    limits = settings_from_args(build_parser().parse_args(argv)).limits
    expected = replace(Limits(), **{name: k + 3 for k, name in enumerate(flags.values())})
    assert limits == expected
