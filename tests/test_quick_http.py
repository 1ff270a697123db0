"""Quick heads at the wire: POST /v1/quick and the `callgate.quick` extension of chat
completions, over the real app with a scripted engine (hermes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest

from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.settings import Settings
from tests.test_quick import CHAT, DECIDED_TOKENS, EXPECTED, scripted, titling

MODEL = "fake-model"


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., tuple[httpx.AsyncClient, FakeEngine]]]:
    clients: list[httpx.AsyncClient] = []

    def make(engine: FakeEngine | None = None, **settings_kw: Any) -> tuple[httpx.AsyncClient, FakeEngine]:
        engine = engine or scripted()
        settings = replace(Settings(served_model_name=MODEL, max_model_len=4096), **settings_kw)
        app = create_app(settings, engine=engine)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://callgate.test")
        clients.append(client)
        return client, engine

    yield make
    for client in clients:
        await client.aclose()


# ---- POST /v1/quick --------------------------------------------------------------------------


async def test_quick_route_answers_every_head(make_client: Any) -> None:
    client, engine = make_client()
    tasks = ["action", "query", "authority", "domain", "title", "read_url"]
    resp = await client.post("/v1/quick", json={"model": MODEL, "messages": CHAT, "tasks": tasks})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "callgate.quick" and body["model"] == MODEL
    assert body["results"] == EXPECTED
    assert set(body["prefix_cache"]) == set(tasks)
    assert all(0.0 <= rate < 1.0 for rate in body["prefix_cache"].values())
    assert body["usage"]["completion_tokens"] == sum(DECIDED_TOKENS.values())
    assert len(engine.requests) == 7  # read_url asks each of its two URLs on its own


async def test_quick_heads_after_a_main_request_hit_its_prefix(make_client: Any) -> None:
    client, _ = make_client()
    await client.post("/v1/chat/completions", json={"messages": CHAT})
    resp = await client.post("/v1/quick", json={"messages": CHAT, "tasks": ["domain"]})
    assert resp.json()["prefix_cache"]["domain"] > 0.3


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": CHAT, "tasks": ["action", "summarise"]}, 400, "tasks"),
        ({"messages": CHAT, "tasks": []}, 400, "tasks"),
        ({"messages": CHAT, "tasks": ["domain"], "labels": {"title": ["a"]}}, 400, "labels.title"),
        ({"messages": CHAT, "tasks": ["domain"], "labels": {"domain": []}}, 400, "labels.domain"),
        ({"model": "other", "messages": CHAT, "tasks": ["action"]}, 404, "model"),
        ({"messages": [], "tasks": ["action"]}, 400, "messages"),
    ],
)
async def test_quick_route_errors(make_client: Any, body: dict[str, Any], status: int, param: str) -> None:
    client, engine = make_client()
    resp = await client.post("/v1/quick", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["param"] == param
    assert engine.requests == []


async def test_quick_route_labels_constrain_the_head(make_client: Any) -> None:
    client, engine = make_client()
    body = {"messages": CHAT, "tasks": ["domain"], "labels": {"domain": ["technology", "cooking"]}}
    resp = await client.post("/v1/quick", json=body)
    assert resp.json()["results"] == {"domain": "technology"}
    constraint = engine.requests[0].constraint
    assert constraint is not None and "ooking" in constraint.grammar and "science" not in constraint.grammar


async def test_a_format_without_heads_refuses_them(make_client: Any) -> None:
    client, _ = make_client(format="dsml-v3.2")
    resp = await client.post("/v1/quick", json={"messages": CHAT, "tasks": ["action"]})
    assert resp.status_code == 400 and "action" in resp.json()["error"]["message"]


# ---- callgate.quick on chat completions ------------------------------------------------------


async def test_chat_completion_carries_quick_results(make_client: Any) -> None:
    client, engine = make_client()
    body = {"messages": CHAT, "callgate": {"quick": ["title", "action"]}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["choices"][0]["message"]["content"] == "The main answer."
    assert data["callgate"]["quick"] == {"title": EXPECTED["title"], "action": "search"}
    assert set(data["callgate"]["quick_prefix_cache"]) == {"title", "action"}
    ids = [r.request_id for r in engine.requests]
    # the main generation first (action starts at its first token, once the prefix is cached);
    # title after the answer, whose text it carries
    assert ids[0].endswith("-0") and sorted(i.rsplit("-", 1)[1] for i in ids[1:]) == ["action", "title"]
    title = next(r for r in engine.requests if r.request_id.endswith("-q-title"))
    assert "The main answer." in title.prompt


async def test_streamed_chat_completion_carries_quick_results_in_the_final_chunk(make_client: Any) -> None:
    client, _ = make_client()
    body = {"messages": CHAT, "stream": True, "callgate": {"quick": ["domain"]}}
    resp = await client.post("/v1/chat/completions", json=body)
    payloads = [ln[6:] for ln in resp.text.split("\n") if ln.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    final = [json.loads(p) for p in payloads[:-1] if "callgate" in json.loads(p)]
    assert len(final) == 1 and final[0]["callgate"]["quick"] == {"domain": "technology"}


async def test_chat_with_an_unknown_quick_task_is_a_400_before_generating(make_client: Any) -> None:
    client, engine = make_client()
    resp = await client.post("/v1/chat/completions", json={"messages": CHAT, "callgate": {"quick": ["poem"]}})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "callgate.quick"
    assert engine.requests == []
    health = await client.get("/health")
    assert health.json()["in_flight"] == 0


async def test_chat_without_quick_has_no_quick_block(make_client: Any) -> None:
    client, engine = make_client()
    resp = await client.post("/v1/chat/completions", json={"messages": CHAT})
    assert "quick" not in resp.json()["callgate"] and len(engine.requests) == 1


# ---- a title after leading blank lines, at the wire ------------------------------------------


@pytest.mark.parametrize("fmt", ["llama3-json", "mistral", "dsml-v4"])
async def test_quick_route_reads_a_title_past_its_leading_newline(make_client: Any, fmt: str) -> None:
    client, engine = make_client(titling(fmt, "\nWeather\nmore"), format=fmt)
    resp = await client.post("/v1/quick", json={"messages": CHAT, "tasks": ["title"]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["results"] == {"title": "Weather"}
    assert body["usage"]["completion_tokens"] == len("\nWeather\n") and len(engine.requests) == 1


async def test_chat_completion_reads_a_title_past_its_leading_newline(make_client: Any) -> None:
    client, _ = make_client(titling("llama3-json", "\n\nOslo weather"), format="llama3-json")
    body = {"messages": CHAT, "callgate": {"quick": ["title"]}}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["callgate"]["quick"] == {"title": "Oslo weather"}
