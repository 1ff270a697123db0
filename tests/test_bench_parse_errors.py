"""The parse-error benchmark's pure helpers: BFCL schema conversion, the cases' named choice,
the metrics of a configuration (finishes, parse errors over all outputs), the targets, the
combined report, the engine step-log reader, and the vLLM structural tag it sends.

Does not know: the engine or the model (benchmarks/bench_parse_errors.py runs them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_benchmark

bench = load_benchmark("bench_parse_errors")
pst = load_benchmark("parse_error_scores")

ROW: dict[str, Any] = {
    "id": "parallel_7",
    "question": [[{"role": "user", "content": "Find the area of circles of radius 3 and 5."}]],
    "function": [
        {
            "name": "geometry.area_circle",
            "description": "Area of a circle.",
            "parameters": {
                "type": "dict",
                "properties": {
                    "radius": {"type": "float", "description": "radius"},
                    "units": {"type": "string", "optional": True},
                    "tags": {"type": "tuple", "items": {"type": "any"}},
                },
                "required": ["radius", "ghost"],
            },
        },
        {"name": "other", "parameters": {"type": "dict", "properties": {}}},
    ],
}
TRUTH = [{"geometry.area_circle": {"radius": [3.0]}}, {"geometry.area_circle": {"radius": [5.0]}}]


def test_convert_maps_bfcl_types_and_keeps_the_rest() -> None:
    schema = bench.convert(ROW["function"][0]["parameters"])
    assert schema == {
        "type": "object",
        "properties": {
            "radius": {"type": "number", "description": "radius"},
            "units": {"type": "string"},
            "tags": {"type": "array", "items": {}},
        },
        "required": ["radius"],
    }


def test_case_names_bfcl_first_expected_function_in_legal_spelling() -> None:
    case = bench.make_case(ROW, TRUTH)
    assert case.named == "geometry_area_circle"
    assert case.expected == frozenset({"geometry_area_circle"})
    assert [t["function"]["name"] for t in case.tools] == ["geometry_area_circle", "other"]
    assert bench.tool_choice("named", case) == {"type": "function", "function": {"name": "geometry_area_circle"}}
    assert bench.tool_choice("required", case) == "required"


def test_case_without_ground_truth_names_its_first_tool() -> None:
    assert bench.make_case(ROW, []).named == "geometry_area_circle"


def _outcome(finish: str | None, tokens: int, diagnostics: tuple[str, ...] = (), calls: int = 1) -> Any:
    return bench.Outcome("c", finish, diagnostics, calls, calls, calls > 0, tokens)


def test_summary_counts_cut_outputs_as_parse_errors_and_splits_budget_finishes() -> None:
    res = bench.ConfigResult("hermes", "callgate", "required", max_tokens=10)
    res.outcomes = [
        _outcome("stop", 6),  # natural
        _outcome("stop", 10),  # EOS as the last allowed token: closed by the budget
        _outcome("length", 10, ("unterminated_block",), calls=0),  # cut
        bench.Outcome("r", None, (), 0, 0, False, 0, refused="too complex"),
    ]
    res.decode_wall_s = 2.0
    s = bench.summarise(res)
    assert (s["ran"], s["refused"], s["natural"], s["closed_at_budget"], s["cut_at_budget"]) == (3, 1, 1, 1, 1)
    assert s["parse_error_rate"] == round(1 / 3, 4)
    assert s["parse_error_rate_eos"] == 0.0
    assert s["call_rate"] == round(2 / 3, 4)
    assert s["tok_per_s"] == 13.0
    assert s["diagnostic_codes"] == {"unterminated_block": 1}
    assert s["first_refusal"] == "too complex"
    assert s["mask_us_p50"] is None and s["compile_ms_p50"] is None


def test_targets_need_zero_errors_full_validity_and_speed() -> None:
    base: dict[str, Any] = {
        "format": "hermes",
        "ran": 5,
        "parse_error_rate": 0.0,
        "schema_valid_rate": 1.0,
        "mask_us_p50": 40.0,  # the whole step
        "mask_fill_kernel_us_p50": 20.0,  # the mask: fill and kernel
    }
    rows = [
        {**base, "system": "callgate", "mode": "unconstrained", "tok_per_s": 100.0, "mask_us_p50": None}
        | {"full_batch_tok_per_s": 200.0},
        {**base, "system": "callgate", "mode": "required", "tok_per_s": 95.0, "full_batch_tok_per_s": 188.0},
        {**base, "system": "callgate", "mode": "named", "tok_per_s": 80.0, "parse_error_rate": 0.2}
        | {"full_batch_tok_per_s": 192.0, "mask_fill_kernel_us_p50": 45.0, "vocab_size": 151_936},
        {**base, "system": "vllm", "mode": "required", "tok_per_s": 10.0, "parse_error_rate": 1.0},
    ]
    t = bench.targets(rows)
    assert t["hermes_required_zero_parse_errors"]
    assert not t["hermes_required_full_batch_tok_s_ge_95pct"]  # 0.94 of unconstrained at full batch
    assert t["hermes_required_mask_p50_le_30us"]  # no vocabulary size: the small one's target
    assert not t["hermes_named_zero_parse_errors"] and t["hermes_named_full_batch_tok_s_ge_95pct"]
    assert not t["hermes_required_whole_step_p50_le_30us"]  # 40 us with advance, closing, loop
    assert t["hermes_named_mask_p50_le_60us"] and "hermes_named_mask_p50_le_30us" not in t
    assert t["hermes_named_whole_step_p50_le_60us"]
    # at the full batch where the log has such steps (a draining batch's few-row steps aside)
    rows[1] |= {"mask_fill_kernel_us_p50_full_batch": 35.0, "mask_us_p50_full_batch": 25.0}
    t = bench.targets(rows)
    assert not t["hermes_required_mask_p50_le_30us"] and t["hermes_required_whole_step_p50_le_30us"]
    assert not any(k.startswith("hermes_unconstrained") for k in t)
    rows[1] |= {"mask_fill_kernel_us_p50_full_batch": 0.0}  # a figure, not a missing one
    assert bench.targets(rows)["hermes_required_mask_p50_le_30us"]


def test_the_paired_ratio_is_the_median_of_each_round_s_chunk_ratios() -> None:
    """Round by round, a chunk's full-batch tok/s over the unconstrained chunk's: one slow
    minute on one chunk (round 2 here) moves one pair, not the median; rounds where either
    chunk had no full-batch window are left out."""
    free = {"full_batch_chunk_tok_per_s": [100.0, 100.0, 100.0, 100.0, None]}
    row = {"full_batch_chunk_tok_per_s": [97.0, 98.0, 60.0, 99.0, 50.0]}
    assert abs(pst.paired_ratio(row, free) - 0.975) < 1e-9  # median of 0.97, 0.98, 0.6, 0.99
    summed = sum(row["full_batch_chunk_tok_per_s"][:4]) / 400  # the summed ratio feels round 2
    assert summed < 0.9
    assert pst.paired_ratio({"full_batch_chunk_tok_per_s": [None]}, free) is None
    assert pst.paired_ratio(row, None) is None
    rows = [
        {"format": "hermes", "system": "callgate", "mode": "unconstrained", "ran": 5, **free},
        {"format": "hermes", "system": "callgate", "mode": "required", "ran": 5, **row}
        | {"parse_error_rate": 0.0, "schema_valid_rate": 1.0, "mask_us_p50": None},
    ]
    assert bench.targets(rows)["hermes_required_full_batch_paired_median_ge_95pct"]


def test_chart_from_combines_the_last_json_line_of_each_run(tmp_path: Path) -> None:
    paths = []
    for fmt in ("hermes", "qwen3-xml"):
        row: dict[str, Any] = {"format": fmt, "system": "callgate", "mode": "required", "ran": 1, "tok_per_s": 1.0}
        row |= {"parse_error_rate": 0.0, "schema_valid_rate": 1.0, "mask_us_p50": None}
        doc = {"env": {"cases": 1}, "wall_s": 3.0, "results": [row]}
        path = tmp_path / f"{fmt}.out"
        path.write_text("table\n{not the last}\n" + json.dumps(doc) + "\n")
        paths.append(str(path))
    combined = bench.combine(bench.load_docs(",".join(paths)))
    assert [r["format"] for r in combined["results"]] == ["hermes", "qwen3-xml"]
    assert combined["targets_met"]["qwen3-xml_required_zero_parse_errors"]


def test_the_ratio_interval_resamples_rounds_in_pairs() -> None:
    """The bootstrap interval of the summed full-batch ratio: rounds that all read 0.95 give
    0.95 at both ends; a run whose rounds spread gives an interval that holds the summed
    ratio and is as wide as the spread allows, the same on every call (seeded); fewer than
    three rounds, or no baseline, give none."""
    free = {"full_batch_chunks": [[100, 1.0], [200, 2.0], [150, 1.5], [100, 1.0]]}
    even = {"full_batch_chunks": [[95, 1.0], [190, 2.0], [142.5, 1.5], [95, 1.0]]}
    lo, hi = pst.ratio_interval(even, free)
    assert abs(lo - 0.95) < 1e-9 and abs(hi - 0.95) < 1e-9
    spread = {"full_batch_chunks": [[80, 1.0], [220, 2.0], [135, 1.5], [105, 1.0], [0, 0.0]]}
    lo, hi = pst.ratio_interval(spread, free)
    summed = (80 + 220 + 135 + 105) / 5.5 / (550 / 5.5)
    assert 0.8 <= lo < summed < hi <= 1.1
    assert pst.ratio_interval(spread, free) == (lo, hi)
    assert pst.ratio_interval({"full_batch_chunks": spread["full_batch_chunks"][:2]}, free) is None
    assert pst.ratio_interval(spread, None) is None
    rows = [
        {"format": "hermes", "system": "callgate", "mode": "unconstrained", **free},
        {"format": "hermes", "system": "callgate", "mode": "required", **spread},
        {"format": "hermes", "system": "vllm", "mode": "named", "full_batch_chunks": []},
    ]
    assert pst.intervals(rows) == {"hermes_callgate_required": [round(lo, 3), round(hi, 3)]}


def test_engine_mask_log_host_share_is_the_steps_time_over_the_windows_wall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from callgate.decoding.step_log import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "")
    path = tmp_path / "steps.log"
    log = bench.EngineMaskLog(path)
    path.write_text("40 2 0 100 1\n30 3 10 200 3\n50 1 0 300 0\n60 2 0 1500 2\n")
    assert log.host_share([(100, 1100)]) == round(120 / 1000, 4)  # the step at 1500 is outside
    assert log.host_share([(100, 1100), (1400, 1600)]) == round(180 / 1200, 4)
    assert log.host_share([(2000, 3000)]) == 0.0 and log.host_share([]) is None


def test_engine_mask_log_reads_the_steps_inside_a_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from callgate.decoding.step_log import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "")
    path = tmp_path / "steps.log"
    log = bench.EngineMaskLog(path)
    assert bench.os.environ[ENV_VAR] == str(path)
    assert log.now() <= log.now()
    path.write_text("4000 2 0 100 1\n9000 0 0 150\n30000 3 1000 200 3\n50000 1 0 300 0\n60000 2 0 400 2\n7")
    assert log.token_us([(200, 300)]) == [10.0, 50.0]  # before, after and torn lines left out
    assert log.token_us([(200, 300)], budget=False) == [29000 / 3 / 1e3, 50.0]
    assert log.token_us([(500, 600)]) == []
    assert log.token_us([(50, 120), (390, 410)]) == [2.0, 30.0]  # a configuration's chunks
    assert log.passed_share([(200, 300)]) == 0.75 and log.passed_share([(500, 600)]) is None
    assert log.fill_kernel_us([(200, 300)]) == [] and log.part_shares([(200, 300)]) is None  # no parts
    # with the step's parts: advance, fill, check, kernel (the loop is what is left)
    path.write_text("30000 3 3000 200 3 6000 9000 3000 0\n20000 1 0 250 0 1000 4000 0 5000\n")
    assert log.fill_kernel_us([(200, 300)]) == [4.0, 9.0]
    assert log.fill_kernel_us([(200, 300)], rows=3) == [4.0]  # the full batch's steps only
    assert log.token_us([(200, 300)], rows=3) == [10.0] and log.token_us([(200, 300)], rows=16) == []
    assert log.part_shares([(200, 300)]) == {
        "advance": 1.8,
        "closing": 0.8,
        "fill": 3.2,
        "check": 0.8,
        "kernel": 1.2,
        "loop": 4.8,
    }


def test_interleaved_configurations_take_one_chunk_each_in_turning_order(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, list[str]]] = []

    async def chunk(engine: Any, ctx: Any, res: Any, pending: list[Any], batch: int) -> None:
        taken = [pending.pop(0).id for _ in range(min(batch, len(pending)))]
        ran.append((res.mode, taken))

    monkeypatch.setattr(bench, "run_chunk", chunk)
    cases = [bench.Case(f"c{i}", (), (), frozenset({"f"}), "f") for i in range(5)]
    configs = [bench.ConfigResult("hermes", "callgate", m, 128) for m in ("unconstrained", "required", "named")]
    bench.asyncio.run(bench.run_interleaved(None, None, configs, cases, 2))
    u, r, n = "unconstrained", "required", "named"
    assert [mode for mode, _ in ran] == [u, r, n, r, n, u, n, u, r]  # three rounds, each turned by one
    for mode in ("unconstrained", "required", "named"):  # each its own cases, in order
        assert [c for m, taken in ran if m == mode for c in taken] == [f"c{i}" for i in range(5)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vLLM's OpenAI entrypoints import torch.jit
def test_vllm_tag_for_a_named_hermes_call_pins_that_function() -> None:
    pytest.importorskip("vllm")
    case = bench.make_case(ROW, TRUTH)
    tag = json.loads(bench.vllm_structural_tag("hermes", "named", case))
    text = json.dumps(tag)
    assert tag["type"] == "structural_tag"
    assert '"name\\": \\"geometry_area_circle' in text
    assert '\\"other' not in text


def test_the_control_configuration_is_the_unconstrained_one_again() -> None:
    """`control` sends the same prompt as `unconstrained`, with no grammar and no compile;
    `auto` builds one."""
    case = bench.make_case(ROW, TRUTH)
    free, free_s = bench.prepare("hermes", "callgate", "unconstrained", case, None, None, 128)
    control, control_s = bench.prepare("hermes", "callgate", "control", case, None, None, 128)
    assert (control.prompt, control.ref, control_s) == (free.prompt, None, None) and free_s is None
    auto, auto_s = bench.prepare("hermes", "callgate", "auto", case, None, None, 128)
    assert auto.ref is not None and auto_s is not None and auto.prompt == free.prompt


def test_the_full_batch_window_counts_tokens_while_every_request_decodes() -> None:
    a = [(1.0, 1), (2.0, 1), (3.0, 2), (4.0, 1)]  # first token at 1.0, last at 4.0
    b = [(1.5, 1), (2.5, 1), (3.5, 1)]  # prefilled last (1.5), finished first (3.5)
    tokens, seconds = bench.full_batch_window([a, b])
    assert (tokens, seconds) == (1 + 2 + 1 + 1, 2.0)  # a at 2.0 and 3.0, b at 2.5 and 3.5
    assert bench.full_batch_window([a, []]) == (0, 0.0)  # one request alone: no batch
    assert bench.full_batch_window([[(1.0, 1), (2.0, 1)], [(3.0, 1)]]) == (0, 0.0)  # never all at once
