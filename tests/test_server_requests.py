"""The real FastAPI app over ASGI with a scripted FakeEngine (tests/test_server_app.py's
harness): request errors in OpenAI's shape, the context limit, the API key, the queue
limit and the operational routes (/v1/models, /health, /metrics)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from callgate.serving.settings import Limits
from tests import test_server_app
from tests.harness import CountingTokenizer
from tests.test_server_app import ASK, MODEL, WEATHER, call_text, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture


# ---- request errors -----------------------------------------------------------------------------


async def test_request_errors_have_openai_bodies(make_harness: Any) -> None:
    h = make_harness(settings=make_settings(limits=Limits(max_body_bytes=2000)))
    cases = [
        (await h.client.post("/v1/chat/completions", content=b"{nope"), 400, None),
        (await h.post({"messages": "hi"}), 400, "messages"),
        (await h.post({"messages": ASK, "n": 3}), 400, "n"),
        (await h.post({"messages": ASK, "model": "gpt-9"}), 404, "model"),
        (await h.post({"messages": [{"role": "user", "content": "x" * 3000}]}), 413, None),
        (await h.client.get("/v1/nothing"), 404, None),
    ]
    for resp, status, param in cases:
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert err["param"] == param
    assert h.engine.requests == []


async def test_prompt_longer_than_the_context_is_400(make_harness: Any) -> None:
    h = make_harness(["x"], max_model_len=64)
    resp = await h.post({"messages": [{"role": "user", "content": "word " * 40}]})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
    resp = await h.post({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_tokens"
    assert h.engine.requests == []


async def test_prompt_too_long_by_its_length_alone_is_refused_untokenised(make_harness: Any) -> None:
    tok = CountingTokenizer()
    h = make_harness(["ok"], max_model_len=64, tokenizer=tok)
    assert (await h.post({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})).status_code == 200
    structure = tok.encoded[0][0] - 1  # the rendered prompt around the content
    most = 63 * max(len(s) for s in tok.specials)  # the most text 63 of the fake's tokens can hold
    tok.encoded.clear()
    over = await h.post({"messages": [{"role": "user", "content": "x" * (most + 1 - structure)}]})
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
    assert "at least 64 tokens" in over.json()["error"]["message"] and tok.encoded == []
    under = await h.post({"messages": [{"role": "user", "content": "x" * (most - structure)}]})
    assert under.status_code == 400 and under.json()["error"]["code"] == "context_length_exceeded"
    assert re.search(r"the prompt is \d+ tokens", under.json()["error"]["message"])  # its real count
    assert tok.encoded == [(most, False)]  # tokenised, and off the event loop
    assert len(h.engine.requests) == 1  # only the first reached the engine


async def test_a_chat_prompt_is_tokenised_once_and_the_engine_gets_its_ids(make_harness: Any) -> None:
    tok = CountingTokenizer()
    h = make_harness(["ok"], tokenizer=tok)
    assert (await h.post({"messages": ASK, "max_tokens": 4})).status_code == 200
    req = h.engine.requests[0]
    assert req.prompt_ids == tuple(tok.encode(req.prompt, req.untrusted_spans))
    assert [n for n, _ in tok.encoded].count(len(req.prompt)) == 2  # the context check's, and this test's


async def test_api_key_guards_every_route_but_health(make_harness: Any) -> None:
    h = make_harness(["ok"], settings=make_settings(api_key="s3cret"))
    assert (await h.client.get("/health")).status_code == 200
    for path in ("/v1/models", "/metrics"):
        resp = await h.client.get(path)
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
        assert (await h.client.get(path, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await h.client.get(path, headers={"Authorization": "Bearer s3cret"})).status_code == 200
    assert (await h.post({"messages": ASK})).status_code == 401
    assert (await h.post({"messages": ASK}, Authorization="Bearer s3cret")).status_code == 200


async def test_queue_full_is_429_at_once(make_harness: Any) -> None:
    h = make_harness(settings=make_settings(max_num_seqs=1, max_queue=1), respond=lambda req: "slow")
    h.engine.token_delay_s = 0.05
    first = [asyncio.create_task(h.post({"messages": ASK})) for _ in range(2)]
    await asyncio.sleep(0.05)
    third = await h.post({"messages": ASK})
    assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limit_error"
    assert third.headers["retry-after"] == "1"  # the official clients wait that long before retrying
    assert [r.status_code for r in await asyncio.gather(*first)] == [200, 200]
    assert (await h.post({"messages": ASK})).status_code == 200


async def test_models_health_and_metrics(make_harness: Any) -> None:
    h = make_harness(["ok", call_text("get_weather", {"city": "Oslo"}) + "<tool_call>{"])
    models = (await h.client.get("/v1/models")).json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert (await h.client.get("/health")).json()["status"] == "ok"
    await h.post({"messages": ASK})
    await h.post({"messages": ASK, "tools": [WEATHER]})
    text = (await h.client.get("/metrics")).text
    assert 'callgate_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'callgate_requests_total{route="/v1/chat/completions",status="502"} 1.0' in text
    assert "callgate_time_to_first_token_seconds_count 2.0" in text
    assert "callgate_completion_tokens_total" in text and "callgate_queue_depth 0.0" in text
    assert "callgate_engine_running 0.0" in text
    assert 'callgate_parse_diagnostics_total{code="' in text


async def test_metrics_label_every_route_and_only_known_ones(make_harness: Any) -> None:
    h = make_harness(respond=lambda req: "Title")
    quick = {"messages": ASK, "tasks": ["title"]}
    assert (await h.client.post("/v1/quick", json=quick)).status_code == 200
    assert (await h.client.get(f"/v1/models/{MODEL}")).status_code == 200
    assert (await h.client.get("/v1/models/unknown")).status_code == 404
    assert (await h.client.get("/nowhere/at/all")).status_code == 404
    text = (await h.client.get("/metrics")).text
    assert 'callgate_requests_total{route="/v1/quick",status="200"} 1.0' in text
    assert 'callgate_requests_total{route="/v1/models/{model}",status="200"} 1.0' in text
    assert 'callgate_requests_total{route="/v1/models/{model}",status="404"} 1.0' in text
    assert 'callgate_requests_total{route="other",status="404"} 1.0' in text
    assert 'route="other",status="200"' not in text
