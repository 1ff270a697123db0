"""The per-request state of one turn: its rounds, usage and `callgate` block, and the
failure that ends a turn with an explanation.

Knows: what the chat service records while a turn runs (rounds, parse results, verdicts,
usage, quick heads) and how the `callgate` extension block is made from it. Does not know:
engines, parsers, validators or any wire shape beyond the block's dicts.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from callgate.errors import CallgateError
from callgate.serving.engines.engine import ConstraintRef
from callgate.serving.handoff.candidates import Verdict, verdict_dict
from callgate.serving.handoff.idempotency import ANONYMOUS, conversation_scope
from callgate.serving.prompt import Prompt
from callgate.serving.quick.service import QuickBeside
from callgate.serving.recovery import Recovery
from callgate.serving.surfaces.protocol import ChatRequest, candidate_dict, diagnostic_dict, raw_output_dict
from callgate.serving.turn_events import TurnUsage
from callgate.types import ParseResult


class ChatFailure(Exception):
    """A typed error plus the `callgate` block that explains it (raw output, verdicts)."""

    def __init__(self, error: CallgateError, callgate: Mapping[str, Any]) -> None:
        super().__init__(error.message)
        self.error = error
        self.callgate = dict(callgate)

    def body(self) -> dict[str, Any]:
        return {**self.error.to_body(), "callgate": self.callgate}


@dataclass(slots=True)
class Round:
    """One generation: its output as the parser read it, its parse result, finish reason,
    the stop string that ended it (if one did) and verdicts once known."""

    index: int
    output: list[str] = field(default_factory=list)  # kept for an error body's `raw`
    result: ParseResult | None = None
    finish_reason: str = "stop"
    stop_string: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    truncated: bool = False  # budget closing cut the output short: its last call is marked

    def raw(self, focus: int) -> dict[str, Any]:
        assert self.result is not None
        return raw_output_dict(self.index, "".join(self.output), self.result, focus)

    @property
    def accepted(self) -> bool:
        return all(v.verdict == "accepted" for v in self.verdicts)


class Turn:
    """One admitted chat request while it runs; `close` frees its admission slot (once)."""

    def __init__(
        self,
        req: ChatRequest,
        constraint: ConstraintRef | None,
        started_s: float,
        *,
        fmt: str,
        model: str,
        max_repairs: int,
        release: Callable[[], None],
    ) -> None:
        self.req = req
        self.constraint = constraint
        self.fmt = fmt
        self.model = model
        self.completion_id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.started_s = started_s  # admission time: time to first token includes the grammar compile
        self.usage = TurnUsage(0, 0, 0)
        self.rounds: list[Round] = []
        self.messages: list[Mapping[str, Any]] = list(req.messages)
        self.prompt: Prompt | None = None
        self.quick: QuickBeside | None = None  # heads asked for in `callgate.quick`
        self.quick_block: dict[str, Any] = {}
        self.recoveries: list[Recovery] = []  # answers that were calls outside the markup (recovery.py)
        self.max_repairs = max_repairs if req.max_repairs is None else req.max_repairs
        self._release = release
        self._closed = False

    @functools.cached_property
    def scope(self) -> str:
        """What the turn's calls answer (callgate.serving.handoff.idempotency): the request's messages,
        the same in every repair round, so a repaired call is still the same action."""
        return conversation_scope(self.req.messages)

    @property
    def actor(self) -> str:
        return self.req.actor or ANONYMOUS

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.quick is not None:
                self.quick.cancel()
            self._release()

    def recovery_in(self, round_index: int) -> Recovery | None:
        """The recovery that round `round_index` runs, if it is a recovery round."""
        return next((r for r in self.recoveries if r.round == round_index), None)

    def callgate_block(self) -> dict[str, Any]:
        candidates: list[dict[str, Any]] = []
        diagnostics: list[dict[str, Any]] = []
        for rnd in self.rounds:
            if rnd.result is None:
                continue
            verdicts: list[dict[str, Any] | None] = [verdict_dict(v) for v in rnd.verdicts]
            verdicts += [None] * (len(rnd.result.candidates) - len(verdicts))  # a failed round's: never judged
            for c, v in zip(rnd.result.candidates, verdicts, strict=True):
                candidates.append({**candidate_dict(c), "round": rnd.index, "verdict": v})
            diagnostics += [{**diagnostic_dict(d), "round": rnd.index} for d in rnd.result.diagnostics]
        return {
            "format": self.fmt,
            "constrained": self.constraint is not None,
            "repairs": max(0, len(self.rounds) - 1),
            "candidates": candidates,
            "diagnostics": diagnostics,
            **({"recoveries": [r.block() for r in self.recoveries]} if self.recoveries else {}),
            **self.quick_block,
        }
