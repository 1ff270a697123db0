"""Where a main stream's extra time goes when quick heads run beside it: step by step.

bench_quick.py measures the main stream's time per output token alone and beside the heads;
this script takes the difference apart. The engine decodes one step per output token, so the
gaps between the main stream's tokens are its steps. Each run (fixed seed 0, format hermes,
greedy, a fresh ~1000-token conversation, prefix caching on) launches its side load as the
main stream's first token arrives, as QuickBeside does, and records every gap:

  alone        nothing beside the stream
  long-1       one side request on the conversation (its prompt shares every full KV block
               with the main prompt), unconstrained, greedy, decoding 200 tokens whatever it
               writes (ignore_eos), so that it runs through the whole stream
  short-1      the same request on a 20-token prompt instead of the conversation
  long-5       five long-1 requests
  heads        the five user-position heads (action, query, authority, domain, read_url),
               QuickBeside.launch as chat completions runs them

Configurations alternate in order round by round. Per configuration: median TPOT, the
slowdown against the same round's alone run, and the excess over that alone run's median
step split into the launch steps (the first four gaps: the side requests' prompts are
prefilled there) and the rest (decoding beside the stream).
It also counts, with the tokenizer, the prompt tokens each head must prefill: its prompt
past the last full KV block it shares with the main prompt (before any sharing among heads
in one step). Front-end CPU seconds (this process: rendering, tokenizing, streaming) per run
are recorded, to tell the engine's steps from work in this process.
Prints a table and ends with ONE JSON line.
Usage: python benchmarks/bench_quick_steps.py [--rounds 4] [--main-tokens 96] [--block-size 32]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quick import FORMAT, SEED, conversation, main_generation, start_engine

CONFIGS = ("alone", "long-1", "short-1", "long-5", "heads")
USER_HEADS = ("action", "query", "authority", "domain", "read_url")
LAUNCH_GAPS = 4
SIDE_TOKENS = 200


def split_excess(gaps: Sequence[float], step: float) -> tuple[float, float]:
    """The time above `step` per gap (in the gaps' unit) summed over the first LAUNCH_GAPS
    gaps, and over the rest."""
    excess = [g - step for g in gaps]
    return sum(excess[:LAUNCH_GAPS]), sum(excess[LAUNCH_GAPS:])


def uncached_tokens(main_ids: Sequence[int], head_ids: Sequence[int], block: int) -> int:
    """Tokens of `head_ids` past the last full block it shares with `main_ids`."""
    common = 0
    for a, b in zip(main_ids, head_ids, strict=False):
        if a != b:
            break
        common += 1
    return len(head_ids) - common // block * block


async def side_load(engine: Any, quick: Any, config: str, msgs: list[dict[str, str]], tag: str) -> list[Any]:
    """Start `config`'s side requests (tasks); the heads' QuickBeside is returned in the list."""
    from callgate.serving.quick.service import Conversation
    from callgate.templates import render

    if config == "alone":
        return []
    if config == "heads":
        beside = quick.beside(Conversation(tuple(msgs)), USER_HEADS, f"{tag}-h")
        beside.launch()
        return [beside]
    base = "Tell me about rivers." if config == "short-1" else render(FORMAT, msgs)
    n = 5 if config == "long-5" else 1
    return [asyncio.ensure_future(_plain_row(engine, f"{base}\nNote {i}:", f"{tag}-s{i}")) for i in range(n)]


async def _plain_row(engine: Any, prompt: str, rid: str) -> None:
    """An unconstrained greedy request that decodes SIDE_TOKENS tokens whatever it writes:
    vLLM's own request with ignore_eos (callgate's Engine seam has no such option)."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    ids = engine.tokenizer.encode(prompt)
    params = SamplingParams(
        max_tokens=SIDE_TOKENS, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    async for _ in engine._llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid):
        pass


async def one_run(
    engine: Any, quick: Any, config: str, msgs: list[dict[str, str]], n: int, tag: str, rnd: int = -1
) -> dict[str, Any]:
    times: list[float] = []
    side: list[Any] = []
    cpu0 = sum(os.times()[:2])
    async for _ in await main_generation(engine, f"{tag}-main", msgs, n):
        times.append(time.perf_counter())
        if len(times) == 1:
            side = await side_load(engine, quick, config, msgs, tag)
    for s in side:
        if isinstance(s, asyncio.Future):
            s.cancel()
            await asyncio.gather(s, return_exceptions=True)
        else:
            await s.finish(None)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "config": config,
        "round": rnd,
        "tokens": len(times),
        "tpot_ms": (times[-1] - times[0]) / max(1, len(gaps)) * 1000.0,
        "gaps_ms": [round(g * 1000.0, 2) for g in gaps],
        "frontend_cpu_s": round(sum(os.times()[:2]) - cpu0, 4),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration: medians over its runs. A run's excess is measured against the median
    step of the alone run of its own round (rounds alternate order, so the two ran side by
    side), not one pooled figure: the step time drifts by a millisecond or more over minutes
    on a shared machine, which is ~100 ms over a 96-token stream."""
    alone = {r["round"]: r for r in runs if r["config"] == "alone"}
    pooled = [g for r in alone.values() for g in r["gaps_ms"]]
    out: dict[str, Any] = {"alone_step_ms_median": round(statistics.median(pooled), 2) if pooled else 0.0}
    for c in CONFIGS:
        rs = [r for r in runs if r["config"] == c and r["round"] in alone]
        if not rs:
            continue
        parts, ratios = [], []
        for r in rs:
            base = alone[r["round"]]
            parts.append(split_excess(r["gaps_ms"], statistics.median(base["gaps_ms"])))
            ratios.append(r["tpot_ms"] / base["tpot_ms"] - 1)
        out[c] = {
            "tpot_ms_median": round(statistics.median(r["tpot_ms"] for r in rs), 2),
            "slowdown_median": round(statistics.median(ratios), 4),
            "slowdown_per_round": [round(x, 4) for x in ratios],
            "launch_excess_ms_median": round(statistics.median(p[0] for p in parts), 1),
            "rest_excess_ms_median": round(statistics.median(p[1] for p in parts), 1),
            "largest_gap_ms_median": round(statistics.median(max(r["gaps_ms"]) for r in rs), 1),
            "frontend_cpu_s_median": round(statistics.median(r["frontend_cpu_s"] for r in rs), 3),
            "runs": len(rs),
        }
    return out


def head_suffixes(tok: Any, msgs: list[dict[str, str]], block: int) -> dict[str, int]:
    """Per head, the prompt tokens past the shared full KV blocks: of the main prompt, and for
    read_url's later URLs of the request before (asked in turn; " yes" stands in for the
    answers, which only the model knows)."""
    from callgate.serving.quick.heads import head_prompt, urls_in
    from callgate.templates import render

    main_ids = tok.encode(render(FORMAT, msgs))
    out: dict[str, int] = {}
    for task in USER_HEADS:
        p = head_prompt(FORMAT, msgs, task)
        if task != "read_url":
            out[task] = uncached_tokens(main_ids, tok.encode(p.text), block)
            continue
        before, text, total = main_ids, p.text, 0
        for u in urls_in(msgs):
            text += f"{u}:"
            ids = tok.encode(text)
            total += uncached_tokens(before, ids, block)
            before, text = ids, text + " yes\n"
        out[task] = total
    return out


async def bench(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, int]]:
    from callgate.serving.engines.model_store import resolve_model
    from callgate.serving.engines.tokenizer import HfTokenizer
    from callgate.serving.quick.service import QuickService
    from callgate.templates import render

    folder = resolve_model(args.model)
    tok = HfTokenizer(folder)
    rng = random.Random(SEED)

    def count(m: list[dict[str, str]]) -> int:
        return len(tok.encode(render(FORMAT, m)))

    convs = [conversation(rng, 1000, count) for _ in range(2 + args.rounds * len(CONFIGS))]
    suffixes = head_suffixes(tok, convs[0], args.block_size)
    engine = start_engine(folder, args, True)
    runs: list[dict[str, Any]] = []
    try:
        quick = QuickService(engine, FORMAT)
        await one_run(engine, quick, "heads", convs[0], args.main_tokens, "warm-0")  # grammars, shapes
        await one_run(engine, quick, "long-5", convs[1], args.main_tokens, "warm-1")
        todo = iter(convs[2:])
        for r in range(args.rounds):
            for c in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:
                runs.append(await one_run(engine, quick, c, next(todo), args.main_tokens, f"{c}-{r}", r))
    finally:
        await engine.shutdown()
    return runs, suffixes


def print_table(summary: Mapping[str, Any], suffixes: Mapping[str, int], n: int) -> None:
    print(f"main stream of {n} tokens; alone, one step takes {summary['alone_step_ms_median']} ms (median gap)")
    print(f"{'beside':>8} {'TPOT ms':>8} {'slowdown':>9} {'launch ms':>10} {'rest ms':>8} {'max gap':>8} {'cpu s':>6}")
    for c in CONFIGS:
        s = summary.get(c)
        if s:
            print(
                f"{c:>8} {s['tpot_ms_median']:>8} {s['slowdown_median'] * 100:>8.1f}% "
                f"{s['launch_excess_ms_median']:>10} {s['rest_excess_ms_median']:>8} "
                f"{s['largest_gap_ms_median']:>8} {s['frontend_cpu_s_median']:>6}"
            )
    print("launch / rest ms: the stream's time above the alone step in its first four steps / in the others")
    print(f"head prompt tokens past the shared full KV blocks: {dict(suffixes)} (total {sum(suffixes.values())})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded:smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--main-tokens", type=int, default=96)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--kv-cache-gib", type=int, default=1)
    args = p.parse_args()
    runs, suffixes = asyncio.run(bench(args))
    summary = summarise(runs)
    print_table(summary, suffixes, args.main_tokens)
    env = {"cpus": os.cpu_count(), "threads": args.threads, "block_size": args.block_size, "seed": SEED}
    out = {"benchmark": "quick_steps", "env": env, "summary": summary, "head_suffix_tokens": suffixes, "runs": runs}
    print(json.dumps(out), flush=True)
    os._exit(0)  # as bench_quick: vLLM's AsyncLLM.__del__ would print after the JSON line


if __name__ == "__main__":
    main()
