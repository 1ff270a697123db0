"""API-key authentication: with --api-key every route but /health needs it, the comparison is
constant-time, and the key never leaks into logs, metrics or the audit log.

Knows: the app over ASGI with a FakeEngine (hermes calls), its route table, its logs.
Does not know: how the key is stored inside the app (only what a client or an operator sees).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.settings import Settings

KEY = "sk-test-9f2c41d0e7b3a6"
TOOL = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
}
CALL = '<tool_call>\n{"name": "ping", "arguments": {"n": 1}}\n</tool_call>'
CHAT = {"messages": [{"role": "user", "content": "ping"}], "tools": [TOOL]}
QUICK = {"messages": [{"role": "user", "content": "ping"}], "tasks": ["title"]}
MESSAGES = {
    "model": "m",
    "max_tokens": 200,
    "messages": [{"role": "user", "content": "ping"}],
    "tools": [{"name": "ping", "input_schema": TOOL["function"]["parameters"]}],  # type: ignore[index]
}
RESPONSES = {"input": "ping", "tools": [{"type": "function", **TOOL["function"]}]}  # type: ignore[dict-item]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/quick": QUICK,
    "/v1/completions": {"prompt": "ping"},
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": MESSAGES,
    "/v1/responses": RESPONSES,
}


@dataclass
class Server:
    app: Any
    http: httpx.AsyncClient
    audit: Path

    async def call(self, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        body = BODIES.get(path, CHAT)
        if method == "POST":
            return await self.http.post(path, json=body, headers=headers)
        return await self.http.request(method, path, headers=headers)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    audit = tmp_path / "audit.jsonl"
    settings = Settings(served_model_name="m", max_model_len=4096, api_key=KEY, audit_log=str(audit))
    app = create_app(settings, engine=FakeEngine(respond=lambda req: CALL))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        yield Server(app, http, audit)


def routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves; a path parameter names the served model."""
    out = []
    for r in app.routes:
        if isinstance(r, APIRoute):
            out += [(m, r.path.replace("{model:path}", "m")) for m in sorted(r.methods)]
    return out


BAD_HEADERS = [
    {},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer "},
    {"Authorization": "Bearer wrong"},
    {"Authorization": KEY},
    {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Bearer {KEY[:-1]}"},
    {"Authorization": f"Bearer {KEY}x"},
    {"Authorization": f"Bearer  {KEY}"},
    {"Authorization": f"bearer{KEY}"},
    {"X-Api-Key": KEY},
]


async def test_every_route_but_health_needs_the_key(server: Server) -> None:
    table = routes(server.app)
    assert {p for _, p in table} >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/quick",
        "/v1/models",
        "/v1/models/m",
        "/health",
        "/metrics",
    }
    for method, path in [*table, ("GET", "/nowhere"), ("POST", "/v1/completions")]:
        for headers in BAD_HEADERS if not path.startswith("/v1/messages") else BAD_HEADERS[:-1]:
            resp = await server.call(method, path, headers)
            if path == "/health":
                assert resp.status_code == 200
                continue
            assert resp.status_code == 401, (method, path, headers)
            err = resp.json()["error"]
            assert (err["type"], err["code"]) == ("authentication_error", "invalid_api_key")
            assert KEY not in resp.text
    auth = {"Authorization": f"Bearer {KEY}"}
    stored = (await server.call("POST", "/v1/responses", auth)).json()["id"]  # for /v1/responses/{response_id}
    for method, path in sorted(table, key=lambda route: route[0] == "DELETE"):  # the stored one deleted last
        resp = await server.call(method, path.replace("{response_id}", stored), auth)
        assert resp.status_code == 200, (method, path, resp.text)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):  # Anthropic's clients send x-api-key
        assert (await server.call("POST", path, {"X-Api-Key": KEY})).status_code == 200
        assert (await server.call("POST", path, {"X-Api-Key": KEY + "x"})).status_code == 401


async def test_the_bearer_scheme_is_case_insensitive(server: Server) -> None:
    """RFC 9110 section 11.1: an auth scheme matches in any case; the key itself does not."""
    for scheme in ("bearer", "BEARER", "BeArEr"):
        assert (await server.call("GET", "/v1/models", {"Authorization": f"{scheme} {KEY}"})).status_code == 200
    swapped = KEY.swapcase()
    assert swapped != KEY
    assert (await server.call("GET", "/v1/models", {"Authorization": f"Bearer {swapped}"})).status_code == 401


async def test_comparison_is_constant_time(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check goes through hmac.compare_digest (time independent of where bytes differ)."""
    seen: list[tuple[bytes, bytes]] = []
    real: Callable[[bytes, bytes], bool] = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    assert (await server.call("GET", "/v1/models", {"Authorization": "Bearer nope"})).status_code == 401
    assert (await server.call("GET", "/v1/models", {"Authorization": f"Bearer {KEY}"})).status_code == 200
    assert (await server.call("GET", "/v1/models")).status_code == 401
    assert len(seen) == 3
    assert all(b == KEY.encode() for _, b in seen)


async def test_key_never_in_logs_metrics_or_audit(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    good = {"Authorization": f"Bearer {KEY}"}
    resp = await server.http.post("/v1/chat/completions", json=CHAT, headers=good)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["tool_calls"]
    stream = await server.http.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=good)
    assert stream.status_code == 200 and "[DONE]" in stream.text
    await server.call("GET", "/v1/models", {"Authorization": f"Bearer {KEY}x"})  # near miss: not echoed
    metrics = await server.http.get("/metrics", headers=good)
    assert metrics.status_code == 200 and "401" in metrics.text  # the failures were counted ...
    assert KEY not in metrics.text  # ... without the key
    records = [json.loads(line) for line in server.audit.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 2 and all(r["tool"] == "ping" for r in records)
    assert KEY not in server.audit.read_text(encoding="utf-8")
    assert KEY not in caplog.text
    assert KEY not in repr(server.app.state.service.settings)
