"""The validator handoff through the real callgate app (ASGI, scripted FakeEngine, hermes)
and a real downstream validator process (tests/validator_app.py): for each behaviour of the
validator, the response the client gets, its status, what the validator received and the
audit record written before the response."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.handoff.audit import AuditLog, read_records
from callgate.serving.handoff.idempotency import conversation_scope
from callgate.serving.handoff.validation import ENVELOPE_SCHEMA, idempotency_key
from callgate.serving.settings import Settings
from tests.validator_app import received, running_validator

MODEL = "fake-model"
API_KEY = "sk-callgate-test-8d1f0c"
CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]


def call_text(arguments: Mapping[str, Any], name: str = "get_weather") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def validator_base() -> Iterator[str]:
    with running_validator() as (base, _):
        yield base


@dataclass
class Run:
    """One chat request through a fresh callgate app whose validator is `mode` of the app."""

    response: httpx.Response
    token: str
    base: str
    engine: FakeEngine
    audit_path: Path
    elapsed_s: float
    metrics: str

    @property
    def body(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.response.json()
        return doc

    def received(self) -> list[dict[str, Any]]:
        return received(self.base, self.token)

    def audit(self) -> list[dict[str, Any]]:
        read = read_records(self.audit_path)
        assert read.skipped == 0
        return list(read.records)

    def events(self) -> list[dict[str, Any]]:
        lines = [ln[len("data: ") :] for ln in self.response.text.split("\n") if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [json.loads(ln) for ln in lines[:-1]]


@pytest.fixture
def chat(validator_base: str, tmp_path: Path) -> Any:
    async def run(
        mode: str,
        replies: Sequence[Any],
        *,
        stream: bool = False,
        query: str = "",
        base: str | None = None,
        timeout_s: float = 5.0,
        extra: Mapping[str, Any] | None = None,
    ) -> Run:
        token = uuid.uuid4().hex
        base = base or validator_base
        settings = Settings(
            served_model_name=MODEL,
            max_model_len=4096,
            api_key=API_KEY,
            validator_url=f"{base}/{mode}/{token}{query}",
            validator_timeout_s=timeout_s,
            audit_log=str(tmp_path / f"audit-{token}.jsonl"),
        )
        engine = FakeEngine(replies=list(replies))
        app = create_app(settings, engine=engine)
        body = {"model": MODEL, "messages": ASK, "tools": [CITY], "stream": stream, **(extra or {})}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://callgate.test", timeout=30) as client:
            started = time.monotonic()
            resp = await client.post("/v1/chat/completions", json=body, headers=headers)
            elapsed_s = time.monotonic() - started
            metrics = (await client.get("/metrics", headers=headers)).text
        return Run(resp, token, base, engine, Path(settings.audit_log or ""), elapsed_s, metrics)

    return run


def tool_calls_in(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [tc for e in events if e.get("choices") for tc in e["choices"][0]["delta"].get("tool_calls", [])]


def final_callgate(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    [block] = [e["callgate"] for e in events if "callgate" in e]
    return dict(block)


# ---- accepted -------------------------------------------------------------------------------


async def test_accepted_call_is_returned_and_audited(chat: Any) -> None:
    run = await chat("accept", [call_text({"city": "Oslo", "days": 2})])
    assert run.response.status_code == 200, run.response.text
    body = run.body
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}
    [cand] = body["callgate"]["candidates"]
    assert cand["verdict"]["verdict"] == "accepted" and cand["verdict"]["validator"].startswith("http:http://127.0.0.1")
    [got] = run.received()
    envelope = got["envelope"]
    assert list(Draft202012Validator(ENVELOPE_SCHEMA).iter_errors(envelope)) == []
    assert envelope["request_id"] == body["id"] and envelope["call_id"] == call["id"]
    assert (envelope["tool"], envelope["arguments"], envelope["format"], envelope["model"]) == (
        "get_weather",
        {"city": "Oslo", "days": 2},
        "hermes",
        MODEL,
    )
    assert envelope["schema"] == CITY["function"]["parameters"]  # type: ignore[index]
    assert envelope["raw"] == call_text({"city": "Oslo", "days": 2}) and envelope["strict"] is False
    scope = conversation_scope(ASK)
    assert (envelope["actor"], envelope["scope"]) == ("anonymous", scope)
    expected_key = idempotency_key("anonymous", "get_weather", {"city": "Oslo", "days": 2}, scope)
    assert envelope["idempotency_key"] == got["headers"]["idempotency-key"] == expected_key
    assert "authorization" not in got["headers"]  # the client's key is not forwarded
    [record] = run.audit()
    assert (record["request_id"], record["call_id"], record["tool"], record["round"]) == (
        body["id"],
        call["id"],
        "get_weather",
        0,
    )
    assert record["verdict"]["verdict"] == "accepted" and record["validator"] == cand["verdict"]["validator"]
    assert record["raw"] == envelope["raw"] and record["arguments"] == {"city": "Oslo", "days": 2}
    assert record["idempotency_key"] == expected_key
    assert (record["model"], record["format"], record["diagnostics"]) == (MODEL, "hermes", [])
    assert API_KEY not in run.audit_path.read_text(encoding="utf-8")
    assert "callgate_validator_latency_seconds_count 1.0" in run.metrics


async def test_normalised_arguments_replace_the_models(chat: Any) -> None:
    run = await chat("normalise", [call_text({"city": "  oslo ", "days": 2})])
    assert run.response.status_code == 200, run.response.text
    [call] = run.body["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    [record] = run.audit()
    assert record["arguments"] == {"city": "  oslo ", "days": 2}  # what the model wrote
    assert record["verdict"]["arguments"] == {"city": "Oslo", "days": 2}  # what the client got


# ---- rejected and repaired ----------------------------------------------------------------


async def test_rejected_after_the_repair_round_is_422(chat: Any) -> None:
    run = await chat("reject", [call_text({"city": "Atlantis"}), call_text({"city": "Atlantis"})])
    assert run.response.status_code == 422, run.response.text
    body = run.body
    assert body["error"]["type"] == "tool_call_rejected" and "choices" not in body
    cands = body["callgate"]["candidates"]
    assert [(c["round"], c["verdict"]["verdict"]) for c in cands] == [(0, "rejected"), (1, "rejected")]
    assert cands[0]["verdict"]["errors"][0]["path"] == "/city" and cands[0]["verdict"]["retryable"] is True
    assert body["callgate"]["repairs"] == 1 and len(run.received()) == 2
    audit = run.audit()
    assert [(r["round"], r["verdict"]["verdict"]) for r in audit] == [(0, "rejected"), (1, "rejected")]
    assert [r["call_id"] for r in audit] == [c["call_id"] for c in cands]
    repair_prompt = run.engine.requests[1].prompt
    assert "the test validator does not allow get_weather" in repair_prompt and "/city" in repair_prompt
    assert 'callgate_rejection_errors_total{kind="policy"} 2.0' in run.metrics
    assert "callgate_repair_rounds_total 1.0" in run.metrics


async def test_rejected_then_accepted_returns_only_the_accepted_call(chat: Any) -> None:
    run = await chat("reject-first-then-accept", [call_text({"city": "Atlantis"}), call_text({"city": "Oslo"})])
    assert run.response.status_code == 200, run.response.text
    body = run.body
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    cands = body["callgate"]["candidates"]
    assert [c["verdict"]["verdict"] for c in cands] == ["rejected", "accepted"] and cands[1]["call_id"] == call["id"]
    assert body["callgate"]["repairs"] == 1
    repair_prompt = run.engine.requests[1].prompt
    assert "Atlantis" in repair_prompt and "the test validator does not allow" in repair_prompt
    assert [r["verdict"]["verdict"] for r in run.audit()] == ["rejected", "accepted"]


async def test_per_request_max_repairs_zero_rejects_at_once(chat: Any) -> None:
    replies = [call_text({"city": "Atlantis"}), call_text({"city": "Oslo"})]
    run = await chat("reject-first-then-accept", replies, extra={"callgate": {"max_repairs": 0}})
    assert run.response.status_code == 422 and run.body["callgate"]["repairs"] == 0
    assert len(run.received()) == 1 and len(run.engine.requests) == 1 and len(run.audit()) == 1


async def test_streamed_rejected_call_is_never_sent(chat: Any) -> None:
    replies = [call_text({"city": "Atlantis"}), call_text({"city": "Oslo"})]
    run = await chat("reject-first-then-accept", replies, stream=True)
    events = run.events()
    calls = tool_calls_in(events)
    block = final_callgate(events)
    [rejected, accepted] = block["candidates"]
    assert (rejected["verdict"]["verdict"], accepted["verdict"]["verdict"]) == ("rejected", "accepted")
    assert {tc["id"] for tc in calls if "id" in tc} == {accepted["call_id"]}
    assert "Atlantis" not in "".join(tc["function"].get("arguments", "") for tc in calls)
    assert [r["call_id"] for r in run.audit()] == [rejected["call_id"], accepted["call_id"]]


async def test_streamed_rejection_ends_with_an_error_event(chat: Any) -> None:
    run = await chat("reject", [call_text({"city": "Atlantis"})] * 2, stream=True)
    events = run.events()
    assert tool_calls_in(events) == []
    assert events[-1]["error"]["type"] == "tool_call_rejected"
    assert [c["verdict"]["verdict"] for c in events[-1]["callgate"]["candidates"]] == ["rejected", "rejected"]


# ---- no verdict: fail closed ------------------------------------------------------------------


def assert_unavailable(run: Run) -> None:
    assert run.response.status_code == 503, run.response.text
    error = run.body["error"]
    assert (error["type"], error["code"]) == ("validator_unavailable", "validator_unavailable")
    assert "choices" not in run.body
    [record] = run.audit()
    assert record["verdict"]["verdict"] == "unavailable" and record["verdict"]["error"] == error["message"]


async def test_slow_validator_hits_the_time_limit(chat: Any) -> None:
    run = await chat("slow", [call_text({"city": "Oslo"})], query="?delay_s=3", timeout_s=0.5)
    assert_unavailable(run)
    assert "no verdict within 0.5 s" in run.body["error"]["message"] and run.elapsed_s < 2.5


async def test_http_500_is_not_retried(chat: Any) -> None:
    run = await chat("500", [call_text({"city": "Oslo"})])
    assert_unavailable(run)
    assert "HTTP 500" in run.body["error"]["message"] and len(run.received()) == 1


async def test_503_is_retried_with_the_same_idempotency_key(chat: Any) -> None:
    run = await chat("503-then-ok", [call_text({"city": "Oslo"})])
    assert run.response.status_code == 200, run.response.text
    first, second = run.received()
    assert first["headers"]["idempotency-key"] == second["headers"]["idempotency-key"]
    assert first["envelope"] == second["envelope"]
    assert [r["verdict"]["verdict"] for r in run.audit()] == ["accepted"]


@pytest.mark.parametrize(("mode", "why"), [("malformed", "not JSON"), ("wrong-shape", "not a verdict")])
async def test_nonsense_answers_fail_closed(chat: Any, mode: str, why: str) -> None:
    run = await chat(mode, [call_text({"city": "Oslo"})])
    assert_unavailable(run)
    assert why in run.body["error"]["message"]


async def test_validator_down_fails_closed(chat: Any) -> None:
    with running_validator() as (base, proc):
        proc.kill()
        proc.wait()
        run = await chat("accept", [call_text({"city": "Oslo"})], base=base)
    assert_unavailable(run)
    assert "cannot reach the validator" in run.body["error"]["message"]


async def test_streamed_unavailable_validator_sends_no_call(chat: Any) -> None:
    run = await chat("500", [call_text({"city": "Oslo"})], stream=True)
    events = run.events()
    assert tool_calls_in(events) == [] and events[-1]["error"]["type"] == "validator_unavailable"
    assert [r["verdict"]["verdict"] for r in run.audit()] == ["unavailable"]


async def test_plain_answers_write_no_records(chat: Any) -> None:
    run = await chat("accept", ["Oslo is cold."])
    assert run.response.status_code == 200 and run.received() == []
    assert not run.audit_path.exists() or run.audit() == []


@pytest.mark.parametrize("stream", [False, True])
async def test_no_call_is_sent_when_its_audit_record_cannot_be_written(
    chat: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    def disk_full(self: AuditLog, records: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(AuditLog, "write", disk_full)
    run = await chat("accept", [call_text({"city": "Oslo"})], stream=stream)
    if stream:
        events = run.events()
        assert tool_calls_in(events) == [] and events[-1]["error"]["code"] == "audit_log_failed"
    else:
        assert run.response.status_code == 500 and "choices" not in run.body
        assert run.body["error"]["code"] == "audit_log_failed"
    assert len(run.received()) == 1  # the validator accepted it; the missing record withheld it
