"""Parser throughput per format: non-streaming vs streaming with token-sized deltas, and
how streaming time grows with the output size.

Workload (fixed seed): for every format whose parser and renderer import, a corpus of
model outputs made the way the tests make them -- render(context + [assistant turn])
minus render(context) -- from random tools, calls and content (plain answers and call
turns with 1-3 calls of typed arguments). Each output is parsed whole (`parse`) and
streamed in 4-character deltas (`stream_parser(...).feed` ... `finish`, `result`); the
best of --repeats passes counts, after a warm-up. Then one output each of about 1 KB,
10 KB and 100 KB (a call writing a long file) is streamed the same way.

Times are CPU (process) times, best of --repeats. Targets: streaming time at most 2x
non-streaming; 100 KB at most 110x the time of 1 KB.
Prints a table, writes benchmarks/parsers.png, and ends with ONE JSON line.

    python benchmarks/bench_parsers.py [--outputs 10000] [--seed 0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callgate.errors import TemplateError
from callgate.formats import FORMATS, get_format
from callgate.parsers import parse, sequential_call_ids, stream_parser
from callgate.templates import render

DELTA_CHARS = 4
SIZES_BYTES = (1_000, 10_000, 100_000)
MAX_STREAM_RATIO = 2.0
MAX_SIZE_RATIO = 110.0
CHART = Path(__file__).with_name("parsers.png")
_WORDS = "the a of to and in file value result check search city report data note plan step user list".split()


# ---- workload ---------------------------------------------------------------------------


def _tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "required": sorted(props)[:1]}
    return {"type": "function", "function": {"name": name, "description": f"Tool {name}.", "parameters": schema}}


TOOLS = [
    _tool("get_weather", {"location": {"type": "string"}, "days": {"type": "integer"}}),
    _tool("search_web", {"query": {"type": "string"}, "max_results": {"type": "integer"}, "safe": {"type": "boolean"}}),
    _tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
    _tool("set_thermostat", {"room": {"type": "string"}, "target_c": {"type": "number"}}),
    _tool("send_email", {"to": {"type": "array"}, "subject": {"type": "string"}, "body": {"type": "string"}}),
    _tool("create_ticket", {"title": {"type": "string"}, "labels": {"type": "array"}, "meta": {"type": "object"}}),
]
CONTEXT = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Please help."}]


def _text(rng: random.Random, n_words: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n_words)]
    for i in range(0, n_words, 12):
        words[i] = words[i].capitalize()
    text = " ".join(words)
    return text.replace(" plan ", ".\n", 1) if rng.random() < 0.3 else text + "."


def _value(rng: random.Random, kind: str) -> Any:
    if kind == "string":
        return _text(rng, rng.randint(1, 25))
    if kind == "integer":
        return rng.randint(-5, 10_000)
    if kind == "number":
        return round(rng.uniform(-50, 50), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_text(rng, 2) for _ in range(rng.randint(1, 3))]
    return {"component": _text(rng, 1), "version": f"1.{rng.randint(0, 9)}", "ok": True}


def _turn(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.3:
        return {"role": "assistant", "content": _text(rng, rng.randint(5, 80))}
    calls = []
    for i, tool in enumerate(rng.sample(TOOLS, rng.randint(1, 3))):
        fn = tool["function"]
        args = {k: _value(rng, p["type"]) for k, p in fn["parameters"]["properties"].items()}
        calls.append(
            {"id": f"call{i:05d}", "type": "function", "function": {"name": fn["name"], "arguments": json.dumps(args)}}
        )
    content = _text(rng, rng.randint(3, 30)) if rng.random() < 0.5 else None
    return {"role": "assistant", "content": content, "tool_calls": calls}


def completion(fmt: str, turn: Mapping[str, Any]) -> str:
    """What the model writes for `turn`; a format that cannot write content beside calls
    (mistral) gets the turn without its content."""
    try:
        return _completion(fmt, turn)
    except TemplateError:
        if not (turn.get("content") and turn.get("tool_calls")):
            raise
        return _completion(fmt, {**turn, "content": None})


def _completion(fmt: str, turn: Mapping[str, Any]) -> str:
    """The rendered turn up to its end-of-turn token, as the harness derives it."""
    prefix = render(fmt, CONTEXT, TOOLS, add_generation_prompt=True)
    full = render(fmt, [*CONTEXT, turn], TOOLS, add_generation_prompt=False)
    if not full.startswith(prefix):
        raise ValueError("rendering the turn changed the prompt before it")
    text = full[len(prefix) :]
    eos = get_format(fmt).eos
    end = text.rfind(eos)
    return text[: end + len(eos)] if end >= 0 else text


def corpus(fmt: str, n: int, seed: int) -> tuple[list[str], int]:
    """n outputs (and how many random turns the format refused and were skipped)."""
    rng = random.Random(seed)
    outputs: list[str] = []
    refused = 0
    while len(outputs) < n and refused < n:
        try:
            outputs.append(completion(fmt, _turn(rng)))
        except (TemplateError, ValueError):  # a turn this format cannot write: counted, reported
            refused += 1
    return outputs, refused


def sized_output(fmt: str, size_bytes: int, seed: int) -> str:
    """One call turn writing a long file, about `size_bytes` of output."""
    rng = random.Random(seed)
    content = _text(rng, 10)
    body = _text(rng, 40)
    while True:
        call = {"name": "write_file", "arguments": json.dumps({"path": "notes/long.md", "content": body})}
        turn = {
            "role": "assistant",
            "content": content,
            "tool_calls": [{"id": "call00000", "type": "function", "function": call}],
        }
        text = completion(fmt, turn)
        missing = size_bytes - len(text.encode())
        if missing <= 0:
            return text
        body += "\n" + _text(rng, max(1, missing // 6))


# ---- measurement ------------------------------------------------------------------------


def _whole(fmt: str, texts: Sequence[str]) -> None:
    for text in texts:
        parse(fmt, text, TOOLS, call_ids=sequential_call_ids())


def _streamed(fmt: str, split_texts: Sequence[Sequence[str]]) -> None:
    for deltas in split_texts:
        parser = stream_parser(fmt, TOOLS, call_ids=sequential_call_ids())
        for delta in deltas:
            parser.feed(delta)
        parser.finish()
        parser.result()


def best_time_s(work: Callable[[], None], repeats: int) -> float:
    """Best CPU time of `repeats` runs: process time, not wall time, because the machines
    this runs on are shared and wall time there mostly measures the other tenants."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return min(times)


def deltas(text: str) -> list[str]:
    return [text[i : i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)]


@dataclass(frozen=True, slots=True)
class FormatResult:
    name: str
    outputs: int
    refused: int
    clean: int  # outputs that parse with no diagnostic
    corpus_bytes: int
    whole_s: float
    stream_s: float
    sizes_bytes: tuple[int, ...]
    size_stream_s: tuple[float, ...]

    @property
    def whole_mb_s(self) -> float:
        return self.corpus_bytes / self.whole_s / 1e6

    @property
    def stream_mb_s(self) -> float:
        return self.corpus_bytes / self.stream_s / 1e6

    @property
    def stream_ratio(self) -> float:
        return self.stream_s / self.whole_s

    @property
    def size_ratio(self) -> float:
        return self.size_stream_s[-1] / self.size_stream_s[0]


def measure(fmt: str, n: int, seed: int, repeats: int) -> FormatResult:
    texts, refused = corpus(fmt, n, seed)
    split_texts = [deltas(t) for t in texts]
    warm = min(200, len(texts))
    _whole(fmt, texts[:warm])
    _streamed(fmt, split_texts[:warm])
    clean = sum(1 for t in texts if not parse(fmt, t, TOOLS).diagnostics)
    whole_s = best_time_s(functools.partial(_whole, fmt, texts), repeats)
    stream_s = best_time_s(functools.partial(_streamed, fmt, split_texts), repeats)
    sized = [sized_output(fmt, size, seed) for size in SIZES_BYTES]
    size_times = []
    for text in sized:
        reps = max(2, 200_000 // len(text))  # about 200 KB streamed per timing
        size_times.append(best_time_s(functools.partial(_streamed, fmt, [deltas(text)] * reps), repeats) / reps)
    return FormatResult(
        name=fmt,
        outputs=len(texts),
        refused=refused,
        clean=clean,
        corpus_bytes=sum(len(t.encode()) for t in texts),
        whole_s=whole_s,
        stream_s=stream_s,
        sizes_bytes=tuple(len(t.encode()) for t in sized),
        size_stream_s=tuple(size_times),
    )


def available(fmt: str) -> str | None:
    """None when the format's parser and renderer import; else why not."""
    try:
        stream_parser(fmt, TOOLS)
        render(fmt, CONTEXT, TOOLS)
    except Exception as e:  # reported in the table and the JSON line, never hidden
        return f"{type(e).__name__}: {e}"
    return None


# ---- report -----------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count()}  # fmt: skip


def print_table(results: Sequence[FormatResult], failed: Mapping[str, str]) -> None:
    head = f"{'format':<12} {'outputs':>7} {'clean':>6} {'MB':>6} {'whole MB/s':>10} {'stream MB/s':>11}"
    head += f" {'stream/whole':>12} {'1KB ms':>7} {'10KB ms':>8} {'100KB ms':>9} {'100KB/1KB':>9}  targets"
    print(head)
    print("-" * len(head))
    for r in results:
        ok = "ok" if r.stream_ratio <= MAX_STREAM_RATIO and r.size_ratio <= MAX_SIZE_RATIO else "MISSED"
        t1, t10, t100 = (t * 1e3 for t in r.size_stream_s)
        print(
            f"{r.name:<12} {r.outputs:>7} {r.clean:>6} {r.corpus_bytes / 1e6:>6.2f} {r.whole_mb_s:>10.2f}"
            f" {r.stream_mb_s:>11.2f} {r.stream_ratio:>12.2f} {t1:>7.2f} {t10:>8.2f} {t100:>9.2f}"
            f" {r.size_ratio:>9.1f}  {ok}"
        )
    for name, why in failed.items():
        print(f"{name:<12} not measured: {why}")
    print(f"targets: stream/whole <= {MAX_STREAM_RATIO}, 100KB/1KB <= {MAX_SIZE_RATIO}; deltas of {DELTA_CHARS} chars")


def write_chart(results: Sequence[FormatResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = range(len(results))
    bars.bar([x - 0.2 for x in xs], [r.whole_mb_s for r in results], 0.4, label="whole (parse)")
    bars.bar([x + 0.2 for x in xs], [r.stream_mb_s for r in results], 0.4, label=f"streamed, {DELTA_CHARS}-char deltas")
    bars.set_xticks(list(xs), [r.name for r in results], rotation=20)
    bars.set_ylabel("MB/s")
    bars.set_title("Parser throughput")
    bars.legend()
    for r in results:
        lines.plot([s / 1e3 for s in r.sizes_bytes], [t * 1e3 for t in r.size_stream_s], marker="o", label=r.name)
    lines.set_xscale("log")
    lines.set_yscale("log")
    lines.set_xlabel("output size (KB)")
    lines.set_ylabel("streaming time per output (ms)")
    lines.set_title("Streaming time vs output size (linear = slope 1)")
    lines.legend()
    fig.tight_layout()
    fig.savefig(CHART, dpi=110)


def summary(results: Sequence[FormatResult], failed: Mapping[str, str], args: argparse.Namespace) -> dict[str, Any]:
    formats: dict[str, Any] = {name: {"status": "not_measured", "error": why} for name, why in failed.items()}
    for r in results:
        formats[r.name] = {
            "status": "ok",
            "outputs": r.outputs,
            "refused_turns": r.refused,
            "clean_outputs": r.clean,
            "corpus_bytes": r.corpus_bytes,
            "whole_mb_s": round(r.whole_mb_s, 3),
            "stream_mb_s": round(r.stream_mb_s, 3),
            "stream_over_whole": round(r.stream_ratio, 3),
            "size_bytes": list(r.sizes_bytes),
            "size_stream_ms": [round(t * 1e3, 4) for t in r.size_stream_s],
            "size_ratio_100kb_1kb": round(r.size_ratio, 2),
            "meets_stream_target": r.stream_ratio <= MAX_STREAM_RATIO,
            "meets_size_target": r.size_ratio <= MAX_SIZE_RATIO,
        }
    return {
        "benchmark": "parsers",
        "seed": args.seed,
        "outputs_per_format": args.outputs,
        "delta_chars": DELTA_CHARS,
        "repeats": args.repeats,
        "targets": {"stream_over_whole_max": MAX_STREAM_RATIO, "size_ratio_100kb_1kb_max": MAX_SIZE_RATIO},
        "env": environment(),
        "chart": str(CHART.name),
        "formats": formats,
    }


def main(argv: Sequence[str] | None = None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--outputs", type=int, default=10_000)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--repeats", type=int, default=3)
    cli.add_argument("--formats", nargs="*", default=list(FORMATS), help="format names (default: all)")
    cli.add_argument("--no-chart", action="store_true")
    args = cli.parse_args(argv)
    failed: dict[str, str] = {}
    results: list[FormatResult] = []
    for name in args.formats:
        why = available(name)
        if why is not None:
            failed[name] = why
            continue
        start = time.perf_counter()
        results.append(measure(name, args.outputs, args.seed, args.repeats))
        print(f"measured {name} in {time.perf_counter() - start:.0f} s", flush=True)
    print_table(results, failed)
    if results and not args.no_chart:
        write_chart(results)
    print(json.dumps(summary(results, failed, args)))


if __name__ == "__main__":
    main()
