"""The validator handoff: what goes to the validator, what comes back, and what is refused
before it.

Knows: how a round's candidates become `ValidationRequest`s (callgate.serving.handoff.validation)
and are asked for their verdicts concurrently,
the repair turn fed back to the model, and which parse diagnostics or tool_choice breaches
make an output unusable. Does not know: HTTP, engines, how a validator decides.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from callgate.serving.handoff.idempotency import idempotency_key
from callgate.serving.handoff.validation import ValidationRequest, Validator, Verdict, verdict_dict
from callgate.serving.surfaces.protocol import ChatRequest, tool_call_dict
from callgate.types import Diagnostic, ParseResult, ToolCallCandidate, arguments_json

# Diagnostics that never make an output unusable (no 502): `unknown_tool`, whose candidate
# still goes to the validator (which rejects it); `call_outside_markup`, an answer that is a
# call written as plain JSON (parsers/outside_markup.py), asked for again in the markup or
# left as the content it is (serving/recovery.py).
ADVISORY_CODES = frozenset({"unknown_tool", "call_outside_markup"})


async def validate_all(
    validator: Validator,
    req: ChatRequest,
    candidates: Sequence[ToolCallCandidate],
    *,
    request_id: str,
    model: str,
    fmt: str,
    constrained: bool,
    actor: str,
    scope: str,
) -> list[Verdict]:
    """One verdict per candidate, asked concurrently, in candidate order. The first
    failure (e.g. ValidatorUnavailableError) is raised once all have finished. `actor` and
    `scope` identify the action with the tool and arguments (callgate.serving.handoff.idempotency)."""

    async def one(c: ToolCallCandidate) -> Verdict:
        envelope = ValidationRequest(
            request_id=request_id,
            call_id=c.call_id,
            tool=c.name,
            arguments=c.arguments,
            raw=c.raw,
            format=fmt,
            model=model,
            schema=req.schema_of(c.name),
            constrained=constrained,
            actor=actor,
            scope=scope,
            idempotency_key=idempotency_key(actor, c.name, c.arguments, scope),
            truncated=c.truncated,
            strict=req.is_strict(c.name),
        )
        return await validator.validate(envelope)

    outcomes = await asyncio.gather(*(one(c) for c in candidates), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [o for o in outcomes if not isinstance(o, BaseException)]


def final_arguments(c: ToolCallCandidate, v: Verdict) -> dict[str, Any]:
    """The validator's normalised arguments when it gave some, else the model's."""
    return dict(v.arguments) if v.arguments is not None else c.arguments


def repair_messages(result: ParseResult, verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    """The model's calls as an assistant turn plus one tool result per call: the
    validator's errors for a rejected call, a note for an accepted one (nothing was
    executed, so the whole set of calls must be written again)."""
    calls = [tool_call_dict(c.call_id, c.name, arguments_json(c.arguments)) for c in result.candidates]
    out: list[dict[str, Any]] = [{"role": "assistant", "content": result.content, "tool_calls": calls}]
    for c, v in zip(result.candidates, verdicts, strict=True):
        if v.verdict == "accepted":
            note: dict[str, Any] = {"status": "valid", "note": "not executed; repeat this call with the corrected ones"}
        else:
            note = {
                "status": "rejected",
                "errors": [dict(e) for e in v.errors],
                "note": "fix the arguments and call again",
            }
        out.append({"role": "tool", "tool_call_id": c.call_id, "content": json.dumps(note, ensure_ascii=False)})
    return out


# ---- outputs refused before the validator ------------------------------------------------


def fatal(diagnostics: Sequence[Diagnostic]) -> Diagnostic | None:
    return next((d for d in diagnostics if d.code not in ADVISORY_CODES), None)


def choice_violation(req: ChatRequest, result: ParseResult) -> Diagnostic | None:
    """What the grammar guarantees, checked again (it may be off): tool_choice `required` or
    named needs a call, named allows only that tool, parallel_tool_calls=false at most one."""
    calls = result.candidates
    plan = req.plan
    if plan.forced and not calls:
        return Diagnostic("missing_tool_call", "expected a tool call (tool_choice requires one), got none", (0, 0))
    wanted = plan.named
    if wanted is not None:
        for c in calls:
            if c.name != wanted:
                return Diagnostic(
                    "wrong_tool", f"expected a call to {wanted!r}, got {c.name!r} at offset {c.span[0]}", c.span
                )
    if not plan.parallel and len(calls) > 1:
        message = f"expected one call (parallel_tool_calls is false), got {len(calls)} at offset {calls[1].span[0]}"
        return Diagnostic("too_many_calls", message, calls[1].span)
    return None


__all__ = [
    "ADVISORY_CODES",
    "Validator",
    "Verdict",
    "choice_violation",
    "fatal",
    "final_arguments",
    "repair_messages",
    "validate_all",
    "verdict_dict",
]
