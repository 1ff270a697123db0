"""Graceful shutdown of a real `callgate serve` process (FakeEngine): SIGTERM stops accepting
new requests, lets running ones finish (or cancels them cleanly once the grace period of
5 s is over), flushes the audit log, and the process exits 0.

Knows: `serve_fake` from tests/test_load.py, the audit log's JSONL records.
Does not know: uvicorn's internals (only what a client and the operator see).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.test_load import ASK, CALL, LONG_REPLY, TOOL, Outcome, run_request, serve_fake, wait_until

GRACE_S = 5  # uvicorn's timeout_graceful_shutdown in `callgate serve`


def start_clients(base: str, kinds: list[str], outcomes: list[Outcome]) -> list[threading.Thread]:
    def one(kind: str) -> None:
        with httpx.Client(base_url=base, timeout=30) as c:
            outcomes.append(run_request(c, kind))

    threads = [threading.Thread(target=one, args=(k,)) for k in kinds]
    for th in threads:
        th.start()
    return threads


def refused(base: str) -> bool:
    """A new request is not served: the connection is refused, or answered 503."""
    try:
        resp = httpx.post(base + "/v1/chat/completions", json={"messages": ASK, "tools": [TOOL]}, timeout=2)
    except httpx.TransportError:
        return True
    return resp.status_code == 503


@pytest.mark.slow
def test_sigterm_finishes_running_requests_flushes_audit_and_exits_zero(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    flags = ("--audit-log", str(audit), "--max-num-seqs", "4")
    with serve_fake(tmp_path, [CALL], *flags, token_delay_s=0.02) as server:  # ~1.2 s per answer
        outcomes: list[Outcome] = []
        threads = start_clients(server.base, ["call", "stream", "call", "stream"], outcomes)
        assert wait_until(lambda: server.health()["in_flight"] == 4)
        signalled_s = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: refused(server.base), timeout_s=2)
        for th in threads:
            th.join(timeout=GRACE_S + 10)
        assert server.proc.wait(timeout=GRACE_S + 10) == 0
        exited_s = time.monotonic() - signalled_s
        assert sorted(o.kind for o in outcomes) == ["answer", "answer", "stream", "stream"]
        returned = {cid for o in outcomes for cid in o.call_ids}
        assert len(returned) == 4
        records = [json.loads(line) for line in audit.read_text(encoding="utf-8").splitlines()]
        assert returned <= {r["call_id"] for r in records if r["verdict"]["verdict"] == "accepted"}
        assert audit.read_bytes().endswith(b"\n")
        assert exited_s < GRACE_S + 5
        assert "Traceback" not in server.output()


@pytest.mark.slow
def test_sigterm_cancels_what_cannot_finish_within_the_grace_period(tmp_path: Path) -> None:
    with serve_fake(tmp_path, [LONG_REPLY], token_delay_s=0.02) as server:  # 40 s per answer
        outcomes: list[Outcome] = []
        threads = start_clients(server.base, ["stream", "call"], outcomes)  # both end with a clear error
        assert wait_until(lambda: server.health()["in_flight"] == 2)
        signalled_s = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=GRACE_S + 15) == 0
        exited_s = time.monotonic() - signalled_s
        for th in threads:
            th.join(timeout=10)
        assert not any(th.is_alive() for th in threads)  # every client got an ending, none hangs
        assert len(outcomes) == 2
        # the answer gets a 503, the stream a terminal SSE error event and [DONE]
        assert sorted((o.kind, o.status) for o in outcomes) == [("server_error", 200), ("server_error", 503)], outcomes
        assert exited_s < GRACE_S + 10
        assert "Traceback" not in server.output()
