"""The validator handoff: what goes to the validator, what comes back, and what is refused
before it.

Knows: the structural seam of callgate.serving.validation (Validator, Verdict, and the
envelope fields), the idempotency key, asking for all verdicts of a round concurrently,
the repair turn fed back to the model, and which parse diagnostics or tool_choice breaches
make an output unusable. Does not know: HTTP, engines, how a validator decides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from callgate.serving.protocol import ChatRequest, tool_call_dict
from callgate.types import Diagnostic, ParseResult, ToolCallCandidate, arguments_json

# A candidate with one of these diagnostics still goes to the validator (which rejects it).
ADVISORY_CODES = frozenset({"unknown_tool"})


# Structural views of callgate.serving.validation's ValidationRequest / Verdict / Validator
# (see the seams): any object with these fields and methods takes part.


class Verdict(Protocol):
    @property
    def verdict(self) -> str: ...  # "accepted" | "rejected"

    @property
    def arguments(self) -> Mapping[str, Any] | None: ...  # normalised arguments, when accepted

    @property
    def errors(self) -> Sequence[Mapping[str, Any]]: ...  # [{path, message}], when rejected

    @property
    def retryable(self) -> bool: ...

    @property
    def validator(self) -> str: ...


class Validator(Protocol):
    """Raises ValidatorUnavailableError (503) when it cannot reach a verdict."""

    async def validate(self, req: Any) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class ValidationEnvelope:
    """What the validator gets for one candidate (field names per the seam)."""

    request_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    raw: str
    format: str
    model: str
    schema: Mapping[str, Any] | None  # None: the tool is not declared in the request
    constrained: bool
    idempotency_key: str
    strict: bool = False  # the tool was declared `strict: true` (no unknown fields anywhere)


def idempotency_key(request_id: str, call_id: str, arguments: Mapping[str, Any]) -> str:
    """sha256 over the request id, call id and canonical arguments: a retry repeats it."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256("\x00".join((request_id, call_id, canonical)).encode()).hexdigest()


async def validate_all(
    validator: Validator,
    req: ChatRequest,
    candidates: Sequence[ToolCallCandidate],
    *,
    request_id: str,
    model: str,
    fmt: str,
    constrained: bool,
) -> list[Verdict]:
    """One verdict per candidate, asked concurrently, in candidate order. The first
    failure (e.g. ValidatorUnavailableError) is raised once all have finished."""

    async def one(c: ToolCallCandidate) -> Verdict:
        envelope = ValidationEnvelope(
            request_id=request_id,
            call_id=c.call_id,
            tool=c.name,
            arguments=c.arguments,
            raw=c.raw,
            format=fmt,
            model=model,
            schema=req.schema_of(c.name),
            constrained=constrained,
            idempotency_key=idempotency_key(request_id, c.call_id, c.arguments),
            strict=req.is_strict(c.name),
        )
        return await validator.validate(envelope)

    outcomes = await asyncio.gather(*(one(c) for c in candidates), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [o for o in outcomes if not isinstance(o, BaseException)]


def verdict_dict(v: Verdict) -> dict[str, Any]:
    out: dict[str, Any] = {"verdict": v.verdict, "validator": v.validator}
    if v.verdict == "accepted":
        out["arguments"] = None if v.arguments is None else dict(v.arguments)
    else:
        out["errors"] = [dict(e) for e in v.errors]
        out["retryable"] = v.retryable
    return out


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
    forced = req.tool_choice == "required" or isinstance(req.tool_choice, Mapping)
    if forced and not calls:
        return Diagnostic("missing_tool_call", "expected a tool call (tool_choice requires one), got none", (0, 0))
    if isinstance(req.tool_choice, Mapping):
        wanted = req.tool_choice["function"]["name"]
        for c in calls:
            if c.name != wanted:
                return Diagnostic(
                    "wrong_tool", f"expected a call to {wanted!r}, got {c.name!r} at offset {c.span[0]}", c.span
                )
    if not req.parallel_tool_calls and len(calls) > 1:
        message = f"expected one call (parallel_tool_calls is false), got {len(calls)} at offset {calls[1].span[0]}"
        return Diagnostic("too_many_calls", message, calls[1].span)
    return None
