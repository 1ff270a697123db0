"""The grammar of a chat request: `Grammars.constraint(req)` compiles its plan's constraint
(callgate.constraints' `build_plan_async`) over the engine's vocabulary, and `warm` compiles
the format's schema-free grammar ahead of the first request.

Knows: whether the server runs constrained (`--no-constrained` switches it off); the
engine's tokenizer, whose vocabulary and special tokens are loaded once, on first use.
Does not know: how a grammar is built (callgate.constraints), rounds, HTTP.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import anyio

from callgate.call_plan import CallPlan
from callgate.constraints import build_plan_async, vocabulary
from callgate.decoding.budget import shortest_output_tokens
from callgate.errors import InvalidRequestError
from callgate.serving.engines.engine import ConstraintRef, Engine
from callgate.serving.engines.tokenizer import special_tokens
from callgate.serving.settings import Settings
from callgate.serving.surfaces.protocol import ChatRequest

log = logging.getLogger("callgate.chat")
# under `none` no tool enters the grammar or its key
_WARM_PLAN = CallPlan.of([{"type": "function", "function": {"name": "warm_up"}}], "none", None, None)
_WARM_TIMEOUT_S = 600.0
_SHORTEST_KEPT = 1024  # grammars whose shortest output is kept
# the modes whose grammar must be written whole: a budget below its shortest output is a 400
_WHOLE = {"required": "call", "named": "call", "response_format": "answer"}


class Grammars:
    """The constraints of one server's chat requests, on one engine's vocabulary."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self._vocabulary: dict[bytes, list[int]] | None = None
        self._specials: dict[int, str] = {}
        self._shortest: dict[str, int | None] = {}  # grammar key -> its shortest output's tokens

    async def _ready(self) -> bool:
        """Whether requests are constrained; the vocabulary is loaded (once) when they are."""
        if not self.settings.constrained:
            return False
        if self._vocabulary is None:
            self._vocabulary = await anyio.to_thread.run_sync(self.engine.tokenizer.vocabulary)
            self._specials = special_tokens(self.engine.tokenizer)
        return True

    async def constraint(self, req: ChatRequest) -> ConstraintRef | None:
        """The compiled constraint of `req`'s plan; None when the server runs unconstrained
        or the plan needs none."""
        if not await self._ready():
            return None
        constraint = await build_plan_async(
            self.settings.format,
            req.plan,
            self._vocabulary,
            eos_token_id=self.engine.tokenizer.eos_token_id,
            specials=self._specials,
            actor=req.actor,
            timeout_s=self.settings.limits.grammar_timeout_s,
        )
        ref: ConstraintRef | None = None if constraint is None else constraint.ref()
        return ref

    async def check_budget(self, constraint: ConstraintRef | None, max_tokens: int) -> None:
        """400 when `max_tokens` cannot hold the shortest output a grammar that must be
        written whole admits (a call under `required` or a named tool, the answer under
        `response_format`): budget closing could only cut it short (a DSML call is ~100
        tokens on a small vocabulary). The shortest output is planned once per grammar
        (decoding/budget.py's `shortest_output_tokens`, milliseconds, off the event loop)."""
        what = None if constraint is None else _WHOLE.get(getattr(constraint, "mode", ""))
        if what is None or not getattr(constraint, "budget_closing", True) or self._vocabulary is None:
            return
        assert constraint is not None
        key = constraint.key
        if key not in self._shortest:
            vocab = vocabulary(self._vocabulary, self.engine.tokenizer.eos_token_id, self._specials)
            plain = getattr(constraint, "plain", constraint.grammar)
            found = await anyio.to_thread.run_sync(shortest_output_tokens, plain, self.settings.format, vocab)
            self._shortest[key] = found
            while len(self._shortest) > _SHORTEST_KEPT:
                self._shortest.pop(next(iter(self._shortest)))
        refuse_small_budget(what, self._shortest[key], max_tokens, self.settings.format)

    async def warm(self, reasons: bool) -> None:
        """Compile the format's grammar that holds no schema (tool_choice `none`, as a
        request with default settings asks for it; `reasons`: whether the model writes a
        reasoning block) into the cache, so that the first such request does not wait for
        it (mistral's took seconds before GRAMMAR_VERSION 9). Run in the background at
        start; a failure is logged, never raised."""
        try:
            if not await self._ready():
                return
            start = time.monotonic()
            # the plan a `none` request with default settings gets (its thinking as conform_chat sets it)
            plan = dataclasses.replace(_WARM_PLAN, thinking=None if reasons else False)
            await build_plan_async(
                self.settings.format,
                plan,
                self._vocabulary,
                eos_token_id=self.engine.tokenizer.eos_token_id,
                specials=self._specials,
                timeout_s=_WARM_TIMEOUT_S,
            )
            log.info("warmed the %s tool_choice=none grammar in %.2f s", self.settings.format, time.monotonic() - start)
        except Exception:  # a warm-up is an optimisation: each request compiles what it needs
            log.warning("could not warm the %s grammar", self.settings.format, exc_info=True)


def refuse_small_budget(what: str, shortest: int | None, max_tokens: int, format: str) -> None:
    """The 400 of `check_budget` (also what bench_parse_errors refuses): `max_tokens` below
    the `shortest` output (a "call", an "answer") the grammar admits."""
    if shortest is not None and max_tokens < shortest:
        raise InvalidRequestError(
            f"max_tokens: {max_tokens} cannot hold the shortest {what} this request allows "
            f"({shortest} tokens in {format}); raise max_tokens to at least {shortest}",
            param="max_tokens",
        )
