"""bench_compile's cells: callgate's engine and the peers, timed from a request to its
first mask over one vocabulary (see bench_compile.py for what each path includes).

    Engine(vocab).cold(fmt, mode, tools) / .warm(...)
    engine_cell(engine, fmt, mode, toolset, repeats) -> dict
    xgrammar_cell(vocab, toolset, repeats) / llg_json_cell(vocab, toolset, repeats) -> dict
    stats(seconds) -> {p50_ms, p99_ms}     # p99 nearest-rank
    status_of(exception) -> str            # "not yet" | "refused: ..." | "error: ..."
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compile_workload import ToolSet, call_schema, renamed, request_args
from vocabularies import Vocab


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
    """callgate's path from a request to its first mask over one vocabulary, as a request
    meets it: the server's `callgate.constraints.build` (its cache of checked grammars),
    then what the engine's logits processor does (callgate.decoding.processor: a template
    matcher per grammar key, `deep_copy` per request) and the first mask: filled on the cold
    request and kept per grammar key, copied into the row on a warm one (the processor's
    `first_masks`)."""

    def __init__(self, vocab: Vocab) -> None:
        import llguidance.numpy

        self.vocab = vocab
        self.fill = llguidance.numpy.fill_next_token_bitmask
        self.mask = llguidance.numpy.allocate_token_bitmask(1, vocab.size)
        self.templates: dict[str, Any] = {}
        self.first_masks: dict[str, Any] = {}

    def _first_mask(self, matcher: Any) -> None:
        self.fill(matcher, self.mask, 0)
        if matcher.is_error():
            raise RuntimeError(f"the matcher is in its error state: {matcher.get_error()}")

    def _build(self, fmt: str, mode: str, tools: Sequence[Mapping[str, Any]]) -> Any:
        from callgate.constraints import build

        c = build(fmt, *request_args(mode, tools), self.vocab.llg, eos_token_id=self.vocab.eos)
        assert c is not None
        return c

    def cold(self, fmt: str, mode: str, tools: Sequence[Mapping[str, Any]]) -> tuple[float, float, int]:
        """Seconds from the request to its first mask (wall, this process's CPU), and the
        grammar's length."""
        from callgate import constraints
        from callgate.constraints import llg

        # `none` holds no tool, so renaming cannot make it a fresh request: forget what
        # `build` holds (the cache's contents, not its code) before every cold one
        constraints.CACHE.entries.clear()
        start, cpu = time.perf_counter(), time.process_time()
        c = self._build(fmt, mode, tools)
        template = self.templates[c.key] = llg.matcher(c.grammar, self.vocab.llg)
        self._first_mask(template.deep_copy())
        self.first_masks[c.key] = self.mask[0].copy()
        return time.perf_counter() - start, time.process_time() - cpu, len(c.grammar)

    def warm(self, fmt: str, mode: str, tools: Sequence[Mapping[str, Any]]) -> float:
        start = time.perf_counter()
        c = self._build(fmt, mode, tools)
        self.templates[c.key].deep_copy()
        self.mask[0] = self.first_masks[c.key]
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
