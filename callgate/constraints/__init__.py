"""Constrained decoding grammars: (format, tools, tool_choice, ...) -> outlines-core Index.

Knows: how to turn a request into the regex of everything the model may write in its native
format (grammar.py, one module per format family), how to compile it over the engine's
vocabulary (cache.py), and the time limit on compiling. Does not know: engines, HTTP, or
how the mask is applied (callgate.constraints.processor, callgate.kernels).

    build(format, tools, tool_choice, parallel_tool_calls, response_format, vocabulary,
          *, eos_token_id=None, thinking=False) -> Constraint | None       # None: unconstrained
    await build_async(..., timeout_s=5.0)                                  # off the event loop
    get_index(key, regex, vocabulary, path=None)                           # the processor's cache
    configure_disk(directory, max_bytes)                                   # where Indexes are written

Errors: SchemaTooComplexError (400, code schema_too_complex) naming the keyword or the time
limit; InvalidRequestError (400) for a tool_choice naming no tool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from callgate.constraints import closing_store
from callgate.constraints.cache import CACHE, TokenVocabulary, configure_disk, get_index, token_vocabulary
from callgate.constraints.grammar import Grammar, grammar
from callgate.constraints.request import GrammarRequest, Mode, grammar_request
from callgate.errors import SchemaTooComplexError

__all__ = [
    "CACHE",
    "Constraint",
    "ConstraintRef",
    "Mode",
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
    process loads it instead of compiling the regex again."""

    key: str
    regex: str
    mode: str
    trigger: str | None = None
    index_path: str | None = None


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

    def ref(self) -> ConstraintRef:
        return ConstraintRef(self.key, self.regex, self.mode, self.trigger, self.index_path)


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


def build(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary: Vocab,
    *,
    eos_token_id: int | None = None,
    thinking: bool = False,
) -> Constraint | None:
    """Build and compile (blocking). None when nothing constrains the output."""
    req = grammar_request(format, tools, tool_choice, parallel_tool_calls, response_format, thinking=thinking)
    if req is None:
        return None
    vocab = _vocabulary(vocabulary, eos_token_id)
    g = grammar(req)
    key = req.key()
    start = time.perf_counter()
    index = None if vocab is None else get_index(key, g.regex, vocab)
    elapsed = time.perf_counter() - start
    path = None if vocab is None else CACHE.persisted(key, vocab, index)
    if path is not None and vocab is not None:
        closing_store.persist(path, index, vocab)  # the engine's budget closing reads it
    return Constraint(key, g.regex, req.mode, g.trigger, index, elapsed, path)


_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="callgate-grammar")


async def build_async(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    vocabulary: Vocab,
    *,
    eos_token_id: int | None = None,
    thinking: bool = False,
    timeout_s: float = 5.0,
) -> Constraint | None:
    """`build` in a worker thread; stops waiting after `timeout_s` and raises
    SchemaTooComplexError. A compile that overran keeps running in its thread (outlines-core
    cannot be interrupted) and lands in the cache; at most two compile at a time."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(
        _EXECUTOR,
        lambda: build(
            format,
            tools,
            tool_choice,
            parallel_tool_calls,
            response_format,
            vocabulary,
            eos_token_id=eos_token_id,
            thinking=thinking,
        ),
    )
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        raise SchemaTooComplexError(
            f"the tool/response schemas did not compile into a grammar within {timeout_s:g} s; simplify them",
            param="tools",
        ) from None
