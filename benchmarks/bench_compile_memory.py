"""Resident memory of a process across grammar compiles that overrun their time limit.

Measured on the old regex engine (benchmarks/regex_baseline/, an outlines-core Index per
grammar), which callgate served with before llguidance: QA saw that server grow by ~1 GB per
round of two compiles that overran the 5 s limit. Each round here is what it did for two
such requests at once: the regex of a fresh hermes `required` tool of N optional string
properties, compiled over SmolLM2's vocabulary in callgate's compile pool behind the old
size check, the disk tier on (a temporary directory, as `callgate serve` had by default),
then waiting until both compiles have ended (they go on after their requests got 400) and
recording the process's RSS, the memory cache's entries and its serialised bytes. Two child
processes, one after the other, in the same run: `trim` (`cache.trim_heap` after each
compile, as that server ran) and `no-trim` (the baseline).
Prints a table, writes benchmarks/compile_memory.png (unless --no-chart), and ends with ONE
JSON line.
Usage: python benchmarks/bench_compile_memory.py [--rounds 6] [--properties 21] [--timeout 5] [--no-chart]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODES = ("trim", "no-trim")


def rss_mb() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def tool(tag: str, n: int) -> dict[str, Any]:
    props = {f"{tag}_{k}": {"type": "string"} for k in range(n)}
    return {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": props}}}


async def child(mode: str, args: argparse.Namespace) -> None:
    """The old regex engine's `build_async`, as the server ran it: the regex of a hermes
    `required` request (regex_baseline.grammar), compiled in callgate's compile pool (two
    workers, the time limit counted from the compile's start) behind the old size check,
    into the Index cache with its disk tier (a temporary directory), the heap trimmed after
    each compile (`trim`) or not (`no-trim`)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    from regex_baseline.cache import CACHE, configure_disk, token_vocabulary, trim_heap
    from regex_baseline.grammar import grammar
    from regex_baseline.index_size import check_size

    from callgate.constraints.compile_pool import CompilePool, Job
    from callgate.constraints.request import grammar_request
    from callgate.serving.engines.model_store import resolve_model
    from callgate.serving.engines.tokenizer import HfTokenizer

    configure_disk(None)
    pool = CompilePool(workers=2)
    tok = HfTokenizer(resolve_model("embedded:smollm2-135m-instruct"))
    vocab = token_vocabulary(tok.vocabulary(), tok.eos_token_id)
    print(json.dumps({"round": -1, "rss_mb": rss_mb()}), flush=True)

    def compile_one(key: str, regex: str, job: Job) -> None:
        def guard() -> None:
            check_size(regex, vocab, "tools")
            job.proceed()

        CACHE.get_or_compile(key, regex, vocab, guard=guard)
        if mode == "trim":
            trim_heap()

    async def one(tag: str) -> str:
        try:
            req = grammar_request("hermes", [tool(tag, args.properties)], "required", True, None)
            assert req is not None
            regex, key = grammar(req).regex, req.key()
            work = functools.partial(compile_one, key, regex)
            await pool.run((vocab.fingerprint, key), work, timeout_s=args.timeout, param="tools")
            return "ok"
        except Exception as e:  # what each request got is the record
            return type(e).__name__

    for r in range(args.rounds):
        got = await asyncio.gather(one(f"{mode}{r}a"), one(f"{mode}{r}b"))
        while pool.busy:
            await asyncio.sleep(0.1)
        row = {"round": r, "rss_mb": rss_mb(), "entries": len(CACHE), "cache_mb": CACHE.nbytes >> 20, "got": got}
        print(json.dumps(row), flush=True)


def run_child(mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", mode, "--rounds", str(args.rounds)]
    cmd += ["--properties", str(args.properties), "--timeout", str(args.timeout)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def chart(rows: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        ax.plot([r["round"] + 1 for r in rows[mode]], [r["rss_mb"] for r in rows[mode]], marker="o", label=mode)
    ax.set_xlabel("rounds of two overrunning compiles (0: vocabulary loaded)")
    ax.set_ylabel("process RSS, MB")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle("Grammar compiles past their time limit: resident memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--properties", type=int, default=21, help="optional string properties of each tool")
    p.add_argument("--timeout", type=float, default=5.0, help="the compile time limit, seconds")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--no-chart", action="store_true")
    p.add_argument("--chart", default=str(ROOT / "benchmarks" / "compile_memory.png"))
    args = p.parse_args()
    if args.child:
        asyncio.run(child(args.child, args))
        return
    started = time.time()
    rows = {mode: run_child(mode, args) for mode in MODES}
    print(f"{'round':>5} | " + " | ".join(f"{m:>22}" for m in MODES))
    print(f"{'':>5} | " + " | ".join(f"{'RSS MB / cache MB, n':>22}" for _ in MODES))
    for i in range(args.rounds + 1):
        cells = []
        for m in MODES:
            r = rows[m][i]
            cells.append(f"{r['rss_mb']:>8} / {r.get('cache_mb', 0):>5}, {r.get('entries', 0):>2}")
        print(f"{i:>5} | " + " | ".join(f"{c:>22}" for c in cells))
    last = {m: rows[m][-1]["rss_mb"] for m in MODES}
    print(f"after {args.rounds} rounds: trim {last['trim']} MB, no-trim {last['no-trim']} MB")
    if not args.no_chart:
        chart(rows, Path(args.chart))
        print(f"chart: {args.chart}")
    result = {
        "benchmark": "compile_memory",
        "env": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "started": started},
        "params": {"rounds": args.rounds, "properties": args.properties, "timeout_s": args.timeout},
        "rss_mb_last": last,
        "rounds": rows,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
