"""callgate.serving.handoff.audit: durable append-only JSONL — one whole line per record, fsync before
`write` returns, torn tails contained, size-based rotation — and a SIGKILLed server that loses
no record of an answered request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from callgate.serving.handoff.audit import AuditLog, candidate_record, read_records, rotated_path
from tests.validator_app import free_port


def record(i: int, pad: int = 0) -> dict[str, Any]:
    return {"i": i, "pad": "x" * pad}


def test_records_are_canonical_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    log.write([{"b": 1, "a": {"z": "line\nbreak", "y": "ø"}}, record(2)])
    log.close()
    raw = path.read_bytes()
    assert raw == '{"a":{"y":"ø","z":"line\\nbreak"},"b":1}\n{"i":2,"pad":""}\n'.encode()
    assert read_records(path).records == ({"a": {"y": "ø", "z": "line\nbreak"}, "b": 1}, record(2))
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_each_write_is_fsynced_before_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    synced: list[bytes] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(path.read_bytes())

    monkeypatch.setattr(os, "fsync", fsync)
    log.write([record(1), record(2)])
    assert synced == [b'{"i":1,"pad":""}\n{"i":2,"pad":""}\n']
    log.write([])
    assert len(synced) == 1
    log.close()


def test_a_torn_tail_is_closed_on_open_and_skipped_by_readers(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"i":1}\n{"i":2,"pa')
    log = AuditLog(path)
    log.write([record(3)])
    log.close()
    assert path.read_bytes().endswith(b'{"i":2,"pa\n{"i":3,"pad":""}\n')
    read = read_records(path)
    assert read.records == ({"i": 1}, record(3)) and read.skipped == 1


def test_unencodable_records_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    with pytest.raises(ValueError):
        log.write([record(1), {"x": float("nan")}])
    log.close()
    assert path.read_bytes() == b""


def test_rotation_keeps_n_files_in_order(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path, max_bytes=200, keep=2)
    for i in range(40):
        log.write([record(i, pad=40)])
    log.close()
    files = [rotated_path(path, 2), rotated_path(path, 1), path]
    assert all(f.exists() and f.stat().st_size <= 200 for f in files) and not rotated_path(path, 3).exists()
    kept = [r["i"] for f in files for r in read_records(f).records]
    assert kept == list(range(40 - len(kept), 40)) and len(kept) >= 6


def test_rotation_with_keep_zero_truncates(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path, max_bytes=100, keep=0)
    for i in range(10):
        log.write([record(i, pad=30)])
    log.close()
    assert [r["i"] for r in read_records(path).records] == [8, 9] and not rotated_path(path, 1).exists()


def test_bad_limits_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a", max_bytes=0)
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a", keep=-1)


def test_concurrent_writers_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path, max_bytes=20_000, keep=50)

    def writer(t: int) -> None:
        for i in range(40):
            log.write([{"t": t, "i": i, "pad": "y" * 200}])

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    log.close()
    files = sorted(tmp_path.iterdir())
    got = [(r["t"], r["i"]) for f in files for r in read_records(f).records]
    assert sorted(got) == [(t, i) for t in range(6) for i in range(40)]
    assert all(read_records(f).skipped == 0 for f in files)


def test_candidate_record_fields() -> None:
    rec = candidate_record(
        request_id="chatcmpl-1",
        round_index=1,
        model="m",
        fmt="hermes",
        call_id="call_1",
        tool="t",
        arguments={"a": 1},
        raw="<tool_call>",
        diagnostics=[{"code": "unknown_tool", "message": "m", "span": [0, 1]}],
        verdict={"verdict": "rejected", "errors": [], "retryable": True},
        validator="builtin-jsonschema",
        constrained=True,
        idempotency_key="ab" * 32,
    )
    assert set(rec) == {
        "time",
        "request_id",
        "round",
        "model",
        "format",
        "call_id",
        "tool",
        "arguments",
        "raw",
        "diagnostics",
        "verdict",
        "validator",
        "constrained",
        "idempotency_key",
    }
    assert rec["idempotency_key"] == "ab" * 32
    assert rec["time"].endswith("+00:00") and rec["round"] == 1


# ---- a killed server ----------------------------------------------------------------------------

API_KEY = "sk-audit-kill-4e1b"
TOOL = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
}
CALL = '<tool_call>\n{"name": "ping", "arguments": {"n": 1}}\n</tool_call>'


@pytest.mark.slow
def test_sigkill_loses_no_record_of_an_answered_request(tmp_path: Path) -> None:
    script, log_path = tmp_path / "replies.json", tmp_path / "audit.jsonl"
    script.write_text(json.dumps([CALL]), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "callgate", "serve", "--engine", "fake", "--fake-script", str(script)]
    cmd += ["--port", str(port), "--audit-log", str(log_path), "--log-level", "info"]
    env = {**os.environ, "CALLGATE_API_KEY": API_KEY}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    answered: list[tuple[str, str]] = []
    stop = threading.Event()
    try:
        wait_healthy(proc, base)

        def client() -> None:
            headers = {"Authorization": f"Bearer {API_KEY}"}
            body = {"messages": [{"role": "user", "content": "ping"}], "tools": [TOOL]}
            with httpx.Client(base_url=base, headers=headers, timeout=10) as c:
                while not stop.is_set():
                    try:
                        resp = c.post("/v1/chat/completions", json=body)
                    except httpx.TransportError:
                        return
                    doc = resp.json()
                    [call] = doc["choices"][0]["message"]["tool_calls"]
                    answered.append((doc["id"], call["id"]))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while len(answered) < 60 and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)  # mid-stream: requests are in flight
        proc.wait()
        stop.set()
        for th in threads:
            th.join()
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    if proc.stdout is not None:
        proc.stdout.close()

    assert len(answered) >= 60
    lines = log_path.read_bytes().split(b"\n")
    whole, tail = lines[:-1], lines[-1]  # `tail` is b"" unless the kill tore the last record
    records = [json.loads(line) for line in whole]  # every complete line parses
    audited = {(r["request_id"], r["call_id"]) for r in records}
    assert set(answered) <= audited
    assert all(r["verdict"]["verdict"] == "accepted" and r["tool"] == "ping" for r in records)
    assert len(records) - len(answered) <= 4  # at most the requests in flight at the kill
    assert API_KEY not in log_path.read_text(encoding="utf-8", errors="replace") and API_KEY not in output

    AuditLog(log_path).write([record(-1)])  # a restart appends after a clean line break
    read = read_records(log_path)
    assert read.records[-1] == record(-1) and read.skipped == (1 if tail else 0)


def wait_healthy(proc: subprocess.Popen[bytes], base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "callgate serve did not start"
        time.sleep(0.05)
