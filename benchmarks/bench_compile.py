"""Request to first mask: callgate's llguidance engine, xgrammar, llguidance's JSON path, and
the old outlines-core Index path, per format x mode x tool set x vocabulary (issue #17).

Cells: formats hermes, qwen3-xml, dsml-v3.2, dsml-v4, llama3-json, mistral x modes auto,
required, named (the set's first tool), none, response_format (the schema of a call to any
of the tools, below) x tool sets x vocabularies (benchmarks/vocabularies.py: SmolLM2 49 152,
Qwen2.5 151 936). Tool sets: `agent-12` (/work/shared/bench/agent_tools.json), `bfcl-multiple`
and `bfcl-parallel` (the tools of `--bfcl-cases` BFCL v4 cases each, seed 0, converted to JSON
Schema by bench_parse_errors' loader: every repeat is another case), `64-tools` (the first 64
distinct BFCL functions of the multiple, parallel and simple_python files, renamed unique).

* callgate cold: `grammar_request` + `lark_grammar` + `llg.check` + `llg.matcher` + the first
  `fill_next_token_bitmask` (the bitmask allocated beforehand, as a server does). Every
  repeat renames the tools (a suffix), so no cache inside any engine can serve it. Once
  `callgate.constraints.build` returns an object with a `grammar` attribute (the engine wired
  into the server) the cold path is that `build` + a matcher + the first mask instead.
* callgate warm: the same request again, served from a cache keyed by `GrammarRequest.key()`
  holding the checked grammar's matcher: normalise + key + lookup + `deep_copy` + first mask
  (with `build` wired: `build` again + matcher + first mask).
* xgrammar 0.2.8: `GrammarCompiler(max_threads=2).compile_json_schema` (compact separators)
  + `GrammarMatcher` + first mask; warm: the same schema again (its compiler's cache). The
  schema is the calls as one JSON schema: anyOf of {name: const, arguments: parameters}.
* llguidance's JSON path: `LLMatcher.grammar_from_json_schema` of that schema + validate +
  matcher + first mask.
* old baseline: `callgate.constraints.grammar.grammar(req).regex` + the old size check +
  outlines-core `Index` + its first allowed tokens, in a child process killed past
  `--baseline-timeout` ("timeout"); on `--baseline-cells` cells (hermes/required first).

Every cold figure is wall-clock time (what a request waits) and this process's CPU time
(`cold_cpu_*`: the work, which the shared machine's load inflates far less).
A cell's status: ok, "not yet" (its family's module still raises NotImplementedError),
"refused: ..." (SchemaTooComplexError), "error: ...". p99 is nearest-rank (the maximum
below 100 repeats). Targets (issue #17 item 2): cold p50 <= 50 ms, p99 <= 250 ms, warm <= 1 ms.
Prints a table, draws benchmarks/compile.png (unless --no-chart), ends with ONE JSON line.

    python benchmarks/bench_compile.py [--repeats 10] [--bfcl-cases 10] [--baseline-cells 4]
        [--baseline-timeout 60] [--formats hermes,...] [--modes ...] [--tool-sets ...]
        [--vocabs smollm2,qwen2.5] [--no-chart]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import compile_report  # noqa: E402  (benchmarks/compile_report.py: table and chart)
from vocabularies import NAMES as VOCABS  # noqa: E402
from vocabularies import Vocab, load  # noqa: E402

FORMATS = ("hermes", "qwen3-xml", "dsml-v3.2", "dsml-v4", "llama3-json", "mistral")
MODES = ("auto", "required", "named", "none", "response_format")
TOOL_SETS = ("agent-12", "bfcl-multiple", "bfcl-parallel", "64-tools")
AGENT_TOOLS = Path("/work/shared/bench/agent_tools.json")
BFCL_CACHE = Path.home() / ".cache" / "callgate" / "bfcl"
TARGETS = {"cold_p50_ms": 50.0, "cold_p99_ms": 250.0, "warm_p50_ms": 1.0}
SEED = 0


# ---- workload ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSet:
    """A named tool set; `samples` are the tool lists its repeats cycle through."""

    name: str
    samples: tuple[tuple[Mapping[str, Any], ...], ...]

    def sample(self, r: int) -> tuple[Mapping[str, Any], ...]:
        return self.samples[r % len(self.samples)]


def renamed(tools: Sequence[Mapping[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """`tools` with `suffix` appended to every function name (a fresh cache key)."""
    return [{**t, "function": {**t["function"], "name": t["function"]["name"] + suffix}} for t in tools]


def call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The calls as one JSON schema: anyOf of {name: const, arguments: parameters}."""
    branches = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def request_args(mode: str, tools: Sequence[Mapping[str, Any]]) -> tuple[Any, Any, Any, Any]:
    """(tools, tool_choice, parallel_tool_calls, response_format) of a mode."""
    if mode == "response_format":
        return None, None, None, {"type": "json_schema", "json_schema": {"name": "calls", "schema": call_schema(tools)}}
    if mode == "named":
        return tools, {"type": "function", "function": {"name": tools[0]["function"]["name"]}}, None, None
    return tools, mode, None, None


def _bfcl_rows(wheel: zipfile.ZipFile, category: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in wheel.read(f"bfcl_eval/data/BFCL_v4_{category}.json").decode().splitlines()]


def tool_sets(names: Sequence[str], bfcl_cases: int, cache: Path = BFCL_CACHE) -> list[ToolSet]:
    out: list[ToolSet] = []
    if "agent-12" in names:
        out.append(ToolSet("agent-12", (tuple(json.loads(AGENT_TOOLS.read_text())),)))
    bfcl = [n for n in names if n != "agent-12"]
    if not bfcl:
        return out
    import bench_parse_errors as pe

    wheel = zipfile.ZipFile(pe.bfcl_wheel(cache))
    rng = random.Random(SEED)
    for category in ("multiple", "parallel"):
        if f"bfcl-{category}" in names:
            rows = rng.sample(_bfcl_rows(wheel, category), bfcl_cases)
            out.append(ToolSet(f"bfcl-{category}", tuple(pe.make_case(row, []).tools for row in rows)))
    if "64-tools" in names:
        seen: dict[str, Mapping[str, Any]] = {}
        for category in ("multiple", "parallel", "simple_python"):
            for row in _bfcl_rows(wheel, category):
                for tool in pe.make_case(row, []).tools:
                    seen.setdefault(tool["function"]["name"], tool)
        picked = list(seen.values())[:64]
        out.append(ToolSet("64-tools", (tuple(renamed(picked[i : i + 1], f"_{i}")[0] for i in range(len(picked))),)))
    return [t for name in names for t in out if t.name == name]


# ---- timings -------------------------------------------------------------------------------


def stats(samples_s: Sequence[float]) -> dict[str, float | None]:
    """p50 and nearest-rank p99 in ms."""
    if not samples_s:
        return {"p50_ms": None, "p99_ms": None}
    ordered = sorted(samples_s)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return {"p50_ms": round(statistics.median(ordered) * 1e3, 3), "p99_ms": round(p99 * 1e3, 3)}


def status_of(exc: BaseException) -> str:
    """A failed cell's status: "not yet" for a Lark family still unwritten."""
    from callgate.constraints.lark_grammar import FAMILIES
    from callgate.errors import SchemaTooComplexError

    if isinstance(exc, NotImplementedError):
        return "not yet"
    if isinstance(exc, AttributeError) and getattr(exc, "obj", None) in FAMILIES.values():
        return "not yet"  # a placeholder module without the family's other functions
    first = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, SchemaTooComplexError):
        return f"refused: {first[:160]}"
    return f"error: {type(exc).__name__}: {first[:160]}"


class Engine:
    """callgate's path from a request to its first mask over one vocabulary."""

    def __init__(self, vocab: Vocab) -> None:
        import llguidance.numpy

        self.vocab = vocab
        self.fill = llguidance.numpy.fill_next_token_bitmask
        self.mask = llguidance.numpy.allocate_token_bitmask(1, vocab.size)
        self.cache: dict[str, Any] = {}

    def _first_mask(self, matcher: Any) -> None:
        self.fill(matcher, self.mask, 0)
        if matcher.is_error():
            raise RuntimeError(f"the matcher is in its error state: {matcher.get_error()}")

    def cold(self, fmt: str, mode: str, tools: Sequence[Mapping[str, Any]]) -> tuple[float, float, int]:
        """Seconds from the request to its first mask (wall, this process's CPU), and the
        grammar's length."""
        from callgate.constraints import llg
        from callgate.constraints.lark_grammar import lark_grammar
        from callgate.constraints.request import grammar_request

        start, cpu = time.perf_counter(), time.process_time()
        req = grammar_request(fmt, *request_args(mode, tools))
        assert req is not None
        text = lark_grammar(req, self.vocab.llg.specials)
        llg.check(text, self.vocab.llg, "tools")
        matcher = llg.matcher(text, self.vocab.llg)
        self._first_mask(matcher)
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        self.cache[req.key()] = matcher
        return took, cpu, len(text)

    def warm(self, fmt: str, mode: str, tools: Sequence[Mapping[str, Any]]) -> float:
        from callgate.constraints.request import grammar_request

        start = time.perf_counter()
        req = grammar_request(fmt, *request_args(mode, tools))
        assert req is not None
        matcher = self.cache[req.key()].deep_copy()
        self._first_mask(matcher)
        return time.perf_counter() - start


def engine_cell(engine: Engine, fmt: str, mode: str, tools: ToolSet, repeats: int) -> dict[str, Any]:
    cold: list[float] = []
    cpu: list[float] = []
    warm: list[float] = []
    row: dict[str, Any] = {"format": fmt, "mode": mode, "tools": tools.name, "vocab": engine.vocab.name}
    for r in range(repeats):
        fresh = renamed(tools.sample(r), f"_{r}")
        try:
            took, used, chars = engine.cold(fmt, mode, fresh)
            warm.append(engine.warm(fmt, mode, fresh))
        except Exception as exc:  # a refusal or a bug is this cell's result, never the run's end
            return {**row, "status": status_of(exc), "n": len(cold)}
        cold.append(took)
        cpu.append(used)
        row.setdefault("grammar_chars", chars)
    return _ok(row, cold, cpu, warm)


def _ok(row: dict[str, Any], cold: list[float], cpu: list[float], warm: list[float]) -> dict[str, Any]:
    figures = _prefixed("cold", stats(cold)) | _prefixed("cold_cpu", stats(cpu)) | _prefixed("warm", stats(warm))
    return {**row, "status": "ok", "n": len(cold), **figures}


def _prefixed(prefix: str, d: Mapping[str, Any]) -> dict[str, Any]:
    return {f"{prefix}_{k}": v for k, v in d.items()}


def xgrammar_cell(vocab: Vocab, tools: ToolSet, repeats: int) -> dict[str, Any]:
    import xgrammar

    compiler = xgrammar.GrammarCompiler(vocab.xgrammar(), max_threads=2)
    mask = xgrammar.allocate_token_bitmask(1, vocab.size)

    def once(schema: Mapping[str, Any]) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        compiled = compiler.compile_json_schema(dict(schema), any_whitespace=False, separators=(", ", ": "))
        xgrammar.GrammarMatcher(compiled).fill_next_token_bitmask(mask)
        return time.perf_counter() - start, time.process_time() - cpu

    return _peer_cell("xgrammar", vocab, tools, repeats, once)


def llg_json_cell(vocab: Vocab, tools: ToolSet, repeats: int) -> dict[str, Any]:
    import llguidance
    import llguidance.numpy

    mask = llguidance.numpy.allocate_token_bitmask(1, vocab.size)
    options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

    def once(schema: Mapping[str, Any]) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        text = llguidance.LLMatcher.grammar_from_json_schema(dict(schema), defaults=options)
        error = llguidance.LLMatcher.validate_grammar(text, vocab.llg.tokenizer)
        if error:
            raise ValueError(error.strip().splitlines()[0])
        matcher = llguidance.LLMatcher(vocab.llg.tokenizer, text, log_level=0)
        llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
        return time.perf_counter() - start, time.process_time() - cpu

    return _peer_cell("llguidance-json", vocab, tools, repeats, once, cached=False)


def _peer_cell(
    engine: str,
    vocab: Vocab,
    tools: ToolSet,
    repeats: int,
    once: Callable[[Mapping[str, Any]], tuple[float, float]],
    *,
    cached: bool = True,
) -> dict[str, Any]:
    """`once(schema)` per repeat on a fresh schema; again on the same one where the engine
    has a cache of its own (`cached`: xgrammar's compiler), else warm is None."""
    row: dict[str, Any] = {"engine": engine, "tools": tools.name, "vocab": vocab.name}
    cold: list[float] = []
    cpu: list[float] = []
    warm: list[float] = []
    for r in range(repeats):
        schema = call_schema(renamed(tools.sample(r), f"_{r}"))
        try:
            took, used = once(schema)
            cold.append(took)
            cpu.append(used)
            if cached:
                warm.append(once(schema)[0])
        except Exception as exc:
            return {**row, "status": f"error: {type(exc).__name__}: {str(exc)[:160]}", "n": len(cold)}
    return _ok(row, cold, cpu, warm)


# ---- the old outlines-core path, in a child process ---------------------------------------


def _old_index(conn: Any, ordinary: Mapping[bytes, list[int]], eos: int, regex: str) -> None:
    """Child: the old size check + Index + first allowed tokens over the vocabulary."""
    from callgate.constraints.cache import compile_index, token_vocabulary
    from callgate.constraints.index_size import check_size
    from callgate.errors import SchemaTooComplexError

    vocabulary = token_vocabulary(dict(ordinary), eos)
    conn.send(("ready",))
    start = time.perf_counter()
    try:
        check_size(regex, vocabulary, "tools")
    except SchemaTooComplexError as exc:
        conn.send(("refused", time.perf_counter() - start, str(exc).split(";")[0]))
        return
    index = compile_index(regex, vocabulary)
    index.get_allowed_tokens(index.get_initial_state())
    conn.send(("ok", time.perf_counter() - start))


def run_capped(
    target: Callable[..., None], args: tuple[Any, ...], cap_s: float, setup_s: float = 120.0
) -> tuple[Any, ...]:
    """Run `target(conn, *args)` in a fresh process; it sends ("ready",) once set up, then
    its result tuple. ("timeout", cap_s) when no result comes `cap_s` after ready (the
    child is killed); ("error", message) when it dies or never gets ready."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    try:
        if not parent.poll(setup_s):
            return ("error", "the child never got ready")
        parent.recv()
        if not parent.poll(cap_s):
            return ("timeout", cap_s)
        result: tuple[Any, ...] = parent.recv()
        return result
    except EOFError:
        return ("error", f"the child died (exit code {proc.exitcode})")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


def baseline_cell(fmt: str, mode: str, tools: ToolSet, vocab: Vocab, cap_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"engine": "outlines-core (old)", "format": fmt, "mode": mode}
    row |= {"tools": tools.name, "vocab": vocab.name}
    try:
        from callgate.constraints.grammar import grammar
        from callgate.constraints.request import grammar_request

        start = time.perf_counter()
        req = grammar_request(fmt, *request_args(mode, renamed(tools.sample(0), "_0")))
        assert req is not None
        regex = grammar(req).regex
        regex_s = time.perf_counter() - start
    except Exception as exc:
        return {**row, "status": status_of(exc)}
    ordinary = {k: list(v) for k, v in vocab.ordinary.items()}
    result = run_capped(_old_index, (ordinary, vocab.eos, regex), cap_s)
    row["regex_chars"] = len(regex)
    if result[0] == "ok":
        return {**row, "status": "ok", "cold_ms": round((regex_s + result[1]) * 1e3, 1)}
    if result[0] == "refused":
        return {**row, "status": f"refused: {result[2]}", "cold_ms": round((regex_s + result[1]) * 1e3, 1)}
    if result[0] == "timeout":
        return {**row, "status": "timeout", "cold_ms": None, "cap_s": cap_s}
    return {**row, "status": f"error: {result[1]}"}


def baseline_plan(n: int, formats: Sequence[str], sets: Sequence[str], vocabs: Sequence[str]) -> list[tuple[str, ...]]:
    """The first `n` baseline cells: hermes/required on every tool set (SmolLM2 first, then
    Qwen2.5), then the other formats' required and auto on the agent tools."""
    order = [("hermes", "required", s, v) for v in VOCABS for s in TOOL_SETS]
    order += [(f, m, "agent-12", v) for v in VOCABS for f in FORMATS if f != "hermes" for m in ("required", "auto")]
    order += [("hermes", "auto", s, v) for v in VOCABS for s in TOOL_SETS]
    fit = [c for c in order if c[0] in formats and c[2] in sets and c[3] in vocabs]
    return fit[:n]


# ---- run -----------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    import llguidance

    from callgate.constraints import lark_grammar

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "llguidance": getattr(llguidance, "__version__", "?"),
        "outlines_core": _version("outlines_core"),
        "xgrammar": _version("xgrammar"),
        "families": sorted(lark_grammar.FAMILIES),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def run(args: argparse.Namespace, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Every cell the arguments select; the JSON document of the run."""
    env = environment()
    sets = tool_sets(args.tool_sets, args.bfcl_cases)
    cells: list[dict[str, Any]] = []
    peers: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    plan = baseline_plan(args.baseline_cells, args.formats, args.tool_sets, args.vocabs)
    for vname in args.vocabs:
        started = time.perf_counter()
        vocab = load(vname) if isinstance(vname, str) else vname
        progress(f"vocabulary {vocab.name}: {vocab.size} ids, {time.perf_counter() - started:.1f} s")
        engine = Engine(vocab)
        engine_cell(engine, "hermes", "required", sets[0], 1)  # warm-up, not reported
        for tools in sets:
            for fmt in args.formats:
                for mode in args.modes:
                    cells.append(engine_cell(engine, fmt, mode, tools, args.repeats))
            if args.peers:
                peers.append(xgrammar_cell(vocab, tools, args.repeats))
                peers.append(llg_json_cell(vocab, tools, args.repeats))
            progress(f"  {tools.name}: {len(args.formats) * len(args.modes)} cells")
        for fmt, mode, tname, _ in (c for c in plan if c[3] == vocab.name):
            tools = next(t for t in sets if t.name == tname)
            baseline.append(baseline_cell(fmt, mode, tools, vocab, args.baseline_timeout))
            progress(f"  baseline {fmt}/{mode} {tname}: {baseline[-1]['status']}")
    env["load_end"] = [round(x, 2) for x in os.getloadavg()]
    doc = {"benchmark": "bench_compile", "env": env, "repeats": args.repeats, "bfcl_cases": args.bfcl_cases}
    return {**doc, "targets": TARGETS, "summary": compile_report.summary(cells, TARGETS), "cells": cells} | {
        "peers": peers,
        "baseline": baseline,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--formats", type=csv, default=list(FORMATS))
    p.add_argument("--modes", type=csv, default=list(MODES))
    p.add_argument("--tool-sets", type=csv, default=list(TOOL_SETS))
    p.add_argument("--vocabs", type=csv, default=list(VOCABS))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--bfcl-cases", type=int, default=10)
    p.add_argument("--baseline-cells", type=int, default=4)
    p.add_argument("--baseline-timeout", type=float, default=60.0)
    p.add_argument("--no-peers", dest="peers", action="store_false")
    p.add_argument("--chart", default=str(ROOT / "benchmarks" / "compile.png"))
    p.add_argument("--no-chart", dest="chart", action="store_const", const=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    doc = run(args, progress=lambda s: print(s, flush=True))
    print(compile_report.table(doc))
    if args.chart:
        compile_report.chart(doc, Path(args.chart))
        print(f"chart: {args.chart}")
    print(json.dumps(doc, separators=(",", ":")))


if __name__ == "__main__":
    main()
