"""The review of one round's output: is it readable and does it keep the request's
tool_choice (a recovery round's is the named tool's, recovery.py; else a ChatFailure, 502),
what does the validator say of each candidate (every verdict audited, fsynced, before
anything carries it), and may the model try again (the repair messages) or is the turn
rejected (422).

Knows: the validator handoff (handoff/candidates.py), the audit log, the metrics of diagnostics and
verdicts. Does not know: engines, parsers' syntax, or any wire shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from callgate.errors import CallgateError, ModelOutputError, ToolCallRejectedError, ValidatorUnavailableError
from callgate.serving.conform import conform_call_ids
from callgate.serving.handoff import audit
from callgate.serving.handoff.audit import AuditLog
from callgate.serving.handoff.candidates import (
    ADVISORY_CODES,
    Validator,
    choice_violation,
    fatal,
    repair_messages,
    validate_all,
    verdict_dict,
)
from callgate.serving.handoff.idempotency import idempotency_key
from callgate.serving.metrics import Metrics
from callgate.serving.surfaces.protocol import ChatRequest, diagnostic_dict
from callgate.serving.turn import ChatFailure, Round, Turn
from callgate.types import Diagnostic

log = logging.getLogger("callgate.chat")


class RoundReview:
    """Reviews rounds for one served model and format against one validator."""

    def __init__(
        self, fmt: str, model: str, validator: Validator, metrics: Metrics, audit_log: AuditLog | None
    ) -> None:
        self._fmt = fmt
        self._model = model
        self._validator = validator
        self._metrics = metrics
        self._audit_log = audit_log

    def check_output(self, turn: Turn, rnd: Round) -> None:
        assert rnd.result is not None
        for d in rnd.result.diagnostics:
            self._metrics.diagnostic(d.code)
        # a recovery round (recovery.py) is held to the named-tool form of the request
        recovering = turn.recovery_in(rnd.index)
        req = turn.req if recovering is None or recovering.request is None else recovering.request
        broken = fatal(rnd.result.diagnostics)
        if broken is not None and _reasoning_cut_short(req, rnd, broken):
            broken = None  # it ended inside its reasoning: a reasoning-only answer, not bad output
        if broken is not None:
            error = ModelOutputError(f"model output is not a well-formed call: {broken.message}", code=broken.code)
            raise ChatFailure(error, {**turn.callgate_block(), "raw": rnd.raw(broken.span[0])})
        violation = choice_violation(req, rnd.result)
        if violation is not None:
            self._metrics.diagnostic(violation.code)
            block = turn.callgate_block()
            block["diagnostics"].append({**diagnostic_dict(violation), "round": rnd.index})
            error = ModelOutputError(f"model output breaks the request: {violation.message}", code=violation.code)
            raise ChatFailure(error, {**block, "raw": rnd.raw(violation.span[0])})

    async def validate(self, turn: Turn, rnd: Round) -> None:
        """Verdicts for the round's candidates; each is in the audit log (fsynced) before
        this returns, so before any response that carries it. No verdict: audited, raised."""
        assert rnd.result is not None
        started_s = time.monotonic()
        try:
            rnd.verdicts = await validate_all(
                self._validator,
                turn.req,
                rnd.result.candidates,
                request_id=turn.completion_id,
                model=self._model,
                fmt=self._fmt,
                constrained=turn.constraint is not None,
                actor=turn.actor,
                scope=turn.scope if rnd.result.candidates else "",  # hashed only when there is a call
            )
        except ValidatorUnavailableError as exc:
            await self._audit(
                turn, rnd, [{"verdict": "unavailable", "error": exc.message}] * len(rnd.result.candidates)
            )
            raise
        finally:
            if rnd.result.candidates:
                self._metrics.validator_latency(time.monotonic() - started_s)
        for v in rnd.verdicts:
            self._metrics.verdict(v.verdict)
            for e in v.errors:
                self._metrics.rejection(str(e.get("kind", "unspecified")))
        await self._audit(turn, rnd, [verdict_dict(v) for v in rnd.verdicts])

    async def _audit(self, turn: Turn, rnd: Round, verdicts: Sequence[Mapping[str, Any]]) -> None:
        if self._audit_log is None or rnd.result is None or not rnd.result.candidates:
            return
        diagnostics = [diagnostic_dict(d) for d in rnd.result.diagnostics]
        validator = str(getattr(self._validator, "name", type(self._validator).__name__))
        recovering = turn.recovery_in(rnd.index)
        records = [
            audit.candidate_record(
                request_id=turn.completion_id,
                round_index=rnd.index,
                model=self._model,
                fmt=self._fmt,
                call_id=c.call_id,
                tool=c.name,
                arguments=c.arguments,
                raw=c.raw,
                diagnostics=diagnostics,
                verdict=v,
                validator=validator,
                constrained=turn.constraint is not None,
                idempotency_key=idempotency_key(turn.actor, c.name, c.arguments, turn.scope),
                recovered_from_round=None if recovering is None else recovering.from_round,
            )
            for c, v in zip(rnd.result.candidates, verdicts, strict=True)
        ]
        await self.write_audit(records)

    async def write_audit(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append `records` to the audit log (fsynced; nothing when there is none). A record
        that cannot be written withholds what it is about: CallgateError `audit_log_failed`."""
        if self._audit_log is None:
            return
        try:
            with anyio.CancelScope(shield=True):  # a record, once begun, is finished
                await anyio.to_thread.run_sync(self._audit_log.write, records)
        except OSError as exc:  # no record, no call: the candidates are withheld
            log.error("audit log %s: %s", self._audit_log.path, exc)
            raise CallgateError(
                "the audit log cannot be written; no tool call is returned", code="audit_log_failed"
            ) from exc

    def next_round_or_reject(self, turn: Turn, rnd: Round) -> None:
        assert rnd.result is not None
        if rnd.index >= turn.max_repairs:
            rejected = sum(v.verdict != "accepted" for v in rnd.verdicts)
            error = ToolCallRejectedError(
                f"{rejected} tool call(s) rejected by the validator after {rnd.index} repair round(s)",
                code="tool_call_rejected",
            )
            raise ChatFailure(error, turn.callgate_block())
        self._metrics.repair()
        messages = [*turn.messages, *repair_messages(rnd.result, rnd.verdicts)]
        turn.messages = list(conform_call_ids(self._fmt, messages))


def _reasoning_cut_short(req: ChatRequest, rnd: Round, broken: Diagnostic) -> bool:
    """The output ended inside the reasoning block (the only fatal diagnostic): `max_tokens`
    ran out, or the model ended its turn there (possible only where no grammar holds it, as
    without tools). As OpenAI answers a reasoning model out of tokens, the reply is the
    reasoning so far, no content, finish_reason "length" or "stop" — unless tool_choice
    needed a call (then a 502, as documented)."""
    assert rnd.result is not None
    forced = req.plan.forced
    others = [d for d in rnd.result.diagnostics if d is not broken and d.code not in ADVISORY_CODES]
    ended = rnd.finish_reason in ("length", "stop")
    return broken.code == "missing_think_end" and ended and not forced and not others
