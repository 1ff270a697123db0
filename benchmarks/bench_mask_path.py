"""The per-step mask path: callgate's own processor against outlines' llguidance processor.

Question (grammar-engine issue): llguidance's matcher can be driven through outlines 1.x
(`outlines.backends.llguidance.LLGuidanceLogitsProcessor`) or directly inside callgate's
vLLM logits processor (`callgate.decoding.processor.ConstrainedBatch`). Which costs less
per step, and what is the per-row mask time at batch 16 on the 49k and 152k vocabularies
(engine fill plus callgate's kernel, each share)?

Workload (fixed seed 0): the 12 tools of a coding agent (../shared/bench/agent_tools.json),
hermes format, `tool_choice` "required" and "auto", parallel calls allowed; the grammar is
`callgate.constraints.build`'s, the same text for both processors, on the same llguidance
tokenizer (callgate's byte view of the real vocabulary: SmolLM2 49 152 ids, Qwen2.5
151 936 ids). Batch 1, 4, 16: row r writes script r % 4 (four real calls to different
tools, tokenized by the model's own tokenizer; "auto" scripts open with a sentence of
free text), a scripted model: random logits with +100 on the script's next token. Both
processors get the same logits each step; the argmax after masking must be the script's
token for both (checked: a mask that refused a valid token would show here). Steps =
the shortest script, so no row ends mid-run (outlines' processor cannot take new rows).

callgate runs four times: masks filled one row after another (`seq`, its default on a
machine with fewer than 8 cores, the rows sampled: every row is masked), on llguidance's
thread pool (`par`), one after another with budget closing on at max_tokens 128 (`close`:
every step is in the rows' closing window, the serving default's worst case; outlines has
no budget closing), and with the rows greedy (`greedy`, temperature 0: a row whose argmax
the grammar admits, here every row at every step, is left unmasked).
Reported per cell: p50 / p99 step time and p50 per row for each processor; for callgate
the share of its kernel (`callgate.kernels.apply_token_bitmask` timed alone on the same
logits and masks) and so the fill share; the first step of each (outlines builds one
matcher per row there; callgate copies one matcher per grammar). Timing: perf_counter_ns
around each processor's call, interleaved step by step in one process.

Usage: python benchmarks/bench_mask_path.py [--vocabs smollm2,qwen2.5] [--batches 1,4,16]
[--modes required,auto] [--threads 1] [--repeats 3] [--chart PNG | --no-chart]. Prints a table, draws
benchmarks/mask_path.png, ends with ONE JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vocabularies

from callgate.constraints import build
from callgate.decoding.processor import ConstrainedBatch
from callgate.kernels import apply_token_bitmask

TOOLS_FILE = Path(os.environ.get("CALLGATE_BENCH_DIR", "/work/shared/bench")) / "agent_tools.json"
SEED = 0
CLOSING_BUDGET = 128  # max_tokens of the budget-closing run: every step is in the closing window
CALLS = (
    ("read_file", {"path": "src/callgate/serving/app.py", "offset": 120, "limit": 80}),
    ("bash", {"command": "grep -rn 'TODO' src/ | head -50", "timeout": 30, "description": "Find every TODO in src"}),
    ("grep", {"pattern": "def (build|compile)_[a-z]+", "path": "src", "output_mode": "content"}),
    (
        "write_file",
        {"path": "notes/plan.md", "content": "# Plan\n\n1. Read the failing test.\n2. Fix the parser.\n3. Rerun."},
    ),
)
PREAMBLE = "I'll start by looking at the code.\n"


def scripts(tok: Any, eos: int, mode: str) -> list[list[int]]:
    out = []
    for name, args in CALLS:
        call = json.dumps({"name": name, "arguments": args})
        text = f"<tool_call>\n{call}\n</tool_call>"
        out.append([*tok.encode((PREAMBLE if mode == "auto" else "") + text), eos])
    return out


class _Fixed(ConstrainedBatch):
    def __init__(self, vocab: Any) -> None:
        self._fixed = vocab
        super().__init__(None, "cpu", False)

    def load_tokens(self) -> Any:
        return self._fixed


def _update(added: list[Any]) -> Any:  # stands in for vLLM's BatchUpdate
    return SimpleNamespace(removed=[], added=added, moved=[])


def run_cell(vocab: Any, tok: Any, mode: str, batch: int, tools: list[Any]) -> dict[str, Any]:
    from outlines.backends.llguidance import LLGuidanceLogitsProcessor

    constraint = build("hermes", tools, mode, True, None, vocab.llg)
    assert constraint is not None
    ref = dataclasses.asdict(constraint.ref())
    ref["budget_closing"] = False
    scripted = scripts(tok, vocab.eos, mode)
    rows = [scripted[r % len(scripted)] for r in range(batch)]
    steps = min(len(s) for s in rows)
    width = vocab.size
    outputs: list[list[int]] = [[] for _ in range(batch)]
    params = SimpleNamespace(extra_args={"callgate": ref}, max_tokens=None)
    # budget closing on: max_tokens 128 puts every step in the rows' closing window
    closing = SimpleNamespace(extra_args={"callgate": {**ref, "budget_closing": True}}, max_tokens=CLOSING_BUDGET)
    # greedy (temperature 0): a row whose argmax the grammar admits is left unmasked
    greedy = SimpleNamespace(extra_args={"callgate": ref}, max_tokens=None, temperature=0.0)
    ours = {}
    labels = (("seq", False, params), ("par", True, params), ("close", False, closing), ("greedy", False, greedy))
    for label, parallel, p in labels:
        proc = _Fixed(vocab.llg)
        proc.parallel_fill = parallel
        proc.update_state(_update([(i, p, None, outputs[i]) for i in range(batch)]))
        ours[label] = proc
    theirs = LLGuidanceLogitsProcessor(constraint.grammar, vocab.llg.tokenizer, "torch")
    ids = torch.zeros(batch, 1, dtype=torch.long)

    gen = torch.Generator().manual_seed(SEED)
    times: dict[str, list[int]] = {"seq": [], "par": [], "close": [], "greedy": [], "outlines": [], "kernel": []}
    agree = True
    for step in range(steps):
        logits = torch.randn(batch, width, generator=gen)
        want = [script[step] for script in rows]
        for r, token in enumerate(want):
            logits[r, token] += 100.0
        for label, proc in ours.items():
            a = logits.clone()
            t0 = time.perf_counter_ns()
            proc.apply(a)
            times[label].append(time.perf_counter_ns() - t0)
            agree &= a.argmax(-1).tolist() == want
        b = logits.clone()
        t0 = time.perf_counter_ns()
        theirs(ids, b)
        times["outlines"].append(time.perf_counter_ns() - t0)
        agree &= b.argmax(-1).tolist() == want
        # callgate's kernel alone, on the masks this step filled
        c = logits.clone()
        host = ours["seq"]._host[:batch]
        t0 = time.perf_counter_ns()
        apply_token_bitmask(c, host)
        times["kernel"].append(time.perf_counter_ns() - t0)
        for r in range(batch):
            outputs[r].append(want[r])
        ids = torch.cat([ids, torch.tensor(want, dtype=torch.long).unsqueeze(1)], dim=1)
    first = {f"{k}_first_us": v[0] / 1e3 for k, v in times.items()}
    return {**first, **{k: v[1:] for k, v in times.items()}, "steps": steps, "agree": agree}


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] / 1e3


def summarise(vocab: str, mode: str, batch: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def p(key: str, q: float) -> float:
        return _pct([v for r in runs for v in r[key]], q)

    seq, par, theirs, kernel = p("seq", 50), p("par", 50), p("outlines", 50), p("kernel", 50)
    return {
        "vocab": vocab,
        "mode": mode,
        "batch": batch,
        "steps": runs[0]["steps"],
        "callgate_p50_step_us": round(seq, 1),
        "callgate_p99_step_us": round(p("seq", 99), 1),
        "callgate_p50_row_us": round(seq / batch, 1),
        "kernel_p50_step_us": round(kernel, 1),
        "kernel_share": round(min(1.0, kernel / seq), 3) if seq else 0.0,
        "closing_p50_step_us": round(p("close", 50), 1),
        "closing_p99_step_us": round(p("close", 99), 1),
        "closing_p50_row_us": round(p("close", 50) / batch, 1),
        "greedy_p50_row_us": round(p("greedy", 50) / batch, 1),
        "parallel_p50_step_us": round(par, 1),
        "parallel_over_seq": round(par / seq, 2) if seq else 0.0,
        "outlines_p50_step_us": round(theirs, 1),
        "outlines_p99_step_us": round(p("outlines", 99), 1),
        "outlines_p50_row_us": round(theirs / batch, 1),
        "outlines_over_callgate": round(theirs / seq, 2) if seq else 0.0,
        "callgate_first_step_us": round(statistics.median(r["seq_first_us"] for r in runs), 1),
        "outlines_first_step_us": round(statistics.median(r["outlines_first_us"] for r in runs), 1),
        "masks_agree": all(r["agree"] for r in runs),
    }


COLUMNS = (
    ("vocab", 8),
    ("mode", 9),
    ("batch", 5),
    ("callgate_p50_step_us", 10),
    ("callgate_p50_row_us", 9),
    ("kernel_share", 7),
    ("closing_p50_row_us", 9),
    ("greedy_p50_row_us", 9),
    ("parallel_over_seq", 8),
    ("outlines_p50_step_us", 10),
    ("outlines_p50_row_us", 9),
    ("outlines_over_callgate", 8),
    ("callgate_first_step_us", 10),
    ("outlines_first_step_us", 10),
    ("masks_agree", 6),
)


def print_table(rows: list[dict[str, Any]]) -> None:
    print("per-step mask time, hermes, 12 agent tools (us); row = step / batch")
    print(" ".join(f"{name[:w]:>{w}}" for name, w in COLUMNS))
    for row in rows:
        print(" ".join(f"{row[name]!s:>{w}}" for name, w in COLUMNS))


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """p50 µs per row and step, per cell: callgate (sequential fill, its kernel's share
    hatched), with budget closing, with greedy rows, on llguidance's pool; outlines'
    processor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.2))
    x = range(len(rows))
    seq = [r["callgate_p50_row_us"] for r in rows]
    kernel = [r["kernel_p50_step_us"] / r["batch"] for r in rows]
    par = [r["parallel_p50_step_us"] / r["batch"] for r in rows]
    theirs = [r["outlines_p50_row_us"] for r in rows]
    closing = [r["closing_p50_row_us"] for r in rows]
    greedy = [r["greedy_p50_row_us"] for r in rows]
    w = 0.16
    ax.bar([i - 2 * w for i in x], seq, w, label="callgate (rows in turn)", color="C0")
    ax.bar([i - 2 * w for i in x], kernel, w, label="  of which callgate's kernel", color="none", hatch="//")
    ax.bar(
        [i - w for i in x],
        closing,
        w,
        label=f"callgate, budget closing on (max_tokens {CLOSING_BUDGET})",
        color="C2",
    )
    ax.bar(list(x), greedy, w, label="callgate, greedy rows (argmax admitted: unmasked)", color="C1")
    ax.bar([i + w for i in x], par, w, label="callgate (llguidance's pool)", color="C9")
    ax.bar([i + 2 * w for i in x], theirs, w, label="outlines LLGuidanceLogitsProcessor", color="C3")
    ax.set_xticks(list(x), [f"{r['vocab']}\n{r['mode']}\nbatch {r['batch']}" for r in rows], fontsize=7)
    ax.set_ylabel("µs per row and step (p50)")
    ax.set_yscale("log")
    ax.set_title("mask path: hermes, 12 agent tools, same grammar and logits", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocabs", default="smollm2,qwen2.5")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--modes", default="required,auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chart", default="benchmarks/mask_path.png")
    ap.add_argument("--no-chart", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tools = json.loads(TOOLS_FILE.read_text())
    from callgate.serving.engines.tokenizer import HfTokenizer

    folders = {"smollm2": vocabularies.smollm2_folder(), "qwen2.5": vocabularies.QWEN_FOLDER}
    started = time.time()
    results = []
    for name in args.vocabs.split(","):
        vocab = vocabularies.load(name)
        tok = HfTokenizer(folders[name])
        for mode in args.modes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                runs = [run_cell(vocab, tok, mode, batch, tools) for _ in range(args.repeats)]
                results.append(summarise(name, mode, batch, runs))
    print_table(results)
    if not args.no_chart:
        chart(results, Path(args.chart))
    import llguidance
    import outlines

    env = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch_threads": args.threads,
        "llguidance": llguidance.__version__ if hasattr(llguidance, "__version__") else "?",
        "outlines": getattr(outlines, "__version__", "?"),
        "load": os.getloadavg()[0],
        "seed": SEED,
    }
    print(
        json.dumps(
            {"benchmark": "mask_path", "env": env, "results": results, "wall_s": round(time.time() - started, 1)}
        )
    )
    return 0 if all(r["masks_agree"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
