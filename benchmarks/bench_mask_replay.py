"""Mask time per token with and without budget closing, replayed from real model outputs.

Workload: the outputs an earlier `bench_parse_errors.py --dump FILE` run wrote (callgate's
`required` and `named` configurations by default: SmolLM2's own calls on BFCL cases). Each
output is re-tokenised with the embedded model's tokenizer, its grammar compiled just
before its chunk (as bench_parse_errors does), and fed, `--batch` requests at a
time, to callgate's logits processor (`ConstrainedBatch`, the class vLLM's engine runs, with
the real vocabulary and the grammars `callgate.constraints.build` compiles, Index and
closing tables loaded from the files the server would hand the engine), as vLLM would: one
`apply` per step over the rows still decoding, each row's output list appended in place.
Two processors, one with budget closing (each request's `max_tokens`, `--max-tokens`) and
one with it off (`"budget_closing": false`), replay the same chunks alternately, so load
drift hits both. Per-token time = step time / rows the step masked (the processor's
`masked`), as the engine's step log divides; a step that masks nothing (under `auto`,
every row in free text) is not counted, as in the engine. The budget-closing part is read
from the processor.

Unlike the engine's step log, no model runs between steps here, so caches stay warm: the
figures are lower than in vLLM's engine process, and the on/off ratio is the comparison.
`--cold-mb N` writes N MB between steps (a torch add over a buffer, as the model's forward
pass streams its weights): every cache is cold when a step starts, as in the engine, where
a step's host time is CPU time, not waiting (measured: thread CPU time = wall time).

Prints a table and ends with ONE JSON line.
    python benchmarks/bench_mask_replay.py --dump /tmp/pe-hermes.jsonl [--max-tokens 128] [--batch 16] [--cold-mb 240]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


@dataclass(frozen=True, slots=True)
class Replay:
    format: str
    tools: list[Mapping[str, Any]]
    tool_choice: Any
    ids: list[int]


def grammar_args(r: Replay, vocab: Any) -> dict[str, Any]:
    """extra_args["callgate"] of the request: the grammar compiled (or found) now, so that
    its Index and closing tables are in the disk tier while its chunk replays (compiling
    every output's grammar first would evict the early ones: free-text grammars' Index
    files are tens of MB against the tier's 1 GiB)."""
    from callgate import constraints

    c = constraints.build(r.format, r.tools, r.tool_choice, True, None, vocab)
    assert c is not None  # a tool_choice of required or a named function always constrains
    ref = c.ref()
    return {"key": ref.key, "regex": ref.regex, "trigger": ref.trigger, "index_path": ref.index_path}


@dataclass
class Params:
    extra_args: dict[str, Any]
    max_tokens: int


@dataclass
class Update:
    added: list[tuple[int, Params, None, list[int]]]
    removed: list[int]
    moved: tuple[()] = ()


def load_replays(dump: Path, modes: Sequence[str], max_tokens: int, limit: int) -> tuple[list[Replay], Any]:
    """The dumped outputs of callgate's `modes` as token ids, and the vocabulary to compile with."""
    import bench_parse_errors as bench

    from callgate import constraints
    from callgate.serving.model_store import ensure_embedded_model
    from callgate.serving.tokenizer import HfTokenizer

    tok = HfTokenizer(str(ensure_embedded_model()))
    vocab = constraints.token_vocabulary(tok.vocabulary(), tok.eos_token_id)
    rows = [json.loads(line) for line in dump.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["system"] == "callgate" and r["mode"] in modes and r["text"] is not None]
    wanted = max(200, len({r["case"] for r in rows}))
    cases = {c.id: c for c in bench.load_cases(wanted, Path("~/.cache/callgate/bfcl").expanduser())}
    out = []
    for r in rows[:limit]:
        case = cases.get(r["case"])
        if case is None:
            continue
        ids = tok.hf.encode(r["text"], add_special_tokens=False)[:max_tokens]
        if r["finish"] == "stop" and len(ids) < max_tokens:
            ids.append(tok.eos_token_id)
        out.append(Replay(r["format"], list(case.tools), bench.tool_choice(r["mode"], case), ids))
    return out, vocab


def replay_chunk(
    batch: Any,
    chunk: Sequence[Replay],
    args: Sequence[dict[str, Any]],
    max_tokens: int,
    closing: bool,
    width: int,
    sweep: Any = None,
) -> tuple[list[float], list[float]]:
    """Per-token µs of every step of one chunk through `batch` (its requests' grammar
    `args`), and the budget-closing part."""
    import torch

    outs: list[list[int]] = [[] for _ in chunk]
    added = []
    for slot, grammar in enumerate(args):
        extra = {"callgate": {**grammar, "budget_closing": closing}}
        added.append((slot, Params(extra, max_tokens), None, outs[slot]))
    batch.update_state(Update(added, []))
    times: list[float] = []
    budget: list[float] = []
    live = [i for i in range(len(chunk)) if chunk[i].ids]
    while live:
        logits = torch.zeros(len(chunk), width)
        if sweep is not None:
            sweep.add_(0.0)  # the forward pass's memory traffic: caches cold
        start = time.perf_counter_ns()
        batch.apply(logits)
        elapsed = time.perf_counter_ns() - start
        if batch.masked:  # per masked row, as the engine's step log divides
            times.append(elapsed / batch.masked / 1e3)
            budget.append(batch.budget_ns / batch.masked / 1e3)
        for i in live:
            outs[i].append(chunk[i].ids[len(outs[i])])
        done = [i for i in live if len(outs[i]) == len(chunk[i].ids)]
        live = [i for i in live if i not in done]
        batch.update_state(Update([], done))
    batch.update_state(Update([], list(range(len(chunk)))))
    return times, budget


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


def stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "steps": len(values),
        "p50_us": round(pct(values, 50), 1),
        "p90_us": round(pct(values, 90), 1),
        "p99_us": round(pct(values, 99), 1),
        "mean_us": round(statistics.fmean(values), 1) if values else 0.0,
    }


def run(replays: Sequence[Replay], vocab: Any, batch_size: int, max_tokens: int, cold_mb: int = 0) -> dict[str, Any]:
    import torch

    from callgate import constraints
    from callgate.constraints.processor import ConstrainedBatch
    from callgate.serving.model_store import ensure_embedded_model

    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(ensure_embedded_model())))
    sweep = torch.ones(cold_mb << 18) if cold_mb else None  # float32: 2**18 per MB
    on, off = ConstrainedBatch(config, "cpu", False), ConstrainedBatch(config, "cpu", False)
    width = 32 * ((on.tokens.vocabulary.size + 31) // 32)
    warm = replays[: min(2, len(replays))]  # grammar loads, the C library, first plans
    warm_args = [grammar_args(r, vocab) for r in warm]
    for proc, closing in ((on, True), (off, False)):
        replay_chunk(proc, warm, warm_args, max_tokens, closing, width)
    times: dict[str, list[float]] = {"on": [], "off": [], "budget": []}
    chunks = [replays[i : i + batch_size] for i in range(len(warm), len(replays), batch_size)]
    for k, chunk in enumerate(chunks):
        constraints.CACHE.clear()  # bounded memory: one chunk of grammars at a time
        grammars = [grammar_args(r, vocab) for r in chunk]
        order = ((on, True), (off, False)) if k % 2 == 0 else ((off, False), (on, True))
        for proc, closing in order:
            step_us, budget_us = replay_chunk(proc, chunk, grammars, max_tokens, closing, width, sweep)
            times["on" if closing else "off"].extend(step_us)
            if closing:
                times["budget"].extend(budget_us)
    return {name: stats(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--dump", required=True, help="a bench_parse_errors --dump file")
    parser.add_argument("--modes", default="required,named")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--limit", type=int, default=10_000, help="at most this many outputs")
    parser.add_argument("--cold-mb", type=int, default=0, help="MB written between steps (0: warm caches)")
    args = parser.parse_args()
    replays, vocab = load_replays(Path(args.dump), args.modes.split(","), args.max_tokens, args.limit)
    by_format: dict[str, list[Replay]] = {}
    for r in replays:
        by_format.setdefault(r.format, []).append(r)
    results = {
        fmt: run(rs, vocab, args.batch, args.max_tokens, args.cold_mb) | {"outputs": len(rs)}
        for fmt, rs in by_format.items()
    }
    head = f"{'format':<10} {'outputs':>7} {'closing':<8} {'steps':>6} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}"
    print(head + f" {'mean us':>8}")
    for fmt, res in results.items():
        for name in ("off", "on", "budget"):
            s: Mapping[str, float] = res[name]
            label = {"off": "off", "on": "on", "budget": "(part)"}[name]
            print(
                f"{fmt:<10} {res['outputs']:>7} {label:<8} {s['steps']:>6} {s['p50_us']:>8} {s['p90_us']:>8} "
                f"{s['p99_us']:>8} {s['mean_us']:>8}"
            )
    env = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "batch": args.batch,
        "max_tokens": args.max_tokens,
        "dump": str(args.dump),
        "cold_mb": args.cold_mb,
    }
    print(json.dumps({"benchmark": "mask_replay", "env": env, "results": results}))


if __name__ == "__main__":
    main()
