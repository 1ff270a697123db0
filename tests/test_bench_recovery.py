"""benchmarks/bench_recovery.py: target specs, the outcome of one answer, the irrelevance
workload, and a run against a real callgate server (FakeEngine) with recovery on and off.

Does not know: the real model (the lead runs the benchmark against served models)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from callgate.serving.engines.engine import GenerationRequest
from callgate.serving.engines.fake_engine import FakeEngine
from tests.conftest import load_benchmark
from tests.test_server_app import MODEL, WEATHER, SchemaCheck, call_text, make_settings
from tests.test_server_openai import Server

bench = load_benchmark("bench_recovery")

CALL = bench.Case("simple_1", "call", ({"role": "user", "content": "Weather in Oslo?"},), (WEATHER,))
OFF_TOPIC = bench.Case("irrelevance_1", "irrelevance", ({"role": "user", "content": "Area of a circle?"},), (WEATHER,))
OUTSIDE = json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})


def test_target_specs() -> None:
    t = bench.Target.parse("callgate-off=http://h:8000/v1/#no-recover")
    assert (t.name, t.base_url, t.callgate, t.recover) == ("callgate-off", "http://h:8000/v1", True, False)
    assert bench.Target.parse("vllm=http://h:8001/v1").callgate is False
    for bad in ("nourl", "x=http://h/v1#fast"):
        with pytest.raises(SystemExit):
            bench.Target.parse(bad)


def _body(calls: list[str] = [], content: str | None = None, recovered: bool = False) -> dict[str, Any]:  # noqa: B006
    message = {"content": content, "tool_calls": [{"function": {"name": n, "arguments": "{}"}} for n in calls]}
    block = {"recoveries": [{"outcome": "recovered"}]} if recovered else {}
    return {"choices": [{"message": message, "finish_reason": "stop"}], "callgate": block}


def test_judge_names_every_outcome() -> None:
    gate, plain = bench.Target.parse("callgate=http://h/v1"), bench.Target.parse("vllm=http://h/v1")
    cases = [
        (gate, CALL, _body(["get_weather"]), "native"),
        (gate, CALL, _body(["get_weather"], recovered=True), "recovered"),
        (plain, CALL, _body(["get_weather"], recovered=True), "native"),  # only callgate's block is read
        (plain, CALL, _body(content="```json\n" + OUTSIDE + "\n```"), "lost"),
        (gate, CALL, _body(content="I cannot tell."), "text"),
        (gate, OFF_TOPIC, _body(content="pi r squared"), "answered"),
        (gate, OFF_TOPIC, _body(["get_weather"]), "called"),
        (gate, OFF_TOPIC, _body(["get_weather"], recovered=True), "wrongly_recovered"),
        (gate, OFF_TOPIC, _body(content=OUTSIDE), "lost"),
    ]
    for target, case, body, want in cases:
        assert bench.judge(target, case, 200, body).outcome == want, (target.name, case.kind, want)
    err = bench.judge(gate, CALL, 502, {"error": {"code": "model_output_error"}})
    assert err.outcome == "error" and "model_output_error" in (err.error or "")


def test_irrelevance_cases_come_from_the_wheel(tmp_path: Path) -> None:
    rows = [
        {"id": f"irrelevance_{i}", "question": [[{"role": "user", "content": f"q{i}"}]], "function": [
            {"name": "math.area", "description": "", "parameters": {"type": "dict", "properties": {
                "r": {"type": "float"}}}}]}
        for i in range(5)
    ]  # fmt: skip
    with zipfile.ZipFile(tmp_path / "bfcl_eval-0-py3-none-any.whl", "w") as z:
        z.writestr("bfcl_eval/data/BFCL_v4_irrelevance.json", "\n".join(json.dumps(r) for r in rows))
    cases = bench.load_workload(0, 3, tmp_path)
    assert len(cases) == 3 and {c.kind for c in cases} == {"irrelevance"}
    assert cases == bench.load_workload(0, 3, tmp_path)  # seeded
    [tool] = cases[0].tools
    assert tool["function"]["name"] == "math_area"
    assert tool["function"]["parameters"]["properties"]["r"] == {"type": "number"}


@pytest.fixture
def server() -> Iterator[Server]:
    def respond(req: GenerationRequest) -> str:
        assert req.constraint is not None
        if ":named:" in req.constraint.key:  # the recovery round
            return call_text("get_weather", {"city": "Oslo"})
        return OUTSIDE if "Oslo" in req.prompt else "Multiply pi by r squared."

    engine = FakeEngine(respond=respond)
    with Server(make_settings(), engine, SchemaCheck()) as s:
        yield s


async def test_a_run_against_callgate_with_recovery_on_and_off(server: Server) -> None:
    results = []
    for spec in (f"callgate={server.url}/v1", f"callgate-off={server.url}/v1#no-recover"):
        target = bench.Target.parse(spec)
        results += await bench.run_target(target, [CALL, OFF_TOPIC], model=MODEL, max_tokens=256, concurrency=2)
    rows = {(r["target"], r["kind"]): r for r in bench.summarise(results)}
    assert rows["callgate", "call"]["recovered"] == 1 and rows["callgate-off", "call"]["lost"] == 1
    assert rows["callgate", "irrelevance"]["answered"] == rows["callgate-off", "irrelevance"]["answered"] == 1
    assert rows["callgate", "call"]["recovered_rate"] == 1.0
    assert len(server.engine.requests) == 5  # the call case twice (+1 recovery round), the other case twice
