"""Constrained decoding grammars: (format, call plan) -> an llguidance grammar.

Knows: how to turn a request into the Lark grammar of everything the model may write in its
native format (lark_grammar.py, one module per format family), how llguidance checks it
against the engine's vocabulary (llg.py), the compile workers and their time limit, and a
cache of checked grammars. Does not know: engines, HTTP, or how a mask is applied
(callgate.decoding, callgate.kernels).

    build_plan(format, plan, vocabulary, *, eos_token_id=None, specials=None)
        -> Constraint | None                                  # None: free text
    await build_plan_async(..., timeout_s=5.0, actor=None)    # off the loop
    build(format, tools, tool_choice, parallel_tool_calls, response_format, vocabulary,
          *, eos_token_id=None, specials=None, thinking=None)   # raw values -> CallPlan.of -> build_plan

A grammar is data: the server checks it once (parse, embedded JSON schemas, lexer; a few
milliseconds for a dozen tools on a 152k vocabulary) and the engine's logits processor
builds its matcher from the same text; masks are computed lazily, step by step.

Errors: SchemaTooComplexError (400, code schema_too_complex) naming every schema keyword the
grammar cannot enforce, or llguidance's reason it cannot build the grammar; CompilerBusyError
(503, code grammar_compiler_busy) when the compile workers stay busy or a grammar holding no
schema runs past the time limit; InvalidRequestError (400) from `build` for a tool_choice naming
no tool (a serving request's plan was checked when it was built).

Shared helpers: param_path (a schema's place as an OpenAI `param`), json_lexemes (bounded
numbers, string formats), value_schema (a value's schema as the qwen3-xml parser reads it),
text_markers (what a family's free text may not hold). The old regex engine over an
outlines-core Index is no part of the package: benchmarks/regex_baseline/, bench_compile's
baseline, imports these helpers; nothing here imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.call_plan import CallPlan
from callgate.constraints.compile_pool import CompilePool, Job
from callgate.constraints.lark_grammar import lark_grammar
from callgate.constraints.llg import LlgVocabulary, check
from callgate.constraints.request import GrammarRequest, Mode, Thinking, grammar_of

__all__ = [
    "Constraint",
    "ConstraintRef",
    "LlgVocabulary",
    "Mode",
    "Thinking",
    "build",
    "build_async",
    "build_plan",
    "build_plan_async",
    "vocabulary",
]

Vocab = LlgVocabulary | Mapping[bytes, list[int]] | None


@dataclass(frozen=True, slots=True)
class ConstraintRef:
    """What travels to the engine (GenerationRequest.constraint, vLLM extra_args): the
    grammar's key and text, the text with markers spelled plainly (budget closing's byte
    twin), the mode, and the call trigger (where a call starts in free text)."""

    key: str
    grammar: str
    plain: str
    mode: str
    trigger: str | None = None
    budget_closing: bool = True


@dataclass(frozen=True, slots=True)
class Constraint:
    """A checked grammar. `compile_s`: how long building and checking it took (0: cached)."""

    key: str
    grammar: str
    plain: str
    mode: Mode
    trigger: str | None
    compile_s: float = 0.0
    thinking: Thinking = None

    def ref(self) -> ConstraintRef:
        return ConstraintRef(self.key, self.grammar, self.plain, self.mode, self.trigger)


_VOCABS: dict[tuple[int, int], tuple[Any, LlgVocabulary]] = {}


def vocabulary(
    tokens: Mapping[bytes, list[int]] | LlgVocabulary,
    eos_token_id: int | None = None,
    specials: Mapping[int, str] | None = None,
    size: int | None = None,
) -> LlgVocabulary:
    """The llguidance vocabulary of an engine's tokens (`Tokenizer.vocabulary()`, EOS id,
    special-token texts by id), built once per mapping object (seconds on 152k tokens)."""
    if isinstance(tokens, LlgVocabulary):
        return tokens
    if eos_token_id is None:
        raise TypeError("vocabulary: pass eos_token_id with a raw token mapping")
    slot = (id(tokens), eos_token_id)
    hit = _VOCABS.get(slot)
    if hit is None or hit[0] is not tokens:
        hit = (tokens, LlgVocabulary.build(tokens, eos_token_id, specials, size))
        _VOCABS[slot] = hit
    return hit[1]


class _Cache:
    """Checked grammars by (vocabulary, key), least recently used first out."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[tuple[str, str], Constraint] = OrderedDict()

    def get(self, slot: tuple[str, str]) -> Constraint | None:
        found = self.entries.get(slot)
        if found is not None:
            self.entries.move_to_end(slot)
        return found

    def clear(self) -> None:
        self.entries.clear()

    def put(self, slot: tuple[str, str], value: Constraint) -> None:
        self.entries[slot] = value
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


CACHE = _Cache()


@dataclass(frozen=True, slots=True)
class _Plan:
    req: GrammarRequest
    key: str
    vocab: LlgVocabulary | None

    @property
    def slot(self) -> tuple[str, str]:
        return ("" if self.vocab is None else self.vocab.fingerprint, self.key)

    @property
    def param(self) -> str | None:
        """The request field whose schemas the grammar holds (None: it holds none)."""
        if self.req.mode == "none":
            return None
        return "response_format" if self.req.mode == "response_format" else "tools"


def _plan(format: str, plan: CallPlan, vocab: LlgVocabulary | None) -> _Plan | None:
    req = grammar_of(format, plan)
    return None if req is None else _Plan(req, req.key(), vocab)


def _compile(plan: _Plan, job: Job | None = None) -> Constraint:
    """Build and check the grammar (blocking); cached."""
    start = time.perf_counter()
    specials = {} if plan.vocab is None else plan.vocab.specials
    text = lark_grammar(plan.req, specials)
    plain = lark_grammar(plan.req) if specials else text
    if job is not None:
        job.proceed()
    check(text, plan.vocab, plan.param)
    req = plan.req
    trigger = _trigger(req)
    found = Constraint(plan.key, text, plain, req.mode, trigger, time.perf_counter() - start, req.thinking)
    CACHE.put(plan.slot, found)
    return found


def _trigger(req: GrammarRequest) -> str | None:
    from callgate.formats import get_format

    if req.mode not in ("auto", "required", "named"):
        return None
    return get_format(req.format).call_trigger or None


def build_plan(
    format: str,
    plan: CallPlan,
    vocabulary_: Vocab = None,
    *,
    eos_token_id: int | None = None,
    specials: Mapping[int, str] | None = None,
) -> Constraint | None:
    """Build and check (blocking) the grammar of a request's call plan in `format`. None
    when nothing constrains the output. The plan's `thinking` is what the prompt did with
    the format's reasoning block. Without a vocabulary the grammar is checked on its own
    (markers as plain text)."""
    vocab = None if vocabulary_ is None else vocabulary(vocabulary_, eos_token_id, specials)
    found = _plan(format, plan, vocab)
    if found is None:
        return None
    return CACHE.get(found.slot) or _compile(found)


def build(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary_: Vocab = None,
    *,
    eos_token_id: int | None = None,
    specials: Mapping[int, str] | None = None,
    thinking: Thinking = None,
) -> Constraint | None:
    """`build_plan` of the plan of raw OpenAI-style values (`CallPlan.of`: InvalidRequestError
    for a tool_choice naming no tool), for tests and benchmarks that hold no ChatRequest."""
    plan = CallPlan.of(tools, tool_choice, parallel_tool_calls, response_format, thinking=thinking)
    return build_plan(format, plan, vocabulary_, eos_token_id=eos_token_id, specials=specials)


_POOL = CompilePool(workers=2)


async def build_plan_async(
    format: str,
    plan: CallPlan,
    vocabulary_: Vocab = None,
    *,
    eos_token_id: int | None = None,
    specials: Mapping[int, str] | None = None,
    timeout_s: float = 5.0,
    actor: str | None = None,
) -> Constraint | None:
    """`build_plan` off the event loop: a cached grammar never waits for a worker; a compile
    runs in the compile pool (compile_pool.py, two workers) with its time limit. An `actor`
    (the request's identified client) holds at most one worker at a time: its other compiles
    queue behind it, so one client's schemas cannot take the capacity of the others (a
    compile is milliseconds, and llguidance's parser limits bound its work)."""
    loop = asyncio.get_running_loop()

    def plan_or_hit() -> _Plan | Constraint | None:
        vocab = None if vocabulary_ is None else vocabulary(vocabulary_, eos_token_id, specials)
        found = _plan(format, plan, vocab)
        return None if found is None else (CACHE.get(found.slot) or found)

    found = await loop.run_in_executor(None, plan_or_hit)
    if not isinstance(found, _Plan):
        return found
    job_plan = found
    async with _turn_of(actor):
        result: Constraint = await _POOL.run(
            job_plan.slot, lambda job: _compile(job_plan, job), timeout_s=timeout_s, param=job_plan.param
        )
    return result


async def build_async(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary_: Vocab = None,
    *,
    eos_token_id: int | None = None,
    specials: Mapping[int, str] | None = None,
    thinking: Thinking = None,
    timeout_s: float = 5.0,
    actor: str | None = None,
) -> Constraint | None:
    """`build_plan_async` of the plan of raw OpenAI-style values (as `build`)."""
    plan = CallPlan.of(tools, tool_choice, parallel_tool_calls, response_format, thinking=thinking)
    return await build_plan_async(
        format, plan, vocabulary_, eos_token_id=eos_token_id, specials=specials, timeout_s=timeout_s, actor=actor
    )


_ACTORS: weakref.WeakValueDictionary[str, asyncio.Semaphore] = weakref.WeakValueDictionary()


def _turn_of(actor: str | None) -> asyncio.Semaphore | contextlib.nullcontext[None]:
    """One compile at a time for an identified actor; no limit for anonymous requests."""
    if not actor or actor == "anonymous":
        return contextlib.nullcontext()
    found = _ACTORS.get(actor)
    if found is None:
        found = _ACTORS[actor] = asyncio.Semaphore(1)
    return found
