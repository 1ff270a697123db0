"""bench_quick's pure helpers: the main stream's slowdown, pooled and paired by round.

Does not know: the engine or the model (benchmarks/bench_quick.py runs them).
"""

from __future__ import annotations

import pytest

from tests.conftest import load_benchmark

B = load_benchmark("bench_quick")


def _stream(beside: bool, tpot: float, rnd: int, n: int = 96) -> object:
    return B.StreamSample(n, beside, tpot, n, 0.5 if beside else 0.0, 0.3 if beside else 0.0, rnd)


def test_slowdown_is_paired_within_each_round() -> None:
    # the machine slows down between rounds: pooled medians blur it, pairs do not
    streams = [_stream(False, 10.0, 0), _stream(True, 11.0, 0), _stream(True, 13.2, 1), _stream(False, 12.0, 1)]
    assert B.paired_slowdowns(streams) == [pytest.approx(0.1), pytest.approx(0.1)]
    summary = B.summarise([], streams)["stream"]["96"]
    assert summary["slowdown_per_round"] == [0.1, 0.1]
    assert summary["slowdown_paired_median"] == 0.1
    assert summary["slowdown"] == pytest.approx(12.1 / 11.0 - 1, abs=1e-4)  # pooled medians


def test_a_round_without_its_alone_run_is_not_paired() -> None:
    streams = [_stream(False, 10.0, 0), _stream(True, 11.0, 0), _stream(True, 30.0, 1)]
    assert B.paired_slowdowns(streams) == [pytest.approx(0.1)]
