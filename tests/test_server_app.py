"""The real FastAPI app over ASGI with a scripted FakeEngine and the hermes format:
OpenAI shapes, validator handoff and repair, and every error mapping of DESIGN section 7."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from callgate.errors import EngineError, ValidatorUnavailableError
from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine, FakeReply
from callgate.serving.settings import Limits, Settings

MODEL = "fake-model"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A hermes call block exactly as the model writes one."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# ---- a small validator in the seam's shape ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str
    arguments: dict[str, Any] | None = None
    errors: tuple[dict[str, str], ...] = ()
    retryable: bool = False
    validator: str = "test-schema"


@dataclass
class SchemaCheck:
    """JSON-Schema check of the arguments; records every envelope; can be told to be down."""

    down: bool = False
    seen: list[Any] = field(default_factory=list)
    name: str = "test-schema"

    async def validate(self, req: Any) -> Verdict:
        self.seen.append(req)
        if self.down:
            raise ValidatorUnavailableError("validator unreachable: connection refused")
        if req.schema is None:
            return Verdict("rejected", errors=({"path": "", "message": f"unknown tool {req.tool!r}"},))
        errors = tuple(
            {"path": "/" + "/".join(str(p) for p in e.absolute_path), "message": e.message}
            for e in Draft202012Validator(req.schema).iter_errors(req.arguments)
        )
        if errors:
            return Verdict("rejected", errors=errors, retryable=True)
        return Verdict("accepted", arguments=dict(req.arguments))


# ---- app fixtures --------------------------------------------------------------------------


def make_settings(**kw: Any) -> Settings:
    return replace(Settings(served_model_name=MODEL, max_model_len=4096), **kw)


@dataclass
class Harness:
    engine: FakeEngine
    validator: SchemaCheck
    client: httpx.AsyncClient

    async def post(self, body: Mapping[str, Any], **headers: str) -> httpx.Response:
        return await self.client.post("/v1/chat/completions", json=dict(body), headers=headers)

    async def events(self, body: Mapping[str, Any]) -> list[str]:
        """The `data:` payloads of a streamed response, in order ('[DONE]' included)."""
        resp = await self.post({**body, "stream": True})
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        return [line[len("data: ") :] for line in resp.text.split("\n") if line.startswith("data: ")]


@pytest.fixture
async def make_harness() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    def make(replies: Sequence[Any] = (), settings: Settings | None = None, **engine_kw: Any) -> Harness:
        engine = FakeEngine(replies=list(replies), **engine_kw)
        validator = SchemaCheck()
        app = create_app(settings or make_settings(), engine=engine, validator=validator)
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://callgate.test")
        clients.append(client)
        return Harness(engine, validator, client)

    yield make
    for client in clients:
        await client.aclose()


def chunks(events: list[str]) -> list[dict[str, Any]]:
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# ---- answers ------------------------------------------------------------------------------


async def test_plain_answer_has_openai_shape(make_harness: Any) -> None:
    h = make_harness([["Oslo ", "is ", "cold."]])
    body = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["END"],
    }
    resp = await h.post(body)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Oslo is cold."}
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    sent = h.engine.requests[0]
    assert usage["prompt_tokens"] == len(h.engine.tokenizer.encode(sent.prompt)) > 0
    assert usage["completion_tokens"] == 4 and usage["total_tokens"] == usage["prompt_tokens"] + 4  # 3 + EOS
    assert (sent.sampling.max_tokens, sent.sampling.temperature, sent.sampling.top_p) == (50, 0.2, 0.9)
    # hermes reads a reasoning block, so callgate applies "END" itself (conform.stops_outside_markup)
    assert (sent.sampling.seed, sent.sampling.stop) == (3, ())
    assert "Weather in Oslo?" in sent.prompt
    assert body["callgate"]["candidates"] == [] and body["callgate"]["diagnostics"] == []


async def test_tool_call_is_validated_and_returned(make_harness: Any) -> None:
    h = make_harness([call_text("get_weather", {"city": "Oslo"})])
    resp = await h.post({"messages": ASK, "tools": [WEATHER]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    message, finish = body["choices"][0]["message"], body["choices"][0]["finish_reason"]
    assert finish == "tool_calls" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    [cand] = body["callgate"]["candidates"]
    assert cand["call_id"] == call["id"] and cand["verdict"]["verdict"] == "accepted"
    assert cand["raw"].startswith("<tool_call>") and cand["format"] == "hermes"
    [envelope] = h.validator.seen
    assert (envelope.tool, envelope.arguments, envelope.format, envelope.model) == (
        "get_weather",
        {"city": "Oslo"},
        "hermes",
        MODEL,
    )
    assert envelope.schema == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert len(envelope.idempotency_key) == 64 and envelope.strict is False
    assert "get_weather" in h.engine.requests[0].prompt


async def test_streamed_answer_and_usage(make_harness: Any) -> None:
    h = make_harness([["Oslo ", "is ", "cold."]])
    out = chunks(await h.events({"messages": ASK, "stream_options": {"include_usage": True}}))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == out[0]["id"] for c in out)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in out if c["choices"])
    assert text == "Oslo is cold."
    finals = [c for c in out if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["stop"]
    assert "callgate" in finals[0]
    assert out[-1]["choices"] == [] and out[-1]["usage"]["completion_tokens"] == 4


async def test_streamed_call_accumulates_to_the_non_streamed_call(make_harness: Any) -> None:
    text = "Checking." + call_text("get_weather", {"city": "Oslo", "days": 2})
    h = make_harness([text, [text[i : i + 3] for i in range(0, len(text), 3)]])
    whole = (await h.post({"messages": ASK, "tools": [WEATHER]})).json()["choices"][0]["message"]
    out = chunks(await h.events({"messages": ASK, "tools": [WEATHER]}))
    calls: dict[int, dict[str, Any]] = {}
    content = ""
    for c in out:
        delta = c["choices"][0]["delta"] if c["choices"] else {}
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls", []):
            acc = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            acc["id"] = tc.get("id") or acc["id"]
            acc["name"] += tc.get("function", {}).get("name", "")
            acc["arguments"] += tc.get("function", {}).get("arguments", "")
    assert content == whole["content"] == "Checking."
    [(index, acc)] = calls.items()
    assert index == 0 and acc["id"].startswith("call_")
    assert (acc["name"], json.loads(acc["arguments"])) == (
        whole["tool_calls"][0]["function"]["name"],
        json.loads(whole["tool_calls"][0]["function"]["arguments"]),
    )
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_parallel_calls_keep_their_order(make_harness: Any) -> None:
    cities = ["Oslo", "Lima", "Pune"]
    h = make_harness(["\n".join(call_text("get_weather", {"city": c}) for c in cities)])
    body = (await h.post({"messages": ASK, "tools": [WEATHER]})).json()
    got = [json.loads(c["function"]["arguments"])["city"] for c in body["choices"][0]["message"]["tool_calls"]]
    assert got == cities


async def test_finish_reason_length(make_harness: Any) -> None:
    h = make_harness(["one two three four"])
    body = (await h.post({"messages": ASK, "max_tokens": 5})).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == "one t"


async def test_tool_choice_none_hides_tools_from_the_prompt(make_harness: Any) -> None:
    h = make_harness(["ok"])
    assert (await h.post({"messages": ASK, "tools": [WEATHER], "tool_choice": "none"})).status_code == 200
    assert "get_weather" not in h.engine.requests[0].prompt


# ---- validator handoff -----------------------------------------------------------------------


async def test_rejected_call_is_repaired_with_the_errors_fed_back(make_harness: Any) -> None:
    bad = call_text("get_weather", {"city": "Oslo", "days": "two"})
    good = call_text("get_weather", {"city": "Oslo", "days": 1})
    h = make_harness([bad, good])
    resp = await h.post({"messages": ASK, "tools": [WEATHER]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 1}
    cg = body["callgate"]
    assert cg["repairs"] == 1
    assert [(c["round"], c["verdict"]["verdict"]) for c in cg["candidates"]] == [(0, "rejected"), (1, "accepted")]
    repair_prompt = h.engine.requests[1].prompt
    assert "is not of type 'integer'" in repair_prompt and "two" in repair_prompt
    assert body["usage"]["completion_tokens"] == len(bad) + len(good) + 2  # one token per character + EOS


async def test_still_rejected_after_repairs_is_422_with_verdicts(make_harness: Any) -> None:
    bad = call_text("get_weather", {"town": "Oslo"})
    h = make_harness([bad, bad, bad])
    resp = await h.post({"messages": ASK, "tools": [WEATHER], "callgate": {"max_repairs": 2}})
    assert resp.status_code == 422
    body = resp.json()
    assert body["error"]["type"] == "tool_call_rejected" and body["error"]["code"] == "tool_call_rejected"
    verdicts = [c["verdict"] for c in body["callgate"]["candidates"]]
    assert len(verdicts) == 3 and all(v["verdict"] == "rejected" and v["errors"] for v in verdicts)
    assert len(h.engine.requests) == 3


async def test_unknown_tool_goes_to_the_validator_and_is_rejected(make_harness: Any) -> None:
    h = make_harness([call_text("launch", {})], settings=make_settings(max_repairs=0))
    resp = await h.post({"messages": ASK, "tools": [WEATHER]})
    assert resp.status_code == 422
    assert h.validator.seen[0].schema is None
    codes = [d["code"] for d in resp.json()["callgate"]["diagnostics"]]
    assert codes == ["unknown_tool"]


async def test_validator_down_is_503_and_nothing_is_accepted(make_harness: Any) -> None:
    h = make_harness([call_text("get_weather", {"city": "Oslo"})] * 2)
    h.validator.down = True
    resp = await h.post({"messages": ASK, "tools": [WEATHER]})
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "validator_unavailable"
    out = chunks(await h.events({"messages": ASK, "tools": [WEATHER]}))
    assert not any("tool_calls" in c["choices"][0]["delta"] for c in out if c.get("choices"))
    assert out[-1]["error"]["type"] == "validator_unavailable"


async def test_streamed_rejection_never_sends_the_rejected_call(make_harness: Any) -> None:
    bad = call_text("get_weather", {"city": 5})
    h = make_harness([bad, bad], settings=make_settings(max_repairs=1))
    resp = await h.post({"messages": ASK, "tools": [WEATHER], "stream": True})
    assert "event: error" in resp.text
    out = chunks([line[6:] for line in resp.text.split("\n") if line.startswith("data: ")])
    assert not any("tool_calls" in c["choices"][0]["delta"] for c in out if c.get("choices"))
    assert out[-1]["error"]["type"] == "tool_call_rejected"


# ---- bad model output ---------------------------------------------------------------------------


async def test_unparseable_call_is_502_with_the_diagnostic_code(make_harness: Any) -> None:
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"'
    h = make_harness([broken, broken])
    resp = await h.post({"messages": ASK, "tools": [WEATHER]})
    assert resp.status_code == 502
    body = resp.json()
    assert body["error"]["type"] == "model_output_error" and body["error"]["code"] == "unterminated_block"
    assert body["callgate"]["diagnostics"][0]["code"] == "unterminated_block"
    out = chunks(await h.events({"messages": ASK, "tools": [WEATHER]}))
    assert out[-1]["error"]["code"] == "unterminated_block"
    assert h.validator.seen == []


# ---- reasoning, constraints, default validator ------------------------------------------------


async def test_reasoning_goes_to_reasoning_content(make_harness: Any) -> None:
    text = "<think>\nCold city.\n</think>\n\nIt is cold."
    h = make_harness([text, list(text)])
    message = (await h.post({"messages": ASK})).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Cold city.", "It is cold.")
    out = chunks(await h.events({"messages": ASK}))
    deltas = [c["choices"][0]["delta"] for c in out if c.get("choices")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Cold city."
    assert "".join(d.get("content") or "" for d in deltas) == "It is cold."


async def test_constraint_travels_with_the_generation_request(make_harness: Any) -> None:
    reply = call_text("get_weather", {"city": "Oslo"})
    h = make_harness([reply, reply, "plain"])
    await h.post({"messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
    await h.post(
        {"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    )
    await h.post({"messages": ASK})
    required, named, plain = (r.constraint for r in h.engine.requests)
    assert required is not None and named is not None and plain is None
    assert required.key != named.key and "get_weather" in named.grammar
    off = make_harness([reply], settings=make_settings(constrained=False))
    body = (await off.post({"messages": ASK, "tools": [WEATHER], "tool_choice": "required"})).json()
    assert off.engine.requests[0].constraint is None and body["callgate"]["constrained"] is False


async def test_grammar_over_its_time_limit_is_400_schema_too_complex(make_harness: Any) -> None:
    props = {f"field_{i}_{id(make_harness)}": {"type": "string", "maxLength": 40} for i in range(12)}
    tool = {"type": "function", "function": {"name": "wide", "parameters": {"type": "object", "properties": props}}}
    h = make_harness(["x"], settings=make_settings(limits=Limits(grammar_timeout_s=1e-6)))
    resp = await h.post({"messages": ASK, "tools": [tool], "tool_choice": "required"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "schema_too_complex" and h.engine.requests == []


async def test_default_validator_checks_the_declared_schema() -> None:
    engine = FakeEngine(replies=[call_text("get_weather", {"city": "Oslo"}), call_text("get_weather", {"city": 7})])
    app = create_app(make_settings(max_repairs=0, constrained=False), engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://callgate.test") as client:
        ok = await client.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER]})
        bad = await client.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER]})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert bad.status_code == 422
    [cand] = bad.json()["callgate"]["candidates"]
    assert cand["verdict"]["verdict"] == "rejected" and cand["verdict"]["errors"][0]["path"] == "/city"


async def test_engine_failures_end_cleanly(make_harness: Any) -> None:
    h = make_harness(
        [
            FakeReply(("partial",), error=EngineError("the engine failed: boom")),
            FakeReply(("partial",), error=EngineError("the engine failed: boom")),
            FakeReply(("partial",), error=RuntimeError("unexpected")),
        ]
    )
    resp = await h.post({"messages": ASK})
    assert resp.status_code == 500 and resp.json()["error"]["type"] == "server_error"
    for expected in ("server_error", "internal_error"):
        out = chunks(await h.events({"messages": ASK}))
        err = out[-1]["error"]
        assert expected in (err["type"], err["code"])
    assert (await h.client.get("/health")).json()["in_flight"] == 0


async def test_output_that_breaks_tool_choice_is_502(make_harness: Any) -> None:
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    two = call_text("get_weather", {"city": "Oslo"}) + "\n" + call_text("get_weather", {"city": "Rome"})
    h = make_harness(["just text", call_text("get_time", {}), two], settings=make_settings(constrained=False))
    named = {"type": "function", "function": {"name": "get_weather"}}
    cases = [
        ({"tool_choice": "required"}, "missing_tool_call"),
        ({"tool_choice": named}, "wrong_tool"),
        ({"parallel_tool_calls": False}, "too_many_calls"),
    ]
    for extra, code in cases:
        resp = await h.post({"messages": ASK, "tools": [WEATHER, other], **extra})
        assert resp.status_code == 502, resp.text
        assert resp.json()["error"]["code"] == code
        assert resp.json()["callgate"]["diagnostics"][-1]["code"] == code
    assert h.validator.seen == []


async def test_response_format_is_constrained(make_harness: Any) -> None:
    h = make_harness(['{"city": "Oslo"}'])
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    resp = await h.post({"messages": ASK, "response_format": fmt})
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == '{"city": "Oslo"}'
    [sent] = h.engine.requests
    assert sent.constraint is not None and "city" in sent.constraint.grammar
