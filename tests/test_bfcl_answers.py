"""BFCL possible answers: expected arguments of a call set, and the irrelevance cases."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from tests.conftest import load_benchmark

answers = load_benchmark("bfcl_answers")
bench = load_benchmark("bench_parse_errors")

TRUTH = (
    {"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
    {"spotify.play": {"artist": ["Maroon 5"], "duration": [15, 15.0], "shuffle": ["", False]}},
)


def test_parallel_calls_match_in_any_order_with_optional_parameters_left_out() -> None:
    calls = [
        ("spotify_play", {"artist": "maroon 5", "duration": 15}),
        ("spotify_play", {"artist": "Taylor Swift", "duration": 20}),
    ]
    assert answers.matches_ground_truth(calls, TRUTH)


def test_a_wrong_value_a_missing_required_or_an_extra_argument_fails() -> None:
    ok = ("spotify_play", {"artist": "Taylor Swift", "duration": 20})
    assert not answers.matches_ground_truth([ok, ("spotify_play", {"artist": "Maroon 5", "duration": 16})], TRUTH)
    assert not answers.matches_ground_truth([ok, ("spotify_play", {"artist": "Maroon 5"})], TRUTH)
    extra = ("spotify_play", {"artist": "Maroon 5", "duration": 15, "volume": 3})
    assert not answers.matches_ground_truth([ok, extra], TRUTH)


def test_the_number_of_calls_and_the_function_must_match() -> None:
    ok = ("spotify_play", {"artist": "Taylor Swift", "duration": 20})
    assert not answers.matches_ground_truth([ok], TRUTH)
    assert not answers.matches_ground_truth([ok, ok, ok], TRUTH)
    assert not answers.matches_ground_truth([("other", {"artist": "Maroon 5", "duration": 15}), ok], TRUTH)
    assert not answers.matches_ground_truth([], ())


def test_values_compare_as_bfcl_does() -> None:
    assert answers.same_value("New York, NY", "new york ny")
    assert answers.same_value(3, 3.0) and not answers.same_value(3.5, 3)
    assert not answers.same_value(1, True) and answers.same_value(True, True)
    assert answers.same_value([1, "A-b"], [1, "ab"]) and not answers.same_value([1], [1, 2])
    assert answers.same_value({"x": 1}, {"x": [1]})  # nested objects are possible-answer maps too


def _wheel(tmp_path: Path) -> Path:
    wheel = tmp_path / "bfcl_eval-0-py3-none-any.whl"
    rows = [
        {"id": f"irrelevance_{i}", "question": [[{"role": "user", "content": f"q{i}"}]],
         "function": [{"name": "geo.area", "description": "", "parameters": {"type": "dict", "properties": {}}}]}
        for i in range(5)
    ]  # fmt: skip
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("bfcl_eval/data/BFCL_v4_irrelevance.json", "\n".join(json.dumps(r) for r in rows))
    return wheel


def test_irrelevance_cases_run_only_where_no_call_is_forced(tmp_path: Path) -> None:
    _wheel(tmp_path)
    cases = bench.load_irrelevance(3, tmp_path)
    assert len(cases) == 3 and {c.kind for c in cases} == {"irrelevance"}
    assert cases[0].tools[0]["function"]["name"] == "geo_area" and cases[0].truth == ()
    assert cases == bench.load_irrelevance(3, tmp_path)  # seeded
    assert [m for m in ("unconstrained", "control", "auto", "required", "named") if bench.runs(m, cases[0])] == [
        "unconstrained",
        "control",
        "auto",
    ]


def _case(kind: str = "call") -> object:
    tools = ({"type": "function", "function": {"name": "spotify_play", "parameters": {"type": "object"}}},)
    truth = TRUTH if kind == "call" else ()
    return bench.Case("c", (), tools, frozenset({"spotify_play"}), "spotify_play", truth, kind)


def test_a_server_reply_is_scored_as_a_client_sees_it() -> None:
    from openai_peer import Reply

    good = Reply("", (("spotify_play", '{"artist": "Taylor Swift", "duration": 20}'),
                      ("spotify_play", '{"artist": "Maroon 5", "duration": 15}')), "tool_calls", 30, 1.0)  # fmt: skip
    o = bench.judge_reply(_case(), good)
    assert (o.finish, o.calls, o.schema_valid, o.expected_hit, o.expected_args, o.diagnostics) == (
        "stop", 2, 2, True, True, (),
    )  # fmt: skip
    broken = Reply("<tool_call>\n{oops", (("spotify_play", "{not json"),), "stop", 9, 1.0)
    assert bench.judge_reply(_case(), broken).diagnostics == ("invalid_arguments_json", "call_markup_in_content")
    as_text = Reply('```json\n{"name": "spotify_play", "arguments": {}}\n```', (), "stop", 9, 1.0)
    o = bench.judge_reply(_case(), as_text)
    assert o.text_call and o.calls == 0 and o.diagnostics == ()
    failed = bench.judge_reply(_case(), Reply("", (), None, 0, 1.0, error="APIError: 500"))
    assert not failed.ran


def test_the_summary_splits_call_cases_from_irrelevance() -> None:
    res = bench.ConfigResult("hermes-qwen2.5", "vllm-serve", "auto", 64, decode_wall_s=2.0)
    from openai_peer import Reply

    call = Reply("", (("spotify_play", '{"artist": "Taylor Swift", "duration": 20}'),), "tool_calls", 20, 1.0)
    text = Reply('{"name": "spotify_play"}', (), "stop", 10, 1.0)
    res.outcomes = [bench.judge_reply(_case(), call), bench.judge_reply(_case(), text)]
    res.outcomes += [bench.judge_reply(_case("irrelevance"), text), bench.judge_reply(_case("irrelevance"), call)]
    row = bench.summarise(res)
    assert (row["cases"], row["ran"], row["irrelevance_cases"]) == (2, 2, 2)
    assert (row["call_rate"], row["expected_arguments_rate"], row["text_call_rate"]) == (0.5, 0.0, 0.5)
    assert row["irrelevance_no_call_rate"] == 0.5
    assert row["tok_per_s"] == 30.0  # every output's tokens over the wall time
