"""bench_compile's pure helpers on one tiny cell over a byte vocabulary: the cells' fields
and statuses (every family compiles; one still unwritten would be "not yet", a refusal is
"refused: ..."), the run's JSON document, the report (summary, table, chart), and the
killable child of the old path.

Does not know: timings (no figure is asserted beyond its shape); the real vocabularies
(benchmarks/bench_compile.py runs them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from callgate.constraints import lark_dsml
from callgate.errors import SchemaTooComplexError
from tests.conftest import load_benchmark

bench = load_benchmark("bench_compile")
import compile_baseline  # noqa: E402  (bench_compile put benchmarks/ on sys.path)
import compile_cells  # noqa: E402
import compile_report  # noqa: E402
import compile_workload  # noqa: E402
from vocabularies import byte_vocab  # noqa: E402

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
TINY = compile_workload.ToolSet("tiny", ((WEATHER,),))
FIGURES = ("cold_p50_ms", "cold_p99_ms", "cold_cpu_p50_ms", "cold_cpu_p99_ms", "warm_p50_ms", "warm_p99_ms")


@pytest.fixture(scope="module")
def engine() -> Any:
    return compile_cells.Engine(byte_vocab())


def _figures_are_sane(cell: dict[str, Any]) -> None:
    for key in FIGURES:
        assert isinstance(cell[key], float) and cell[key] >= 0, key
    assert cell["cold_p50_ms"] <= cell["cold_p99_ms"]


def test_an_engine_cell_has_every_field(engine: Any) -> None:
    cell = compile_cells.engine_cell(engine, "hermes", "required", TINY, 3)
    assert cell["status"] == "ok" and cell["n"] == 3
    assert (cell["format"], cell["mode"], cell["tools"], cell["vocab"]) == ("hermes", "required", "tiny", "bytes")
    assert cell["grammar_chars"] > 0
    _figures_are_sane(cell)


@pytest.mark.parametrize("mode", bench.MODES)
def test_every_mode_of_every_format_compiles(engine: Any, mode: str) -> None:
    for fmt in compile_workload.FORMATS:
        cell = compile_cells.engine_cell(engine, fmt, mode, TINY, 1)
        assert cell["status"] == "ok", (fmt, mode, cell["status"])


def test_a_schema_the_engine_cannot_enforce_is_a_refused_cell(engine: Any) -> None:
    bad = {**WEATHER, "function": {"name": "f", "parameters": {"type": "object", "not": {"required": ["x"]}}}}
    cell = compile_cells.engine_cell(engine, "hermes", "required", compile_workload.ToolSet("bad", ((bad,),)), 2)
    assert cell["status"].startswith("refused: ") and "not" in cell["status"]
    assert cell["n"] == 0


def test_status_names_an_unwritten_family_not_yet() -> None:
    assert compile_cells.status_of(NotImplementedError("later")) == "not yet"
    missing = AttributeError("no content", name="content", obj=lark_dsml)
    assert compile_cells.status_of(missing) == "not yet"
    assert compile_cells.status_of(AttributeError("x", name="y", obj=object())).startswith("error: AttributeError")
    assert compile_cells.status_of(SchemaTooComplexError("keyword not", param="tools")) == "refused: keyword not"
    assert compile_cells.status_of(ValueError("boom\nmore")) == "error: ValueError: boom"


def test_renamed_tools_are_a_fresh_request() -> None:
    fresh = compile_workload.renamed([WEATHER], "_7")
    assert fresh[0]["function"]["name"] == "get_weather_7"
    assert WEATHER["function"]["name"] == "get_weather"
    schema = compile_workload.call_schema([WEATHER, *fresh])
    assert [b["properties"]["name"]["const"] for b in schema["anyOf"]] == ["get_weather", "get_weather_7"]
    tools, choice, _, response = compile_workload.request_args("named", [WEATHER])
    assert choice == {"type": "function", "function": {"name": "get_weather"}} and response is None
    tools, choice, _, response = compile_workload.request_args("response_format", [WEATHER])
    assert tools is None and response["json_schema"]["schema"]["properties"]["name"] == {"const": "get_weather"}


def test_stats_are_p50_and_nearest_rank_p99() -> None:
    assert compile_cells.stats([0.001, 0.003, 0.002]) == {"p50_ms": 2.0, "p99_ms": 3.0}
    assert compile_cells.stats([]) == {"p50_ms": None, "p99_ms": None}


@pytest.mark.parametrize("cell", [compile_cells.xgrammar_cell, compile_cells.llg_json_cell])
def test_peer_cells(cell: Any) -> None:
    row = cell(byte_vocab(), TINY, 2)
    assert row["status"] == "ok" and row["n"] == 2 and row["tools"] == "tiny"
    assert row["cold_p50_ms"] >= 0 and row["cold_cpu_p50_ms"] >= 0


def test_the_run_is_one_json_document_with_a_report(tmp_path: Path) -> None:
    args = bench.parse_args(["--formats", "hermes,qwen3-xml", "--modes", "required,none", "--repeats", "2"])
    args.baseline_cells = 0
    doc = bench.run(args, sets=[TINY], vocabs=[byte_vocab()])
    assert json.loads(json.dumps(doc)) == doc
    assert {(c["format"], c["mode"]) for c in doc["cells"]} == {
        ("hermes", "required"),
        ("hermes", "none"),
        ("qwen3-xml", "required"),
        ("qwen3-xml", "none"),
    }
    assert [p["engine"] for p in doc["peers"]] == ["xgrammar", "llguidance-json"]
    assert doc["env"]["load_start"] and doc["env"]["load_end"]
    summary = doc["summary"]
    assert summary["statuses"] == {"ok": 4}
    text = compile_report.table(doc)
    assert "| bytes | tiny | hermes |" in text and "xgrammar" in text
    chart = tmp_path / "compile.png"
    compile_report.chart(doc, chart)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_lists_the_cells_past_a_target() -> None:
    cells = [
        {"format": "hermes", "mode": "auto", "tools": "t", "vocab": "v", "status": "ok"}
        | dict.fromkeys(FIGURES, 0.5)
        | {"cold_p99_ms": 300.0},
        {"format": "mistral", "mode": "auto", "tools": "t", "vocab": "v", "status": "not yet"},
        {"format": "dsml-v4", "mode": "auto", "tools": "t", "vocab": "v", "status": "refused: keyword not"},
    ]
    s = compile_report.summary(cells, bench.TARGETS)
    assert s["statuses"] == {"ok": 1, "not yet": 1, "refused": 1}
    assert s["past_target"] == [{"cell": "hermes/auto t v", "key": "cold_p99_ms", "value": 300.0, "target": 250.0}]
    assert not s["all_ok_meet_targets"]


def test_the_old_path_runs_in_a_child_and_reports_its_compile() -> None:
    plain = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "object", "properties": {}}}}
    tools = compile_workload.ToolSet("plain", ((plain,),))
    cell = compile_baseline.baseline_cell("hermes", "required", tools, byte_vocab(), cap_s=120)
    assert cell["status"] == "ok" and cell["cold_ms"] > 0 and cell["regex_chars"] > 0
    refused = compile_baseline.baseline_cell("hermes", "required", TINY, byte_vocab(), cap_s=120)
    assert refused["status"].startswith("refused: ") and "minimum" in refused["status"]  # the old path's limits
    assert compile_baseline.baseline_plan(2, ["hermes"], ["agent-12", "64-tools"], ["smollm2"]) == [
        ("hermes", "required", "agent-12", "smollm2"),
        ("hermes", "required", "64-tools", "smollm2"),
    ]


def ready_then_sleep(conn: Any) -> None:
    conn.send(("ready",))
    time.sleep(60)


def never_ready(conn: Any) -> None:
    raise SystemExit(3)


def test_a_child_past_its_cap_is_killed_and_a_dead_one_reported() -> None:
    assert compile_baseline.run_capped(ready_then_sleep, (), cap_s=0.2) == ("timeout", 0.2)
    status, message = compile_baseline.run_capped(never_ready, (), cap_s=0.2)
    assert status == "error" and "died" in message
