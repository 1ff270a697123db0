"""Recovery of a tool call the model wrote outside the format's call markup.

Under tool_choice `auto` the grammar lets free text be anything but the format's markers,
so a model that means to call a tool may write the call as bare or fenced JSON
(`{"name": "get_weather", "arguments": {...}}`) instead of inside `<tool_call>`: returned
as it is, an agent sees a final answer and runs nothing. When a round's answer is wholly
such a call to a declared tool (parsers/outside_markup.py), the round gets the advisory
diagnostic `call_outside_markup` and, unless recovery is off or impossible, the chat service
runs one recovery round: the same prompt generated again under the grammar a request with
tool_choice {"type": "function", "function": {"name": N}} gets, so the call comes back in
the native markup with schema-constrained arguments and goes to the validator like any
candidate.

Knows: when an answer is looked at (a call plan in mode `auto`, so tools declared, with no response schema:
a JSON answer asked for is never a call), when a recovery round runs and what it is
recorded as. A recovery round is one of the request's repair rounds (`max_repairs`): none
is run when the budget is spent, when the server runs unconstrained (no grammar could hold
the model to the markup, so the same prompt would give the same text), when recovery is
off (`--no-recover-calls`, or `callgate.recover_calls: false` in the request, which wins),
or when the named grammar cannot be compiled in time. Then the answer stays the content the
model wrote, with its diagnostic.
Does not know: engines, parsers' syntax, HTTP.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from callgate.errors import CallgateError
from callgate.parsers.outside_markup import OutsideCall, find_call_outside_markup
from callgate.serving.conform import parser_tools
from callgate.serving.engines.engine import ConstraintRef
from callgate.serving.handoff import audit
from callgate.serving.settings import Settings
from callgate.serving.surfaces.protocol import ChatRequest, diagnostic_dict
from callgate.types import ParseResult

log = logging.getLogger("callgate.chat")

# What was done about a call written outside the markup: a recovery round was run, or why not.
Outcome = Literal["recovered", "off", "no_repair_budget", "unconstrained", "grammar_unavailable"]


@dataclass(frozen=True, slots=True)
class Recovery:
    """One answer that was a call to `tool` outside the markup, found in round `from_round`.
    `round` is the recovery round that asks for it again (None when none was run, `outcome`
    says why); `request` is the named-tool form of the request that round is held to, and
    `constraint` its grammar."""

    tool: str
    from_round: int
    outcome: Outcome
    round: int | None = None
    request: ChatRequest | None = None
    constraint: ConstraintRef | None = None

    def block(self) -> dict[str, Any]:
        """The entry in the `callgate` block's `recoveries` (and in the audit record)."""
        return {"from_round": self.from_round, "tool": self.tool, "round": self.round, "outcome": self.outcome}


def find_outside_call(
    fmt: str, req: ChatRequest, output: str, result: ParseResult, finish_reason: str
) -> OutsideCall | None:
    """The call that a round's answer is, written outside the markup; None when there is none
    or the request is not one whose answers are looked at (see the module docstring)."""
    if req.plan.mode != "auto" or req.plan.response_schema is not None:
        return None
    return find_call_outside_markup(fmt, output, result, parser_tools(req), truncated=finish_reason == "length")


def with_diagnostic(result: ParseResult, found: OutsideCall) -> ParseResult:
    return dataclasses.replace(result, diagnostics=(*result.diagnostics, found.diagnostic))


def refusal(settings: Settings, req: ChatRequest, round_index: int, max_repairs: int) -> Outcome | None:
    """Why no recovery round may follow round `round_index`; None when one may."""
    wanted = settings.recover_calls if req.recover_calls is None else req.recover_calls
    if not wanted:
        return "off"
    if round_index >= max_repairs:
        return "no_repair_budget"
    if not settings.constrained:
        return "unconstrained"
    return None


def named_request(req: ChatRequest, tool: str) -> ChatRequest:
    """`req` as a request naming `tool` in tool_choice: what the recovery round is held to
    (its grammar, and the checks of tool_choice that the grammar would enforce)."""
    named = {"type": "function", "function": {"name": tool}}
    return dataclasses.replace(req, tool_choice=named, plan=req.plan.naming(tool))


async def plan(
    settings: Settings,
    req: ChatRequest,
    found: OutsideCall,
    round_index: int,
    max_repairs: int,
    compile_constraint: Callable[[ChatRequest], Awaitable[ConstraintRef | None]],
) -> Recovery:
    """What is done about `found`, written by round `round_index`: a recovery round next
    (`round` set, its named grammar compiled by `compile_constraint`), or why not. A compile
    that fails (e.g. grammar_compiler_busy) leaves the answer as written: it was one."""
    named = named_request(req, found.name)
    outcome = refusal(settings, req, round_index, max_repairs)
    if outcome is not None:
        return Recovery(found.name, round_index, outcome, request=named)
    try:
        constraint = await compile_constraint(named)
    except CallgateError as exc:
        log.warning("no recovery round for a call to %r: %s", found.name, exc.message)
        constraint = None
    if constraint is None:
        return Recovery(found.name, round_index, "grammar_unavailable", request=named)
    return Recovery(found.name, round_index, "recovered", round_index + 1, named, constraint)


def audit_record(
    rec: Recovery, found: OutsideCall, output: str, result: ParseResult, *, request_id: str, settings: Settings
) -> dict[str, Any]:
    """The audit record of the answer `found` in `output` (its round's result, diagnostic
    included) and what was done about it."""
    start, end = found.diagnostic.span
    return audit.outside_markup_record(
        request_id=request_id,
        round_index=rec.from_round,
        model=settings.model_name,
        fmt=settings.format,
        tool=found.name,
        raw=output[start:end],
        diagnostics=[diagnostic_dict(d) for d in result.diagnostics],
        recovery=rec.block(),
        constrained=settings.constrained,
    )
