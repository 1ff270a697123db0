"""The serving benchmark's pure helpers: the requests each server gets, what counts as a
streamed token for TTFT, and the peer's command line (loopback, its own tool calling)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

bench = load_benchmark("bench_serving")
servers = load_benchmark("servers")

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = ({"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},)


def test_vllm_gets_callgates_token_ids_or_the_messages_with_tools() -> None:
    ids = [1, 2, 3]
    plain = bench.request_body("vllm", MESSAGES, ids, 8, bench.Shape())
    assert plain["prompt"] == ids and "messages" not in plain
    chat = bench.request_body("vllm", MESSAGES, ids, 8, bench.Shape("chat", TOOLS))
    assert chat["messages"] == MESSAGES and chat["tools"] == list(TOOLS) and chat["tool_choice"] == "auto"
    ours = bench.request_body("callgate", MESSAGES, ids, 8, bench.Shape("completions", TOOLS))
    assert "prompt" not in ours and ours["tools"] == list(TOOLS)
    assert "tools" not in bench.request_body("callgate", MESSAGES, ids, 8, bench.Shape())


def test_a_tool_call_delta_counts_as_a_token_an_empty_delta_does_not() -> None:
    assert bench._chunk_text({"delta": {"content": "x"}}) == "x"
    assert bench._chunk_text({"text": "y"}) == "y"
    call = {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a'}}]}}
    assert bench._chunk_text(call)
    assert bench._chunk_text({"delta": {"role": "assistant"}}) == ""
    assert bench._chunk_text({"delta": {"tool_calls": [{"index": 0}]}}) == ""


def test_the_peer_is_vllms_server_on_loopback_with_its_hermes_parser() -> None:
    cmd = servers.vllm_serve_command(
        Path("/m"), 9000, served_name="peer", max_model_len=4096, max_num_seqs=16, seed=0, tool_parser="hermes"
    )
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "9000"
    assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in cmd
    bare = servers.vllm_serve_command(
        Path("/m"), 9000, served_name="peer", max_model_len=4096, max_num_seqs=16, seed=0, tool_parser=""
    )
    assert "--enable-auto-tool-choice" not in bare
    assert servers.engine_env(2, 1)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_cpu_seconds_sums_the_server_and_the_processes_under_it() -> None:
    """A stand-in server (`--port N` in its command line) whose child burns CPU: the child's
    time counts; a port nobody listens on reads 0."""
    import subprocess
    import sys
    import time

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    parent = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", parent, "--port", "65501"])
    try:
        deadline = time.monotonic() + 20
        while servers.cpu_seconds(65501) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 0.5 <= servers.cpu_seconds(65501) < 5
        assert servers.cpu_seconds(65502) == 0.0
    finally:
        subprocess.run(["pkill", "-P", str(proc.pid)], check=False)
        proc.kill()
        proc.wait()


def test_the_round_ratios_pair_each_round_of_a_level() -> None:
    """A level's tok/s per round is tokens over that round's wall time; callgate's rounds
    are set against vLLM's of the same round, level by level."""
    samples = [bench.Sample(0.1, (), 1.0, 64), bench.Sample(0.1, (), 1.0, 64)]
    level = bench.summarise(16, samples, 2.0, windows=((64, 1.0), (66, 1.0)))
    assert level.out_tok_per_s == 64.0 and level.round_tok_per_s == (64.0, 66.0)
    vllm = bench.summarise(16, samples, 2.0, windows=((80, 1.0), (60, 1.0)))
    assert bench.round_ratios({"callgate": [level], "vllm": [vllm]}) == {"16": [0.8, 1.1]}
    assert bench.round_ratios({"callgate": [level]}) == {}


def test_a_level_interval_resamples_its_rounds_in_pairs() -> None:
    """The interval brackets the level's ratio, widens with the rounds' spread, is the same
    on every call, needs three rounds, and is read for the A/A control (vllm-b) alike."""
    samples = [bench.Sample(0.1, (), 1.0, 64)]

    def level(*tok_per_s: float) -> bench.Level:
        return bench.summarise(4, samples, 1.0, windows=tuple((int(t), 1.0) for t in tok_per_s))

    vllm = level(100, 100, 100, 100)
    steady = {"callgate": [level(98, 99, 100, 101)], "vllm": [vllm], "vllm-b": [level(90, 110, 95, 105)]}
    lo, hi = bench.intervals(steady)["4"]
    assert 0.98 <= lo < 0.995 < hi <= 1.01
    a_lo, a_hi = bench.intervals(steady, "vllm-b")["4"]
    assert a_lo < lo and a_hi > hi  # the wider rounds' spread, the wider interval
    assert bench.ratios(steady, "vllm-b") == {"4": 1.0}
    assert bench.intervals(steady) == bench.intervals(steady)
    short = {"callgate": [level(98, 99)], "vllm": [level(100, 100)]}
    assert bench.intervals(short) == {} and bench.intervals({"callgate": [vllm]}) == {}


def test_the_report_prints_and_draws_each_server_against_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the A/A control, the ratio line and the chart's third panel carry callgate's and
    vllm-b's ratios to vLLM with their intervals; the PNG is written."""
    samples = [bench.Sample(0.1, (), 1.0, 64)]

    def levels(*tok_per_s: float) -> list[bench.Level]:
        windows = tuple((int(t), 1.0) for t in tok_per_s)
        return [bench.summarise(c, samples, 1.0, windows=windows) for c in (1, 4, 16)]

    results = {"callgate": levels(99, 101, 100), "vllm": levels(100, 100, 100), "vllm-b": levels(97, 103, 99)}
    bench.print_ratios(results)
    out = capsys.readouterr().out
    assert "ratio callgate/vllm" in out and "ratio vllm-b/vllm" in out
    assert "c=16: 1.0 [" in out and "(rounds 0.99, 1.01, 1.0)" in out
    bench.chart(results, tmp_path / "serving.png", "test")
    assert (tmp_path / "serving.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_server_runs_in_every_place_of_the_round_alike() -> None:
    """Two servers alternate A B, B A; three go through all six orders, so over six rounds
    each is first, second and third twice."""
    assert bench.round_orders(["callgate", "vllm"], 4) == [("callgate", "vllm"), ("vllm", "callgate")] * 2
    orders = bench.round_orders(["callgate", "vllm", "vllm-b"], 6)
    assert len(set(orders)) == 6
    for kind in ("callgate", "vllm", "vllm-b"):
        assert sorted(o.index(kind) for o in orders) == [0, 0, 1, 1, 2, 2]


def test_a_runs_json_line_gives_back_its_levels(tmp_path: Path) -> None:
    """--chart-from reads the levels a run printed in its JSON line, intervals included."""
    samples = [bench.Sample(0.1, (0.015,), 1.0, 64)]  # no NaN percentiles (NaN != NaN)
    windows = ((64, 1.0), (66, 1.1), (63, 0.9))
    results = {k: [bench.summarise(4, samples, 1.0, windows=windows)] for k in ("callgate", "vllm")}
    line = json.dumps(
        {"model": "/m/qwen", "tools": 0, "results": {k: [asdict(lv) for lv in v] for k, v in results.items()}}
    )
    out = tmp_path / "run.txt"
    out.write_text("table\n" + line + "\n", encoding="utf-8")
    back, what = bench.results_from(out)
    assert back == results and what == "qwen, plain chat"
    assert bench.intervals(back) == bench.intervals(results)
