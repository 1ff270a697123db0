"""Constrained decoding grammars: (format, tools, tool_choice, ...) -> outlines-core Index.

Knows: how to turn a request into the regex of everything the model may write in its native
format (grammar.py, one module per format family), how to compile it over the engine's
vocabulary (cache.py), and the time limit on compiling. Does not know: engines, HTTP, or
how the mask is applied (callgate.constraints.processor, callgate.kernels).

    build(format, tools, tool_choice, parallel_tool_calls, response_format, vocabulary,
          *, eos_token_id=None, thinking=None) -> Constraint | None        # None: unconstrained
    await build_async(..., timeout_s=5.0)                                  # off the event loop
    get_index(key, regex, vocabulary, path=None)                           # the processor's cache
    configure_disk(directory, max_bytes)                                   # where Indexes are written

Errors: SchemaTooComplexError (400, code schema_too_complex) naming the keyword, the time
limit or the size of the Index; CompilerBusyError (503, code grammar_compiler_busy) when the
compile workers stay busy, or a grammar holding no schema runs past the time limit;
InvalidRequestError (400) for a tool_choice naming no tool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.constraints import closing_store
from callgate.constraints.cache import (
    CACHE,
    TokenVocabulary,
    configure_disk,
    get_index,
    token_vocabulary,
    trim_heap,
)
from callgate.constraints.compile_pool import CompilePool, Job
from callgate.constraints.grammar import Grammar, grammar
from callgate.constraints.index_size import check_size
from callgate.constraints.request import GrammarRequest, Mode, Thinking, grammar_request
from callgate.errors import SchemaTooComplexError

__all__ = [
    "CACHE",
    "Constraint",
    "ConstraintRef",
    "Mode",
    "Thinking",
    "TokenVocabulary",
    "build",
    "build_async",
    "build_regex",
    "configure_disk",
    "get_index",
    "token_vocabulary",
]

Vocab = TokenVocabulary | Mapping[bytes, list[int]] | None


@dataclass(frozen=True, slots=True)
class ConstraintRef:
    """What travels to the engine (GenerationRequest.constraint, vLLM extra_args): enough
    for another process to compile the same grammar. `trigger` set: lazy (see grammar.py).
    `index_path`: the compiled Index's file (cache.py's disk tier), so that the engine
    process loads it instead of compiling the regex again. `thinking`: the request's
    (GrammarRequest.thinking), which a lazy row's free-text rules read (may the output open
    a reasoning block?)."""

    key: str
    regex: str
    mode: str
    trigger: str | None = None
    index_path: str | None = None
    thinking: Thinking = None


@dataclass(frozen=True, slots=True)
class Constraint:
    """A compiled grammar. `index` is None when built without a vocabulary."""

    key: str
    regex: str
    mode: Mode
    trigger: str | None
    index: Any  # outlines_core.Index | None
    compile_s: float = 0.0
    index_path: str | None = None
    thinking: Thinking = None

    def ref(self) -> ConstraintRef:
        return ConstraintRef(self.key, self.regex, self.mode, self.trigger, self.index_path, self.thinking)


def _vocabulary(vocabulary: Vocab, eos_token_id: int | None) -> TokenVocabulary | None:
    if vocabulary is None or isinstance(vocabulary, TokenVocabulary):
        return vocabulary
    if eos_token_id is None:
        raise TypeError("build: pass eos_token_id with a raw vocabulary mapping (or a TokenVocabulary)")
    return _raw_vocabularies(vocabulary, eos_token_id)


_RAW: dict[tuple[int, int], tuple[Mapping[bytes, list[int]], TokenVocabulary]] = {}


def _raw_vocabularies(tokens: Mapping[bytes, list[int]], eos_token_id: int) -> TokenVocabulary:
    # The server hands the same mapping object on every request; convert it once.
    slot = (id(tokens), eos_token_id)
    hit = _RAW.get(slot)
    if hit is None or hit[0] is not tokens:
        hit = (tokens, token_vocabulary(tokens, eos_token_id))
        _RAW[slot] = hit
    return hit[1]


def build_regex(req: GrammarRequest) -> Grammar:
    """The grammar of a normalised request, without compiling it."""
    return grammar(req)


@dataclass(frozen=True, slots=True)
class _Plan:
    """A request's grammar, before its Index: what `build` and `build_async` share."""

    req: GrammarRequest
    grammar: Grammar
    key: str
    vocab: TokenVocabulary | None

    @property
    def param(self) -> str:
        return "response_format" if self.req.mode == "response_format" else "tools"

    @property
    def schema_param(self) -> str | None:
        """`param`, or None where the grammar holds no schema (tool_choice `none`: content
        only), so that running past the time limit is no fault of the request's."""
        return None if self.req.mode == "none" else self.param


def _plan(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary: Vocab,
    eos_token_id: int | None,
    thinking: Thinking,
) -> _Plan | None:
    req = grammar_request(format, tools, tool_choice, parallel_tool_calls, response_format, thinking=thinking)
    if req is None:
        return None
    return _Plan(req, grammar(req), req.key(), _vocabulary(vocabulary, eos_token_id))


def _finish(plan: _Plan, index: Any, compile_s: float) -> Constraint:
    """The Constraint of a compiled plan, its Index and closing tables on disk."""
    path = None if plan.vocab is None else CACHE.persisted(plan.key, plan.vocab, index)
    if path is not None and plan.vocab is not None:
        closing_store.persist(path, index, plan.vocab)  # the engine's budget closing reads it
    req, g = plan.req, plan.grammar
    return Constraint(plan.key, g.regex, req.mode, g.trigger, index, compile_s, path, req.thinking)


def _compile(plan: _Plan, job: Job | None = None) -> Constraint:
    """Compile a plan (blocking), refusing first an Index too large (index_size.py)."""
    vocab = plan.vocab
    assert vocab is not None

    def guard() -> None:
        check_size(plan.grammar.regex, vocab, plan.param)
        if job is not None:
            job.proceed()

    start = time.perf_counter()
    try:
        index = CACHE.get_or_compile(plan.key, plan.grammar.regex, vocab, guard=guard)
        return _finish(plan, index, time.perf_counter() - start)
    except ValueError as exc:  # outlines-core: "Failed to build DFA ..." (e.g. nested bounded arrays)
        raise SchemaTooComplexError(
            f"the tool/response schemas make a grammar that cannot be built ({exc}); simplify them", param=plan.param
        ) from exc
    finally:
        trim_heap()  # the compile's freed hundreds of MB back to the system


def _without_compile(plan: _Plan | None) -> Constraint | _Plan | None:
    """The Constraint when no compile is needed (no vocabulary, or the Index in memory),
    else the plan to compile; None when nothing constrains the output."""
    if plan is None:
        return None
    if plan.vocab is None:
        return _finish(plan, None, 0.0)
    index = CACHE.get(plan.key, plan.vocab)
    return plan if index is None else _finish(plan, index, 0.0)


def build(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary: Vocab,
    *,
    eos_token_id: int | None = None,
    thinking: Thinking = None,
) -> Constraint | None:
    """Build and compile (blocking). None when nothing constrains the output. `thinking`:
    what the prompt did with the format's reasoning block (request.py `Thinking`). Raises
    SchemaTooComplexError for a grammar whose Index would be too large (index_size.py)."""
    plan = _plan(format, tools, tool_choice, parallel_tool_calls, response_format, vocabulary, eos_token_id, thinking)
    found = _without_compile(plan)
    return _compile(found) if isinstance(found, _Plan) else found


_POOL = CompilePool(workers=2)


async def build_async(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary: Vocab,
    *,
    eos_token_id: int | None = None,
    thinking: Thinking = None,
    timeout_s: float = 5.0,
) -> Constraint | None:
    """`build` off the event loop. A request needing no grammar, or one whose Index is in
    memory, runs in the loop's default executor and never waits for a compile. A compile
    runs in the compile pool (compile_pool.py, two workers): SchemaTooComplexError when it
    runs past `timeout_s` from its start (it goes on and lands in the cache; for a grammar
    that holds no schema CompilerBusyError instead, retryable), CompilerBusyError (503) when
    no worker frees up within `timeout_s`."""
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(
        None,
        lambda: _without_compile(
            _plan(format, tools, tool_choice, parallel_tool_calls, response_format, vocabulary, eos_token_id, thinking)
        ),
    )
    if not isinstance(found, _Plan):
        return found
    plan = found
    assert plan.vocab is not None
    slot = (plan.vocab.fingerprint, plan.key)
    result: Constraint = await _POOL.run(
        slot, lambda job: _compile(plan, job), timeout_s=timeout_s, param=plan.schema_param
    )
    return result
