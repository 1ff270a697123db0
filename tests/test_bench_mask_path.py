"""benchmarks/bench_mask_path.py on the embedded model's real vocabulary: callgate's processor
and outlines' llguidance processor, fed the same grammar and logits, both let the scripted
calls through (a mask that refused a valid token, or admitted a better-scored wrong one,
fails the run), and the JSON line reports every cell."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_mask_path


def test_both_processors_follow_the_scripted_calls(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_mask_path.main(
        ["--vocabs", "smollm2", "--batches", "2", "--modes", "required,auto", "--repeats", "1", "--no-chart"]
    )
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert [(r["mode"], r["batch"]) for r in doc["results"]] == [("required", 2), ("auto", 2)]
    for row in doc["results"]:
        assert row["masks_agree"] is True
        assert row["steps"] > 20 and row["callgate_p50_step_us"] > 0 and row["outlines_p50_step_us"] > 0
        assert row["closing_p50_step_us"] > 0  # budget closing on, and the script still went through
        assert row["greedy_p50_row_us"] > 0  # greedy rows (left unmasked), the script still went through
        assert 0 < row["kernel_share"] <= 1
