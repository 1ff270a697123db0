"""Mask-time records: recent per-step times of the constrained-decoding processor.

Knows: percentiles over a bounded window. Does not know: what was masked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class MaskTimings:
    """Recent per-step mask times (bounded), and per constrained token."""

    def __init__(self, capacity: int = 65536) -> None:
        self.step_ns: deque[int] = deque(maxlen=capacity)
        self.token_ns: deque[float] = deque(maxlen=capacity)

    def record(self, elapsed_ns: int, rows: int) -> None:
        if rows:
            self.step_ns.append(elapsed_ns)
            self.token_ns.append(elapsed_ns / rows)

    def summary(self) -> dict[str, float]:
        """{"steps", "p50_step_us", "p99_step_us", "p50_token_us", "p99_token_us"} (0 when empty)."""
        return {
            "steps": float(len(self.step_ns)),
            "p50_step_us": _percentile(self.step_ns, 50) / 1e3,
            "p99_step_us": _percentile(self.step_ns, 99) / 1e3,
            "p50_token_us": _percentile(self.token_ns, 50) / 1e3,
            "p99_token_us": _percentile(self.token_ns, 99) / 1e3,
        }


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))])


STEP_TIMINGS = MaskTimings()


def mask_time_summary() -> dict[str, float]:
    """Mask-time percentiles of every ConstrainedBatch in this process."""
    return STEP_TIMINGS.summary()
