"""serving/recovery.py on its own: which answers are looked at, which switch wins, the repair
budget, and a named grammar that cannot be had (the answer then stands as written)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from callgate.errors import CompilerBusyError
from callgate.parsers import parse
from callgate.serving import recovery
from callgate.serving.settings import Limits, Settings
from callgate.serving.surfaces.protocol import parse_chat_request
from tests.test_server_app import ASK, WEATHER

CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})


def request(**body: Any) -> Any:
    return parse_chat_request(json.dumps({"messages": ASK, "tools": [WEATHER], **body}).encode(), Limits())


def found(req: Any, output: str = CALL, finish: str = "stop") -> Any:
    return recovery.find_outside_call("hermes", req, output, parse("hermes", output, req.tools), finish)


def test_only_auto_requests_without_response_format_are_looked_at() -> None:
    hit = found(request())
    assert hit is not None and hit.name == "get_weather" and hit.diagnostic.span == (0, len(CALL))
    assert found(request(tool_choice="none")) is None
    assert found(request(tool_choice="required")) is None
    assert found(request(response_format={"type": "json_object"})) is None
    assert found(parse_chat_request(json.dumps({"messages": ASK}).encode(), Limits())) is None


def test_the_diagnostic_is_added_to_the_round() -> None:
    req = request()
    result = parse("hermes", CALL, req.tools)
    with_it = recovery.with_diagnostic(result, found(req))
    assert [d.code for d in with_it.diagnostics] == ["call_outside_markup"] and with_it.content == result.content


@pytest.mark.parametrize(
    ("server", "field", "round_index", "max_repairs", "constrained", "want"),
    [
        (True, None, 0, 1, True, None),
        (False, None, 0, 1, True, "off"),
        (False, True, 0, 1, True, None),  # the request's word wins
        (True, False, 0, 1, True, "off"),
        (True, None, 1, 1, True, "no_repair_budget"),
        (True, None, 0, 0, True, "no_repair_budget"),
        (True, None, 0, 1, False, "unconstrained"),
    ],
)
def test_refusal(
    server: bool, field: bool | None, round_index: int, max_repairs: int, constrained: bool, want: str | None
) -> None:
    settings = Settings(recover_calls=server, constrained=constrained)
    req = dataclasses.replace(request(), recover_calls=field)
    assert recovery.refusal(settings, req, round_index, max_repairs) == want


def test_named_request_names_the_tool_and_keeps_the_rest() -> None:
    req = request(parallel_tool_calls=False)
    named = recovery.named_request(req, "get_weather")
    assert named.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert (named.plan.mode, named.plan.named, named.plan.parallel) == ("named", "get_weather", False)
    assert named.plan.shown == req.plan.shown  # the prompt still shows every tool
    assert dataclasses.replace(named, tool_choice="auto", plan=req.plan) == req


async def test_a_named_grammar_that_cannot_be_compiled_leaves_the_answer() -> None:
    req = request()
    hit = found(req)

    async def busy(named: Any) -> Any:
        assert named.tool_choice["function"]["name"] == "get_weather"
        raise CompilerBusyError("grammar compile timed out")

    async def absent(named: Any) -> Any:
        return None

    for compile_constraint in (busy, absent):
        rec = await recovery.plan(Settings(), req, hit, 0, 1, compile_constraint)
        assert (rec.outcome, rec.round, rec.constraint) == ("grammar_unavailable", None, None)
        assert rec.block() == {"from_round": 0, "tool": "get_weather", "round": None, "outcome": "grammar_unavailable"}


async def test_a_planned_recovery_is_the_next_round_under_the_named_grammar() -> None:
    req = request()
    ref = object()

    async def compile_constraint(named: Any) -> Any:
        return ref

    rec = await recovery.plan(Settings(), req, found(req), 0, 1, compile_constraint)
    assert (rec.outcome, rec.from_round, rec.round, rec.constraint) == ("recovered", 0, 1, ref)
    assert rec.request is not None and rec.request.tool_choice["function"]["name"] == "get_weather"
    off = await recovery.plan(Settings(recover_calls=False), req, found(req), 0, 1, compile_constraint)
    assert (off.outcome, off.round) == ("off", None)
