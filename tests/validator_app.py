"""A downstream validator for tests: a small real HTTP service speaking callgate's envelope
and verdict (schemas/validation_*.schema.json).

Run `python -m tests.validator_app --port PORT`. One process serves every behaviour; the
URL chooses it: `POST /MODE/TOKEN`, where TOKEN (any string) keeps the state of the
"first ... then" modes and the received log of one test apart from another's.

Modes:
  accept                    {"verdict": "accepted"}
  normalise                 accepted, every string argument stripped and title-cased
  reject                    rejected, one error at the first argument, retryable
  reject-first-then-accept  the first envelope of TOKEN rejected, every later one accepted
  slow                      accepted after `?delay_s=` seconds (default 3)
  500                       HTTP 500
  503-then-ok               the first envelope of TOKEN gets HTTP 503, later ones accepted
  malformed                 HTTP 200 with a body that is not JSON
  wrong-shape               HTTP 200 with JSON that is not a verdict
"down" is this process stopped: the tests kill it and call the dead port.
`GET /log/TOKEN` returns what TOKEN received: [{"headers": {...}, "envelope": {...}}].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ACCEPT = {"verdict": "accepted"}


def reject(envelope: dict[str, Any]) -> dict[str, Any]:
    first = next(iter(envelope["arguments"]), None)
    path = "" if first is None else "/" + first.replace("~", "~0").replace("/", "~1")
    message = f"the test validator does not allow {envelope['tool']} with these arguments"
    return {"verdict": "rejected", "errors": [{"path": path, "message": message, "kind": "policy"}], "retryable": True}


def normalised(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip().title()
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    return value


def create_validator_app() -> Starlette:
    received: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def validate(request: Request) -> Response:
        mode, token = request.path_params["mode"], request.path_params["token"]
        envelope = json.loads(await request.body())
        seen = received[token]
        seen.append({"headers": dict(request.headers), "envelope": envelope})
        first = len(seen) == 1
        if mode == "accept":
            return JSONResponse(ACCEPT)
        if mode == "normalise":
            return JSONResponse({"verdict": "accepted", "arguments": normalised(envelope["arguments"])})
        if mode == "reject" or (mode == "reject-first-then-accept" and first):
            return JSONResponse(reject(envelope))
        if mode == "reject-first-then-accept":
            return JSONResponse(ACCEPT)
        if mode == "slow":
            await asyncio.sleep(float(request.query_params.get("delay_s", "3")))
            return JSONResponse(ACCEPT)
        if mode == "500":
            return JSONResponse({"error": "internal"}, status_code=500)
        if mode == "503-then-ok":
            return JSONResponse({"error": "busy"}, status_code=503) if first else JSONResponse(ACCEPT)
        if mode == "malformed":
            return Response('{"verdict": "accep', media_type="application/json")
        if mode == "wrong-shape":
            return JSONResponse({"verdict": "maybe", "errors": "none"})
        return JSONResponse({"error": f"unknown mode {mode!r}"}, status_code=404)

    async def log(request: Request) -> Response:
        return JSONResponse(received.get(request.path_params["token"], []))

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    routes = [
        Route("/health", health),
        Route("/log/{token}", log),
        Route("/{mode}/{token}", validate, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_validator(startup_timeout_s: float = 30.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """This app in its own process on a free loopback port: yields (base URL, process)."""
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "tests.validator_app", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    err = proc.communicate()[1]
                    raise RuntimeError(f"validator app did not start: {err!r}") from None
                time.sleep(0.05)
        yield base, proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def received(base: str, token: str) -> list[dict[str, Any]]:
    """What the running app received for `token`, in order."""
    log: list[dict[str, Any]] = httpx.get(f"{base}/log/{token}", timeout=5).json()
    return log


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="callgate's downstream test validator")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(create_validator_app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
