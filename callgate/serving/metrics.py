"""Prometheus metrics of one server.

Knows: what the server counts (requests by status, tokens, time to first token,
inter-token latency, queue depth, parse diagnostics by code, verdicts, rejection errors by
kind, repair rounds, recoveries of calls written outside the markup, validator latency) and
how to render them. Each app gets its own registry, so several apps in one process (tests)
never collide.
Does not know: HTTP routes or the chat flow; callers report facts through small methods.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The counters of one app. Methods are cheap; label values come from closed sets."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "callgate_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self._prompt_tokens = Counter("callgate_prompt_tokens", "Prompt tokens processed", registry=r)
        self._completion_tokens = Counter("callgate_completion_tokens", "Completion tokens generated", registry=r)
        self._ttft = Histogram(
            "callgate_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self._itl = Histogram(
            "callgate_inter_token_latency_seconds", "Time between deltas", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self._in_flight = Gauge("callgate_requests_in_flight", "Admitted chat requests", registry=r)
        self._queue = Gauge("callgate_queue_depth", "Admitted requests waiting beyond the running batch", registry=r)
        self._diagnostics = Counter("callgate_parse_diagnostics", "Parser diagnostics by code", ["code"], registry=r)
        self._verdicts = Counter("callgate_verdicts", "Validator verdicts", ["verdict"], registry=r)
        self._repairs = Counter("callgate_repair_rounds", "Repair rounds run", registry=r)
        self._recoveries = Counter(
            "callgate_recoveries",
            "Answers that were a call written outside the call markup, by what was done (serving/recovery.py)",
            ["outcome"],
            registry=r,
        )
        self._rejections = Counter(
            "callgate_rejection_errors", "Validator errors in rejected verdicts, by kind", ["kind"], registry=r
        )
        self._validator_s = Histogram(
            "callgate_validator_latency_seconds",
            "Time to get the verdicts of one round's candidates",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )

    def track_running(self, running: Callable[[], int]) -> None:
        """Export the engine's running-request count, read at scrape time."""
        Gauge("callgate_engine_running", "Requests running in the engine", registry=self.registry).set_function(running)

    def request(self, route: str, status: int) -> None:
        self._requests.labels(route=route, status=str(status)).inc()

    def tokens(self, prompt: int, completion: int) -> None:
        self._prompt_tokens.inc(prompt)
        self._completion_tokens.inc(completion)

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def admitted(self, in_flight: int, queued: int) -> None:
        self._in_flight.set(in_flight)
        self._queue.set(queued)

    def diagnostic(self, code: str) -> None:
        self._diagnostics.labels(code=code).inc()

    def verdict(self, verdict: str) -> None:
        self._verdicts.labels(verdict=verdict).inc()

    def repair(self) -> None:
        self._repairs.inc()

    def recovery(self, outcome: str) -> None:
        """`outcome`: "recovered" (a recovery round was run) or why not (serving/recovery.py)."""
        self._recoveries.labels(outcome=outcome).inc()

    def rejection(self, kind: str) -> None:
        self._rejections.labels(kind=kind).inc()

    def validator_latency(self, seconds: float) -> None:
        self._validator_s.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
