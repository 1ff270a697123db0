"""Calls written outside the call markup under tool_choice `auto` (issue 21): how many a
server recovers, how many it still loses, and how many answers it wrongly turns into calls.

Workload (seed 0): `--cases` BFCL call cases (bench_parse_errors.load_cases: half
`simple_python`, 30 % `multiple`, 20 % `parallel`, schemas converted the same way) and
`--irrelevance` cases from BFCL's `irrelevance` category (the declared tools do not fit the
question: the right answer is text, no call), from the `bfcl-eval` wheel cached in
~/.cache/callgate/bfcl. Every case is sent once to every target as an OpenAI chat
completion: tool_choice `auto`, temperature 0, `--max-tokens`, `--concurrency` at a time.

Targets are running servers, given as `--target NAME=BASE_URL` (repeatable; BASE_URL ends
in /v1). A NAME starting with `callgate` is read as callgate (its `callgate` block says
whether a call came from a recovery round); add `#no-recover` to the URL to send
`callgate.recover_calls: false` (the same server, recovery off). Any other name is a plain
OpenAI-compatible server, e.g. `vllm serve MODEL --enable-auto-tool-choice
--tool-call-parser hermes`.

Outcomes. Call cases: `native` (tool_calls, no recovery round), `recovered` (tool_calls
from a recovery round), `lost` (no tool_calls, and the content is a call to a declared tool
written outside the markup, by callgate's own detector, parsers/outside_markup.py, applied
to every server's content alike), `text` (no call at all), `error` (an HTTP error).
Irrelevance cases: `answered` (no tool_calls), `called` (tool_calls, no recovery round),
`wrongly_recovered` (tool_calls from a recovery round: an answer turned into a call),
`lost` (content that is a call outside the markup), `error`.

Prints a table per target and kind, ends with ONE JSON document.

    python benchmarks/bench_recovery.py --model MODEL --target callgate=http://127.0.0.1:8000/v1 \\
        --target callgate-off=http://127.0.0.1:8000/v1#no-recover --target vllm=http://127.0.0.1:8001/v1 \\
        [--cases 200] [--irrelevance 100] [--max-tokens 256] [--concurrency 8] [--dump outputs.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
SEED = 0
CALL_OUTCOMES = ("native", "recovered", "lost", "text", "error")
IRRELEVANCE_OUTCOMES = ("answered", "called", "wrongly_recovered", "lost", "error")


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    kind: str  # "call" | "irrelevance"
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    base_url: str
    callgate: bool
    recover: bool

    @staticmethod
    def parse(spec: str) -> Target:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url:
            raise SystemExit(f"--target {spec!r}: expected NAME=BASE_URL")
        base, _, flag = url.partition("#")
        if flag not in ("", "no-recover"):
            raise SystemExit(f"--target {spec!r}: the only URL flag is #no-recover")
        return Target(name, base.rstrip("/"), name.startswith("callgate"), flag != "no-recover")


@dataclass(frozen=True, slots=True)
class Result:
    target: str
    case: str
    kind: str
    outcome: str
    tools_called: tuple[str, ...]
    content: str | None
    finish: str | None
    error: str | None = None


# ---- workload ------------------------------------------------------------------------------


def load_workload(calls: int, irrelevance: int, cache: Path) -> list[Case]:
    """`calls` BFCL call cases and `irrelevance` irrelevance cases (seeded picks)."""
    from bfcl_cases import bfcl_tool, bfcl_wheel, load_cases

    out = [Case(c.id, "call", c.messages, c.tools) for c in load_cases(calls, cache)] if calls else []
    if irrelevance:
        wheel = zipfile.ZipFile(bfcl_wheel(cache))
        rows = wheel.read("bfcl_eval/data/BFCL_v4_irrelevance.json").decode().splitlines()
        picked = random.Random(SEED).sample(rows, min(len(rows), irrelevance))
        for row in map(json.loads, picked):
            tools = tuple(map(bfcl_tool, row["function"]))
            out.append(Case(row["id"], "irrelevance", tuple(row["question"][0]), tools))
    return out


# ---- one answer ------------------------------------------------------------------------------


def judge(target: Target, case: Case, status: int, body: Any, fmt: str = "hermes") -> Result:
    """The outcome of one response (`status`, decoded `body`) to `case`."""
    if status != 200 or not isinstance(body, Mapping) or not body.get("choices"):
        error = json.dumps(body)[:200] if body is not None else f"HTTP {status}"
        return Result(target.name, case.id, case.kind, "error", (), None, None, error)
    choice = body["choices"][0]
    message = choice.get("message") or {}
    called = tuple(tc["function"]["name"] for tc in message.get("tool_calls") or [])
    content = message.get("content")
    recovered = target.callgate and any(
        r.get("outcome") == "recovered" for r in (body.get("callgate") or {}).get("recoveries", [])
    )
    call_case = case.kind == "call"
    if called and recovered:
        outcome = "recovered" if call_case else "wrongly_recovered"
    elif called:
        outcome = "native" if call_case else "called"
    elif _outside_markup(fmt, content, case.tools):
        outcome = "lost"
    else:
        outcome = "text" if call_case else "answered"
    return Result(target.name, case.id, case.kind, outcome, called, content, choice.get("finish_reason"))


def _outside_markup(fmt: str, content: str | None, tools: Sequence[Mapping[str, Any]]) -> bool:
    from callgate.parsers.outside_markup import find_call_outside_markup
    from callgate.types import ParseResult

    if not content:
        return False
    result = ParseResult(content=content, reasoning=None, candidates=(), diagnostics=())
    return find_call_outside_markup(fmt, content, result, tools, truncated=True) is not None


async def ask(client: httpx.AsyncClient, target: Target, case: Case, model: str, max_tokens: int) -> Result:
    body: dict[str, Any] = {
        "model": model,
        "messages": list(case.messages),
        "tools": list(case.tools),
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if target.callgate and not target.recover:
        body["callgate"] = {"recover_calls": False}
    try:
        resp = await client.post(target.base_url + "/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return Result(target.name, case.id, case.kind, "error", (), None, None, f"{type(exc).__name__}: {exc}")
    try:
        decoded = resp.json()
    except ValueError:
        decoded = None
    return judge(target, case, resp.status_code, decoded)


async def run_target(
    target: Target, cases: Sequence[Case], *, model: str, max_tokens: int, concurrency: int, api_key: str = "none"
) -> list[Result]:
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), headers=headers) as client:

        async def one(case: Case) -> Result:
            async with gate:
                return await ask(client, target, case, model, max_tokens)

        return list(await asyncio.gather(*(one(c) for c in cases)))


# ---- report ------------------------------------------------------------------------------------


def summarise(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One row per (target, kind): counts of every outcome and their rates."""
    rows: list[dict[str, Any]] = []
    for target in dict.fromkeys(r.target for r in results):
        for kind, outcomes in (("call", CALL_OUTCOMES), ("irrelevance", IRRELEVANCE_OUTCOMES)):
            mine = [r for r in results if r.target == target and r.kind == kind]
            if not mine:
                continue
            counts = Counter(r.outcome for r in mine)
            row: dict[str, Any] = {"target": target, "kind": kind, "cases": len(mine)}
            row |= {o: counts.get(o, 0) for o in outcomes}
            row |= {f"{o}_rate": round(counts.get(o, 0) / len(mine), 4) for o in outcomes}
            rows.append(row)
    return rows


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    for kind, outcomes in (("call", CALL_OUTCOMES), ("irrelevance", IRRELEVANCE_OUTCOMES)):
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        print(f"\n{kind} cases")
        print(f"{'target':<20} {'cases':>6} " + " ".join(f"{o:>18}" for o in outcomes))
        for r in mine:
            cells = " ".join(f"{_cell(r[o], r[o + '_rate']):>18}" for o in outcomes)
            print(f"{r['target']:<20} {r['cases']:>6} {cells}")


def _cell(count: int, rate: float) -> str:
    return f"{count} ({100 * rate:.1f} %)"


def environment(args: Any) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "seed": SEED,
        "model": args.model,
        "cases": args.cases,
        "irrelevance": args.irrelevance,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "targets": args.target,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", required=True, help="the model name every target serves")
    parser.add_argument("--target", action="append", required=True, help="NAME=BASE_URL[#no-recover], repeatable")
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--irrelevance", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--cache", default="~/.cache/callgate/bfcl")
    parser.add_argument("--dump", default="", help="append every answer to this JSON-lines file")
    parser.add_argument("--chart", default="", help="draw the run's chart here (PNG)")
    parser.add_argument("--chart-from", default="", help="only draw --chart from this earlier run's output")
    args = parser.parse_args()
    if args.chart_from:
        doc = json.loads(Path(args.chart_from).read_text().strip().splitlines()[-1])
        chart(doc["results"], Path(args.chart or "benchmarks/recovery.png"), doc["env"])
        return
    targets = [Target.parse(t) for t in args.target]
    cases = load_workload(args.cases, args.irrelevance, Path(args.cache).expanduser())
    started = time.perf_counter()
    results: list[Result] = []
    for target in targets:
        kw = {"model": args.model, "max_tokens": args.max_tokens, "concurrency": args.concurrency}
        results += asyncio.run(run_target(target, cases, api_key=args.api_key, **kw))
    if args.dump:
        with Path(args.dump).open("a") as f:
            for r in results:
                f.write(json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n")
    rows = summarise(results)
    print_table(rows)
    doc = {"benchmark": "recovery", "env": environment(args), "results": rows}
    if args.chart:
        chart(rows, Path(args.chart), doc["env"])
    print(json.dumps(doc | {"wall_s": round(time.perf_counter() - started, 1)}))


CHART_CALLS = (("native", "C2"), ("recovered", "C0"), ("lost", "C3"), ("text", "C7"), ("error", "k"))
CHART_IRRELEVANCE = (
    ("answered", "C2"),
    ("called", "C1"),
    ("wrongly_recovered", "C0"),
    ("lost", "C3"),
    ("error", "k"),
)


def chart(rows: Sequence[Mapping[str, Any]], path: Path, env: Mapping[str, Any]) -> None:
    """Stacked outcome shares per target: BFCL call cases (left), irrelevance cases (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
    for ax, kind, outcomes in ((axes[0], "call", CHART_CALLS), (axes[1], "irrelevance", CHART_IRRELEVANCE)):
        picked = [r for r in rows if r["kind"] == kind]
        names = [str(r["target"]) for r in picked]
        bottom = [0.0] * len(picked)
        for outcome, color in outcomes:
            values = [100 * float(r.get(f"{outcome}_rate", 0.0)) for r in picked]
            ax.bar(names, values, 0.6, bottom=bottom, label=outcome.replace("_", " "), color=color)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        n = picked[0]["cases"] if picked else 0
        ax.set_title(f"{kind} cases (n={n}), tool_choice auto", fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    axes[0].set_ylabel("% of cases")
    fig.suptitle(f"calls outside the call markup: {env.get('model', '')}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
