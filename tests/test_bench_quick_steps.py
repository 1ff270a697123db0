"""bench_quick_steps' pure helpers: how a stream's gaps split into launch and decode excess,
how many prompt tokens a head prefills past the blocks it shares, and the summary.

Does not know: the engine or the model (benchmarks/bench_quick_steps.py runs them).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import load_benchmark

B = load_benchmark("bench_quick_steps")


def test_excess_splits_at_the_launch_steps() -> None:
    gaps = [30.0, 12.0, 100.0, 10.0, 13.0, 10.0, 11.0]
    launch, rest = B.split_excess(gaps, 10.0)
    assert launch == pytest.approx(20.0 + 2.0 + 90.0 + 0.0)
    assert rest == pytest.approx(3.0 + 0.0 + 1.0)
    assert B.split_excess([9.0, 9.0], 10.0) == (pytest.approx(-2.0), 0)


@pytest.mark.parametrize(
    ("main", "head", "block", "want"),
    [
        (list(range(100)), [*range(70), 7, 8, 9], 32, 73 - 64),  # diverges at 70: blocks 0-63 shared
        (list(range(64)), [*range(64), 1, 2], 32, 2),  # shares two whole blocks
        (list(range(10)), [5, *range(10)], 32, 11),  # nothing shared
        (list(range(40)), list(range(31)), 32, 31),  # a partial block is never shared
    ],
)
def test_uncached_tokens_count_from_the_last_shared_full_block(
    main: list[int], head: list[int], block: int, want: int
) -> None:
    assert B.uncached_tokens(main, head, block) == want


def _run(config: str, gaps: list[float], rnd: int = 0, cpu: float = 0.05) -> dict[str, Any]:
    return {
        "config": config,
        "round": rnd,
        "tokens": len(gaps) + 1,
        "tpot_ms": sum(gaps) / len(gaps),
        "gaps_ms": gaps,
        "frontend_cpu_s": cpu,
    }


def test_summary_measures_each_run_against_its_own_rounds_alone_run() -> None:
    alone = [_run("alone", [10.0] * 8, 0), _run("alone", [20.0] * 8, 1)]
    heads = [
        _run("heads", [40.0, 10.0, 10.0, 10.0, 12.0, 12.0, 10.0, 10.0], 0),
        _run("heads", [50.0, 20.0, 20.0, 20.0, 22.0, 20.0, 20.0, 20.0], 1),
    ]
    s = B.summarise(alone + heads)
    assert s["alone_step_ms_median"] == 15.0
    assert s["heads"]["slowdown_per_round"] == [pytest.approx(0.425), pytest.approx(0.2)]
    assert s["heads"]["launch_excess_ms_median"] == 30.0  # 30 in both rounds, each against its own step
    assert s["heads"]["rest_excess_ms_median"] == 3.0  # 4 and 2
    assert s["heads"]["largest_gap_ms_median"] == 45.0
    assert "long-1" not in s  # configurations that did not run are left out


def test_a_run_without_an_alone_run_in_its_round_is_not_counted() -> None:
    s = B.summarise([_run("alone", [10.0] * 4, 0), _run("heads", [30.0] * 4, 1)])
    assert "heads" not in s
