"""bench_compile's baseline: the old outlines-core Index path (benchmarks/regex_baseline/), in
a child process that is killed past its time cap (outlines-core cannot be interrupted).

    baseline_cell(fmt, mode, toolset, vocab, cap_s) -> dict   # status ok|refused|timeout|...
    baseline_plan(n, formats, tool_sets, vocabs) -> cells      # hermes/required first
    run_capped(target, args, cap_s) -> result tuple
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compile_cells import status_of
from compile_workload import FORMATS, TOOL_SETS, ToolSet, renamed, request_args
from vocabularies import NAMES as VOCABS
from vocabularies import Vocab


def _old_index(conn: Any, ordinary: Mapping[bytes, list[int]], eos: int, regex: str) -> None:
    """Child: the old size check + Index + first allowed tokens over the vocabulary."""
    from regex_baseline.cache import compile_index, token_vocabulary
    from regex_baseline.index_size import check_size

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
    child.close()  # the child holds its end: its death is our EOF
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
        from regex_baseline.grammar import grammar

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
    """The first `n` baseline cells: hermes/required on the agent tools (SmolLM2, Qwen2.5),
    on BFCL multiple and 64 tools (SmolLM2), then on every other (tool set, vocabulary), then
    the other formats' required and auto on the agent tools."""
    first = [("agent-12", "smollm2"), ("agent-12", "qwen2.5"), ("bfcl-multiple", "smollm2"), ("64-tools", "smollm2")]
    order = [("hermes", "required", s, v) for s, v in first]
    order += [("hermes", "required", s, v) for v in VOCABS for s in TOOL_SETS if (s, v) not in first]
    order += [(f, m, "agent-12", v) for v in VOCABS for f in FORMATS if f != "hermes" for m in ("required", "auto")]
    order += [("hermes", "auto", s, v) for v in VOCABS for s in TOOL_SETS]
    fit = [c for c in order if c[0] in formats and c[2] in sets and c[3] in vocabs]
    return fit[:n]
