"""Admission: how many chat requests may be in flight at once.

Knows: the running and queue limits and the metrics gauges. Does not know: what a request is.
"""

from __future__ import annotations

from callgate.errors import RateLimitError
from callgate.serving.metrics import Metrics


class Admission:
    """At most `running + queue` chat requests in flight; beyond that 429 at once."""

    def __init__(self, running: int, queue: int, metrics: Metrics) -> None:
        self._running = running
        self._limit = running + queue
        self._in_flight = 0
        self._metrics = metrics

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def acquire(self) -> None:
        if self._in_flight >= self._limit:
            raise RateLimitError(f"server busy: {self._in_flight} requests in flight, queue full; retry later")
        self._in_flight += 1
        self._report()

    def release(self) -> None:
        self._in_flight -= 1
        self._report()

    def _report(self) -> None:
        self._metrics.admitted(self._in_flight, max(0, self._in_flight - self._running))
