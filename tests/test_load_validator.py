"""A slow, down and flapping downstream validator against a real `callgate serve` process
under load (FakeEngine, 127.0.0.1 only).

Checks: no candidate is passed on without an accepted verdict (at the wire and in the
audit log) while the validator accepts, times out, answers 503 and drops connections in
turn, and /health stays responsive meanwhile.
Does not know: how the server process is run (tests/test_load.py's `serve_fake` and `load`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.test_load import CALL, load, serve_fake


class FlakyValidator:
    """A downstream validator whose behaviour changes while the server is under load:
    'accept', 'slow' (past callgate's timeout), 'down' (503) or 'close' (connection dropped)."""

    def __init__(self) -> None:
        self.mode = "accept"
        self.accepted: set[str] = set()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                envelope = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.answer(self, envelope)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/validate"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, handler: BaseHTTPRequestHandler, envelope: Mapping[str, Any]) -> None:
        mode = self.mode
        if mode == "close":
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "slow":
            time.sleep(1.5)
        status = 503 if mode == "down" else 200
        body = json.dumps({"verdict": "accepted"} if status == 200 else {"error": "down"}).encode()
        if status == 200:
            with self._lock:
                self.accepted.add(str(envelope["call_id"]))
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_validator_faults_during_load(tmp_path: Path) -> None:
    validator = FlakyValidator()
    audit = tmp_path / "audit.jsonl"
    flags: tuple[str, ...] = ("--max-num-seqs", "4", "--max-queue", "16", "--validator-url", validator.url)
    flags += ("--validator-timeout", "0.5", "--audit-log", str(audit), "--max-repairs", "0")
    health_latencies: list[float] = []
    stop = threading.Event()
    try:
        with serve_fake(tmp_path, [CALL], *flags, token_delay_s=0.002) as server:

            def flap() -> None:
                for mode in ["accept", "slow", "down", "accept", "close", "slow", "accept", "down"] * 3:
                    if stop.is_set():
                        return
                    validator.mode = mode
                    time.sleep(0.3)

            def probe_health() -> None:
                while not stop.is_set():
                    t0 = time.monotonic()
                    server.health(timeout_s=5)
                    health_latencies.append(time.monotonic() - t0)
                    time.sleep(0.05)

            side = [threading.Thread(target=flap), threading.Thread(target=probe_health)]
            for th in side:
                th.start()
            run = load(server.base, 8, 8, ["call", "stream"])
            stop.set()
            for th in side:
                th.join()
            kinds = run.kinds()
            assert set(kinds) <= {"answer", "stream", "validator_unavailable"}, kinds
            assert kinds["validator_unavailable"] and (kinds["answer"] + kinds["stream"]), kinds
            returned = {cid for o in run.outcomes for cid in o.call_ids}
            assert returned <= validator.accepted  # nothing passed on without an accepted verdict
            records = [json.loads(line) for line in audit.read_text(encoding="utf-8").splitlines()]
            accepted = {r["call_id"] for r in records if r["verdict"]["verdict"] == "accepted"}
            assert returned <= accepted
            assert health_latencies and max(health_latencies) < 5
    finally:
        stop.set()
        validator.close()
