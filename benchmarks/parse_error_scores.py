"""bench_parse_errors' judging: one output -> an Outcome, one configuration -> its row.

Knows: how an output is read (callgate.parsers, the strict parser; EOS appended where the
model wrote it) and scored (each candidate's arguments validated with jsonschema, BFCL's
possible answers via benchmarks/bfcl_answers.py, a call written as text), what a server's
reply counts as (its tool_calls; arguments that are no JSON object and call markup left in
content are its parse errors), the metrics of a configuration's row (rates over every
output, p50/p99 nearest-rank) and issue #4's targets. Does not know: engines or the report.

    judge(fmt, case, text, finish, tokens) -> Outcome; judge_reply(case, reply) -> Outcome
    summarise(ConfigResult) -> row; targets(rows) -> {name: met}
    ratio_interval(row, unconstrained_row) -> 95 % bootstrap interval of the full-batch ratio
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import paired
from bfcl_answers import matches_ground_truth
from bfcl_cases import Case


@dataclass(frozen=True, slots=True)
class Outcome:
    case: str
    finish: str | None
    diagnostics: tuple[str, ...]
    calls: int
    schema_valid: int
    expected_hit: bool
    tokens: int
    refused: str | None = None  # the grammar could not be built; the case did not run
    error: str | None = None  # the engine failed the request
    text: str = ""  # the raw output, for --dump
    kind: str = "call"  # the case's kind
    expected_args: bool = False  # the calls match BFCL's possible answers
    text_call: bool = False  # no call, but the content names a declared tool in JSON

    @property
    def ran(self) -> bool:
        return self.refused is None and self.error is None


@dataclass(slots=True)
class ConfigResult:
    format: str
    system: str  # "callgate" | "vllm"
    mode: str
    max_tokens: int
    outcomes: list[Outcome] = field(default_factory=list)
    compile_s: list[float] = field(default_factory=list)
    decode_wall_s: float = 0.0
    mask_token_us: list[float] = field(default_factory=list)
    mask_source: str = "none"
    mask_token_us_no_budget: list[float] = field(default_factory=list)  # engine only
    windows_ns: list[tuple[int, int]] = field(default_factory=list)  # CLOCK_MONOTONIC of each chunk's run
    full_batch_tokens: int = 0  # see full_batch_window
    full_batch_s: float = 0.0
    full_batch_chunks: list[tuple[int, float]] = field(default_factory=list)  # each chunk's window, in run order
    mask_passed_share: float | None = None  # engine only: rows that took their argmax unmasked
    mask_fill_kernel_us: list[float] = field(default_factory=list)  # engine only: fill, check, kernel
    mask_parts_us: dict[str, float] | None = None  # engine only: per-token mean of each part
    mask_fill_kernel_us_full: list[float] = field(default_factory=list)  # engine only: steps at the full batch
    mask_token_us_full: list[float] = field(default_factory=list)  # engine only: whole steps at the full batch
    vocab_size: int = 0
    decode_windows_ns: list[tuple[int, int]] = field(default_factory=list)  # CLOCK_MONOTONIC of each chunk's decode
    host_share: float | None = None  # engine only: the processor's share of the decode wall time


def _valid(arguments: Any, schema: Mapping[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError:
        return False
    return True


def judge(fmt: str, case: Case, text: str, finish: str | None, tokens: int) -> Outcome:
    """Parse one output strictly (EOS appended when the model wrote it) and score it."""
    from callgate.formats import get_format
    from callgate.parsers import parse

    result = parse(fmt, text + (get_format(fmt).eos if finish == "stop" else ""), list(case.tools))
    calls = [(c.name, c.arguments) for c in result.candidates]
    codes = tuple(d.code for d in result.diagnostics)
    return score(case, calls, codes, finish, tokens, result.content or "", text)


def score(
    case: Case,
    calls: Sequence[tuple[str, Any]],
    codes: tuple[str, ...],
    finish: str | None,
    tokens: int,
    content: str,
    text: str,
) -> Outcome:
    """The outcome of one case from its calls (name, decoded arguments) and content."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
    valid = sum(1 for name, args in calls if name in schemas and _valid(args, schemas[name]))
    hit = any(name in case.expected for name, _ in calls)
    args_ok = matches_ground_truth([(n, a) for n, a in calls if isinstance(a, Mapping)], case.truth)
    text_call = not calls and names_a_tool(content, schemas)
    return Outcome(
        case.id, finish, codes, len(calls), valid, hit, tokens, text=text, kind=case.kind,
        expected_args=args_ok, text_call=text_call,
    )  # fmt: skip


def names_a_tool(content: str, tools: Mapping[str, Any]) -> bool:
    """The content holds `"name": "TOOL"` for a declared tool (a call written as text)."""
    return any(re.search(r'"name"\s*:\s*"' + re.escape(name) + '"', content) for name in tools)


def judge_reply(case: Case, reply: Any) -> Outcome:
    """A server's reply as a client sees it: its tool_calls are the calls; arguments that
    are not a JSON object, and call markup left in the content, are its parse errors."""
    if reply.error is not None:
        return Outcome(case.id, None, (), 0, 0, False, 0, error=reply.error, kind=case.kind)
    calls: list[tuple[str, Any]] = []
    codes: list[str] = []
    for name, arguments in reply.tool_calls:
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError:
            decoded = None
        if not isinstance(decoded, dict):
            codes.append("invalid_arguments_json")
        calls.append((name, decoded))
    if "<tool_call>" in reply.content or "</tool_call>" in reply.content:
        codes.append("call_markup_in_content")
    finish = "stop" if reply.finish in ("stop", "tool_calls") else reply.finish  # EOS, either way
    return score(case, calls, tuple(codes), finish, reply.completion_tokens, reply.content, reply.content)


Stamps = list[tuple[float, int]]  # (perf_counter when a delta arrived, tokens in it)


def full_batch_window(stamps: Sequence[Stamps]) -> tuple[int, float]:
    """Tokens written, and seconds, while every request of a chunk was decoding: from the
    last first token (all prefills done) to the first last token (none finished yet).
    Every configuration runs the same chunks, so this compares decoding at one batch
    size, whatever each configuration's output lengths and prompt share."""
    live = [s for s in stamps if s]
    if len(live) < 2:
        return 0, 0.0
    lo, hi = max(s[0][0] for s in live), min(s[-1][0] for s in live)
    if hi <= lo:
        return 0, 0.0
    return sum(n for s in live for t, n in s if lo < t <= hi), hi - lo


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _p50(values: Sequence[float]) -> float | None:
    return round(pct(values, 50), 1) if values else None


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def summarise(r: ConfigResult) -> dict[str, Any]:
    """One configuration's row of the table / JSON (rates are None where nothing counted)."""
    every = [o for o in r.outcomes if o.ran]
    ran = [o for o in every if o.kind == "call"]
    irrelevant = [o for o in every if o.kind == "irrelevance"]
    eos = [o for o in ran if o.finish == "stop"]
    full = [o for o in ran if o.tokens >= r.max_tokens]  # EOS as the last allowed token: closed
    calls = sum(o.calls for o in ran)
    tokens = sum(o.tokens for o in every)
    masked = r.mask_source != "none"
    return {
        "format": r.format,
        "system": r.system,
        "mode": r.mode,
        "cases": sum(1 for o in r.outcomes if o.kind == "call"),
        "refused": sum(1 for o in r.outcomes if o.refused is not None),
        "errors": sum(1 for o in r.outcomes if o.error is not None),
        "ran": len(ran),
        "natural": len(eos) - sum(1 for o in full if o.finish == "stop"),
        "closed_at_budget": sum(1 for o in full if o.finish == "stop"),
        "cut_at_budget": sum(1 for o in full if o.finish != "stop"),
        "parse_error_rate": _rate(sum(1 for o in ran if o.diagnostics), len(ran)),
        "parse_error_rate_eos": _rate(sum(1 for o in eos if o.diagnostics), len(eos)),
        "call_rate": _rate(sum(1 for o in ran if o.calls), len(ran)),
        "schema_valid_rate": _rate(sum(o.schema_valid for o in ran), calls),
        "expected_function_rate": _rate(sum(1 for o in ran if o.expected_hit), len(ran)),
        "expected_arguments_rate": _rate(sum(1 for o in ran if o.expected_args), len(ran)),
        "text_call_rate": _rate(sum(1 for o in ran if o.text_call), len(ran)),
        "irrelevance_cases": len(irrelevant),
        "irrelevance_no_call_rate": _rate(sum(1 for o in irrelevant if not o.calls), len(irrelevant)),
        "output_tokens": tokens,
        "tok_per_s": round(tokens / r.decode_wall_s, 1) if r.decode_wall_s else 0.0,
        "full_batch_tok_per_s": round(r.full_batch_tokens / r.full_batch_s, 1) if r.full_batch_s else None,
        "full_batch_tokens": r.full_batch_tokens,
        "full_batch_chunk_tok_per_s": [round(n / t, 1) if t else None for n, t in r.full_batch_chunks],
        "full_batch_chunks": [[n, round(t, 4)] for n, t in r.full_batch_chunks],
        "host_share": r.host_share,
        "compile_ms_p50": round(pct(r.compile_s, 50) * 1e3, 2) if r.compile_s else None,
        "compile_ms_p99": round(pct(r.compile_s, 99) * 1e3, 2) if r.compile_s else None,
        "mask_source": r.mask_source,
        "mask_us_p50": round(pct(r.mask_token_us, 50), 1) if masked else None,
        "mask_us_p99": round(pct(r.mask_token_us, 99), 1) if masked else None,
        "mask_us_p50_without_budget_closing": _p50(r.mask_token_us_no_budget),
        "mask_us_mean": round(sum(r.mask_token_us) / len(r.mask_token_us), 1) if masked and r.mask_token_us else None,
        "mask_passed_share": r.mask_passed_share,
        "mask_fill_kernel_us_p50": _p50(r.mask_fill_kernel_us),
        "mask_fill_kernel_us_p99": round(pct(r.mask_fill_kernel_us, 99), 1) if r.mask_fill_kernel_us else None,
        "mask_parts_us_mean": r.mask_parts_us,
        "mask_fill_kernel_us_p50_full_batch": _p50(r.mask_fill_kernel_us_full),
        "mask_us_p50_full_batch": _p50(r.mask_token_us_full),
        "vocab_size": r.vocab_size,
        "windows_ns": [list(w) for w in r.windows_ns],  # CLOCK_MONOTONIC of its chunks: its steps in the step log
        "diagnostic_codes": dict(Counter(c for o in every for c in set(o.diagnostics)).most_common()),
        "first_refusal": next((o.refused or o.error for o in r.outcomes if not o.ran), None),
    }


def ratio_to_free(row: Mapping[str, Any], free: Mapping[str, Any] | None, key: str) -> float | None:
    """`row[key]` over the unconstrained row's (None where either is missing)."""
    if free is None or not free.get(key) or row.get(key) is None:
        return None
    return float(row[key]) / float(free[key])


def paired_ratio(row: Mapping[str, Any], free: Mapping[str, Any] | None) -> float | None:
    """The median, over the rounds of an interleaved run, of a chunk's full-batch tok/s
    over the unconstrained chunk's of the same round (the same minutes of the machine; the
    n-th chunk of each, mostly the same cases): a slow minute that falls on one chunk moves
    one pair, where it moves the summed ratio. None without pairs."""
    if free is None:
        return None
    # a configuration whose cases were refused runs fewer rounds: the rounds both ran
    pairs = zip(row.get("full_batch_chunk_tok_per_s") or (), free.get("full_batch_chunk_tok_per_s") or (), strict=False)
    ratios: list[float] = sorted(float(a) / float(b) for a, b in pairs if a and b)
    if not ratios:
        return None
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def ratio_interval(
    row: Mapping[str, Any], free: Mapping[str, Any] | None, draws: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 95 % bootstrap interval of the summed full-batch ratio (`ratio_to_free`'s): the
    rounds of an interleaved run resampled with replacement, each round's chunk kept with
    the unconstrained chunk of the same round (paired.ratio_interval). How far the run's own
    chunk-to-chunk spread leaves the ratio uncertain; None with fewer than three rounds."""
    if free is None:
        return None
    chunks = zip(row.get("full_batch_chunks") or (), free.get("full_batch_chunks") or (), strict=False)
    return paired.ratio_interval([((a[0], a[1]), (b[0], b[1])) for a, b in chunks], draws, seed)


def intervals(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """`ratio_interval` of every configuration that has one, by `format_system_mode`."""
    free = {r["format"]: r for r in rows if r["system"] == "callgate" and r["mode"] == "unconstrained"}
    out = {}
    for r in rows:
        found = None if r["mode"] == "unconstrained" else ratio_interval(r, free.get(r["format"]))
        if found is not None:
            out[f"{r['format']}_{r['system']}_{r['mode']}"] = [round(found[0], 3), round(found[1], 3)]
    return out


def targets(rows: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    """Issue #4's targets for callgate, per format (absent where the run lacks the rows)."""
    by = {(r["format"], r["system"], r["mode"]): r for r in rows}
    out: dict[str, bool] = {}
    for fmt in dict.fromkeys(r["format"] for r in rows):
        free = by.get((fmt, "callgate", "unconstrained"))
        for mode in ("required", "named"):
            r = by.get((fmt, "callgate", mode))
            if r is None or not r["ran"]:
                continue
            out[f"{fmt}_{mode}_zero_parse_errors"] = r["parse_error_rate"] == 0
            out[f"{fmt}_{mode}_all_schema_valid"] = r["schema_valid_rate"] == 1
            batch = ratio_to_free(r, free, "full_batch_tok_per_s")
            if batch is not None:
                out[f"{fmt}_{mode}_full_batch_tok_s_ge_95pct"] = batch >= 0.95
            paired = paired_ratio(r, free)
            if paired is not None:
                out[f"{fmt}_{mode}_full_batch_paired_median_ge_95pct"] = paired >= 0.95
            # the mask, per row at the full batch: llguidance's fill (with the argmax
            # check that stands in for it) and callgate's kernel; the whole step (advance,
            # closing, loop) beside it; a log without full-batch steps: every step's
            limit = 30 if r.get("vocab_size", 0) <= 65536 else 60
            mask = _first(r, "mask_fill_kernel_us_p50_full_batch", "mask_fill_kernel_us_p50")
            if mask is not None:
                out[f"{fmt}_{mode}_mask_p50_le_{limit}us"] = mask <= limit
            whole = _first(r, "mask_us_p50_full_batch", "mask_us_p50")
            if whole is not None:
                out[f"{fmt}_{mode}_whole_step_p50_le_{limit}us"] = whole <= limit
    return out


def _first(row: Mapping[str, Any], *keys: str) -> Any:
    """The first of `keys` the row has a figure for (0.0 is one), else None."""
    return next((row[k] for k in keys if row.get(k) is not None), None)
