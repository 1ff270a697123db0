"""Request to first mask: callgate's llguidance engine, xgrammar, llguidance's JSON path, and
the old outlines-core Index path, per format x mode x tool set x vocabulary (issue #17).

Cells (code in benchmarks/compile_{workload,cells,baseline,report}.py): formats hermes,
qwen3-xml, dsml-v3.2, dsml-v4, llama3-json, mistral x modes auto, required, named (the
set's first tool), none, response_format (the schema of a call to any of the tools, below)
x tool sets x vocabularies (benchmarks/vocabularies.py: SmolLM2 49 152, Qwen2.5 151 936).
Tool sets: `agent-12` (/work/shared/bench/agent_tools.json), `bfcl-multiple` and
`bfcl-parallel` (the tools of `--bfcl-cases` BFCL v4 cases each, seed 0, converted to JSON
Schema by bench_parse_errors' loader: every repeat is another case), `64-tools` (the first
64 distinct BFCL functions of the multiple, parallel and simple_python files, renamed).

* callgate cold, as a request meets it: the server's `callgate.constraints.build` (normalise,
  `lark_grammar`, `llg.check`; its cache of checked grammars), then what the engine's logits
  processor does (callgate.decoding.processor: a template `llg.matcher` per grammar key,
  `deep_copy` per request) and the first `fill_next_token_bitmask` (the bitmask allocated
  beforehand). Every repeat renames the tools (a suffix), so no cache inside any engine can
  serve it (and `build`'s cache is emptied first: `none` holds no tool to rename).
* callgate warm: the same request again: `build` from its cache + the processor's template
  + `deep_copy` + first mask.
* xgrammar 0.2.8: `GrammarCompiler(max_threads=2).compile_json_schema` (compact separators)
  + `GrammarMatcher` + first mask; warm: the same schema again (its compiler's cache). The
  schema is the calls as one JSON schema: anyOf of {name: const, arguments: parameters}.
* llguidance's JSON path: `LLMatcher.grammar_from_json_schema` of that schema + validate +
  matcher + first mask.
* old baseline: `regex_baseline.grammar.grammar(req).regex` (benchmarks/regex_baseline/) + the old size check +
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
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import compile_report  # noqa: E402  (table and chart)
from compile_baseline import baseline_cell, baseline_plan  # noqa: E402  (the old path)
from compile_cells import Engine, engine_cell, llg_json_cell, xgrammar_cell  # noqa: E402
from compile_workload import FORMATS, TOOL_SETS, ToolSet, tool_sets  # noqa: E402
from vocabularies import NAMES as VOCABS  # noqa: E402
from vocabularies import Vocab, load  # noqa: E402

MODES = ("auto", "required", "named", "none", "response_format")
TARGETS = {"cold_p50_ms": 50.0, "cold_p99_ms": 250.0, "warm_p50_ms": 1.0}


def environment() -> dict[str, Any]:
    import llguidance

    from callgate.constraints.lark_grammar import FAMILIES

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "llguidance": getattr(llguidance, "__version__", "?"),
        "outlines_core": _version("outlines_core"),
        "xgrammar": _version("xgrammar"),
        "families": sorted(FAMILIES),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def run(
    args: argparse.Namespace,
    progress: Callable[[str], None] = lambda s: None,
    *,
    sets: Sequence[ToolSet] | None = None,
    vocabs: Sequence[Vocab] | None = None,
) -> dict[str, Any]:
    """Every cell the arguments select (`sets` and `vocabs` given: those instead of the
    named ones); the JSON document of the run."""
    env = environment()
    sets = sets or tool_sets(args.tool_sets, args.bfcl_cases)
    cells: list[dict[str, Any]] = []
    peers: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    plan = baseline_plan(args.baseline_cells, args.formats, [t.name for t in sets], VOCABS)
    for vname in vocabs or args.vocabs:
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
    return {
        "benchmark": "bench_compile",
        "env": env,
        "repeats": args.repeats,
        "bfcl_cases": args.bfcl_cases,
        "targets": TARGETS,
        "summary": compile_report.summary(cells, TARGETS),
        "cells": cells,
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
