"""bench_compile's report: the targets' summary, the human table, and the chart.

Reads the JSON document bench_compile.run returns (cells, peers, baseline); knows nothing
of engines.

    summary(cells, targets) -> dict      # statuses; worst p50/p99/warm; cells past a target
    table(doc) -> str
    chart(doc, path)                     # PNG: per vocabulary, per tool set, log scale
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_CHECKS = (("cold_p50_ms", "cold p50"), ("cold_p99_ms", "cold p99"), ("warm_p50_ms", "warm p50"))


def summary(cells: Sequence[Mapping[str, Any]], targets: Mapping[str, float]) -> dict[str, Any]:
    """Cells per status ("refused: ..." and "error: ..." counted under their first word),
    the worst ok figures, and every ok cell past a target."""
    statuses = Counter(str(c["status"]).split(":")[0] for c in cells)
    ok = [c for c in cells if c["status"] == "ok"]
    keys = [key for key, _ in _CHECKS] + ["cold_cpu_p50_ms", "cold_cpu_p99_ms"]
    worst = {key: max((c[key] for c in ok), default=None) for key in keys}
    past = [
        {"cell": _name(c), "key": key, "value": c[key], "target": targets[key]}
        for c in ok
        for key, _ in _CHECKS
        if c[key] is not None and c[key] > targets[key]
    ]
    return {"statuses": dict(statuses), "worst": worst, "past_target": past, "all_ok_meet_targets": not past}


def _name(c: Mapping[str, Any]) -> str:
    return f"{c['format']}/{c['mode']} {c['tools']} {c['vocab']}"


def _cell_text(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "-"
    if c["status"] != "ok":
        return str(c["status"]).split(":")[0]
    return f"{c['cold_p50_ms']:.1f}/{c['cold_p99_ms']:.1f} ({c['cold_cpu_p50_ms']:.1f}) · {c['warm_p50_ms']:.2f}"


def headline(doc: Mapping[str, Any]) -> str:
    """One row per (vocabulary, tool set): each format's worst cold p50/p99 over its modes
    (wall, ms; CPU p50 in brackets; `n/5` where only n modes are written), the peers' and
    the old path's (hermes/required)."""
    cells, peers, baseline = doc["cells"], doc.get("peers", []), doc.get("baseline", [])
    formats = list(dict.fromkeys(c["format"] for c in cells))
    engines = list(dict.fromkeys(p["engine"] for p in peers))
    head = ["vocab", "tools", *formats, *engines, *(["old Index"] if baseline else [])]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for vocab, tools in dict.fromkeys((c["vocab"], c["tools"]) for c in cells):
        row = [vocab, tools]
        for fmt in formats:
            mine = [c for c in cells if (c["vocab"], c["tools"], c["format"]) == (vocab, tools, fmt)]
            ok = [c for c in mine if c["status"] == "ok"]
            text = _worst(ok) if ok else str(mine[0]["status"]).split(":")[0] if mine else "-"
            row.append(text if len(ok) in (0, len(mine)) else f"{text} {len(ok)}/{len(mine)}")
        for engine in engines:
            mine = [p for p in peers if (p["vocab"], p["tools"], p["engine"]) == (vocab, tools, engine)]
            ok = [p for p in mine if p["status"] == "ok"]
            row.append(_worst(ok) if ok else (str(mine[0]["status"]).split(":")[0] if mine else "-"))
        if baseline:
            old = [
                b
                for b in baseline
                if (b["vocab"], b["tools"], b["format"], b["mode"]) == (vocab, tools, "hermes", "required")
            ]
            row.append(_old_text(old[0]) if old else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _worst(cells: Sequence[Mapping[str, Any]]) -> str:
    p50, p99, cpu = (max(float(c[k]) for c in cells) for k in ("cold_p50_ms", "cold_p99_ms", "cold_cpu_p50_ms"))
    return f"{p50:.0f}/{p99:.0f} ({cpu:.0f})"


def _old_text(b: Mapping[str, Any]) -> str:
    if b["status"] == "timeout":
        return f"timeout (> {b['cap_s']:.0f} s)"
    if b["status"].startswith("refused") and b.get("cold_ms") is not None:
        return f"refused after {b['cold_ms'] / 1e3:.1f} s"
    return f"{b['cold_ms'] / 1e3:.1f} s" if b.get("cold_ms") is not None else str(b["status"]).split(":")[0]


def table(doc: Mapping[str, Any]) -> str:
    cells = doc["cells"]
    modes = list(dict.fromkeys(c["mode"] for c in cells))
    by = {(c["vocab"], c["tools"], c["format"], c["mode"]): c for c in cells}
    env = doc["env"]
    lines = [
        f"load average {env['load_start']} -> {env.get('load_end')}; {env['cpus']} CPUs; llguidance "
        f"{env['llguidance']}, xgrammar {env['xgrammar']}, outlines-core {env['outlines_core']}; "
        f"{doc['repeats']} repeats (BFCL: {doc['bfcl_cases']} cases)",
        "",
        "worst over the modes: cold p50/p99 (CPU p50), ms",
        headline(doc),
        "",
        "callgate: cold p50/p99 (cold CPU p50) · warm p50, ms (request to first mask)",
        "| vocab | tools | format | " + " | ".join(modes) + " |",
        "|---|---|---|" + "---:|" * len(modes),
    ]
    for vocab, tools, fmt in dict.fromkeys((c["vocab"], c["tools"], c["format"]) for c in cells):
        row = [_cell_text(by.get((vocab, tools, fmt, m))) for m in modes]
        lines.append(f"| {vocab} | {tools} | {fmt} | " + " | ".join(row) + " |")
    errors = [c for c in cells if str(c["status"]).startswith(("refused", "error"))]
    lines += [f"  {_name(c)}: {c['status']}" for c in errors]
    if doc.get("peers"):
        lines += [
            "",
            "peers: the calls as one JSON schema, ms",
            "| engine | vocab | tools | cold p50 | cold p99 | cold CPU p50 | warm p50 |",
        ]
        lines.append("|---|---|---|---:|---:|---:|---:|")
        for p in doc["peers"]:
            if p["status"] == "ok":
                warm = "no cache" if p["warm_p50_ms"] is None else f"{p['warm_p50_ms']:.2f}"
                figures = f"{p['cold_p50_ms']:.1f} | {p['cold_p99_ms']:.1f} | {p['cold_cpu_p50_ms']:.1f} | {warm}"
            else:
                figures = f"{p['status'][:60]} | | | "
            lines.append(f"| {p['engine']} | {p['vocab']} | {p['tools']} | {figures} |")
    if doc.get("baseline"):
        lines += ["", "old outlines-core Index path (cold, one sample) beside callgate's cold p50"]
        lines += ["| format/mode | vocab | tools | old | callgate p50 | speedup |", "|---|---|---|---:|---:|---:|"]
        for b in doc["baseline"]:
            new = by.get((b["vocab"], b["tools"], b["format"], b["mode"]))
            p50 = new.get("cold_p50_ms") if new else None
            old = b.get("cold_ms")
            old_text = f"{old / 1e3:.2f} s" if old is not None else b["status"]
            if b["status"].startswith("refused") and old is not None:
                old_text = f"{b['status'][:70]} (after {old / 1e3:.2f} s)"
            speed = f"{old / p50:.0f}x" if old and p50 and b["status"] == "ok" else ""
            p50_text = f"{p50:.1f} ms" if p50 is not None else "-"
            lines.append(
                f"| {b['format']}/{b['mode']} | {b['vocab']} | {b['tools']} | {old_text} | {p50_text} | {speed} |"
            )
    s = doc["summary"]
    lines += ["", f"cells: {s['statuses']}; worst ok: {s['worst']}; past a target: {len(s['past_target'])}"]
    lines += [f"  {p['cell']}: {p['key']} {p['value']} > {p['target']}" for p in s["past_target"][:20]]
    return "\n".join(lines)


def chart(doc: Mapping[str, Any], path: Path) -> None:
    """Per vocabulary: per tool set, each format's worst cold p50 over its ok modes (whisker
    to its worst p99, a black tick at its worst CPU p50; a format with modes not yet written
    is labelled with how many are), the peers', and the old path's (hermes/required; hatched
    where it was refused or timed out: the bar is the time until then)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, peers, baseline = doc["cells"], doc.get("peers", []), doc.get("baseline", [])
    vocabs = list(dict.fromkeys(c["vocab"] for c in cells))
    sets = list(dict.fromkeys(c["tools"] for c in cells))
    series = list(dict.fromkeys(c["format"] for c in cells))
    series += list(dict.fromkeys(p["engine"] for p in peers)) + (["old Index"] if baseline else [])
    fig, axes = plt.subplots(1, len(vocabs), figsize=(7 * len(vocabs), 4.8), squeeze=False, sharey=True)
    width = 0.8 / max(len(series), 1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles: dict[str, Any] = {}
    for ax, vocab in zip(axes[0], vocabs, strict=True):
        for k, name in enumerate(series):
            bars = [(i, _bar(name, vocab, tools, cells, peers, baseline)) for i, tools in enumerate(sets)]
            bars = [(i, b) for i, b in bars if b is not None]
            if not bars:
                continue
            xs = [i + (k - len(series) / 2 + 0.5) * width for i, _ in bars]
            p50s = [b[0] for _, b in bars]
            errs = [[0.0] * len(bars), [max(b[1] - b[0], 0.0) for _, b in bars]]
            drawn = ax.bar(xs, p50s, width, yerr=errs, capsize=2, color=colors[k % len(colors)])
            for bar, (_, b) in zip(drawn, bars, strict=True):
                bar.set_hatch("//" if b[3] else "")
            cpu = [(x, b[2]) for x, (_, b) in zip(xs, bars, strict=True) if b[2] is not None]
            if cpu:
                ax.scatter([x for x, _ in cpu], [c for _, c in cpu], marker="_", color="black", s=40, zorder=3)
            handles.setdefault(_label(name, cells), drawn)
        ax.axhline(50, color="green", linestyle="--", linewidth=0.8)
        ax.axhline(250, color="orange", linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(sets)), sets)
        ax.set_title(f"{vocab}: request to first mask, ms")
    axes[0][0].set_ylabel("ms (log): cold p50, whisker p99, tick CPU p50")
    fig.legend(list(handles.values()), list(handles), fontsize=7, ncol=len(handles), loc="lower center")
    env = doc["env"]
    fig.suptitle(
        f"bench_compile: {doc['repeats']} repeats, load average {env['load_start'][0]} -> {env['load_end'][0]} "
        "on 2 shared cores; dashed: the 50 / 250 ms targets; hatched: old path refused or timed out",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label(name: str, cells: Sequence[Mapping[str, Any]]) -> str:
    mine = [c for c in cells if c["format"] == name]
    ok = {c["mode"] for c in mine if c["status"] == "ok"}
    modes = {c["mode"] for c in mine}
    return name if not mine or ok == modes else f"{name} ({len(ok)}/{len(modes)} modes)"


def _bar(
    name: str,
    vocab: str,
    tools: str,
    cells: Sequence[Mapping[str, Any]],
    peers: Sequence[Mapping[str, Any]],
    baseline: Sequence[Mapping[str, Any]],
) -> tuple[float, float, float | None, bool] | None:
    """(p50, p99, CPU p50, refused or timed out) of one series at one tool set, in ms."""
    if name == "old Index":
        for b in baseline:
            if (b["vocab"], b["tools"], b["format"], b["mode"]) == (vocab, tools, "hermes", "required"):
                if b["status"] == "timeout":
                    return float(b["cap_s"]) * 1e3, 0.0, None, True
                if b.get("cold_ms") is not None:
                    return float(b["cold_ms"]), 0.0, None, b["status"] != "ok"
        return None
    mine = [c for c in cells if (c["vocab"], c["tools"], c["format"]) == (vocab, tools, name) and c["status"] == "ok"]
    mine += [p for p in peers if (p["vocab"], p["tools"], p["engine"]) == (vocab, tools, name) and p["status"] == "ok"]
    if not mine:
        return None
    worst = [max(float(c[key]) for c in mine) for key in ("cold_p50_ms", "cold_p99_ms", "cold_cpu_p50_ms")]
    return worst[0], worst[1], worst[2], False
