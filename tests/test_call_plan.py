"""The call plan (callgate.call_plan): every surface's tool_choice shapes become one plan
when the request becomes the internal ChatRequest, the grammar is built from that plan
under the key the raw values give, and a bad tool schema is refused once, by the surface's
checks, naming the tool."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.call_plan import CallPlan
from callgate.constraints.request import grammar_of, grammar_request
from callgate.errors import InvalidRequestError
from callgate.parsers import parse
from callgate.serving.conform import conform_chat, parser_tools, stops_outside_markup
from callgate.serving.handoff.candidates import choice_violation
from callgate.serving.settings import Limits
from callgate.serving.surfaces.anthropic_request import parse_messages_request
from callgate.serving.surfaces.protocol_request import ChatRequest, parse_chat_request
from callgate.serving.surfaces.responses_request import parse_responses_request

LIMITS = Limits()
ASK = [{"role": "user", "content": "Weather in Paris?"}]
PARAMS: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTIONS = [
    {"name": "get_weather", "description": "Weather for a city", "parameters": PARAMS, "strict": True},
    {"name": "get_time", "description": "Time in a city", "parameters": PARAMS},
]


def chat(tool_choice: Any = None, parallel: bool | None = None, **extra: Any) -> ChatRequest:
    body: dict[str, Any] = {"model": "m", "messages": ASK, **extra}
    body["tools"] = [{"type": "function", "function": fn} for fn in FUNCTIONS]
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    return parse_chat_request(json.dumps(body).encode(), LIMITS)


def responses(tool_choice: Any = None, parallel: bool | None = None, **extra: Any) -> ChatRequest:
    body: dict[str, Any] = {"model": "m", "input": ASK, **extra}
    body["tools"] = [{"type": "function", **fn} for fn in FUNCTIONS]
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    return parse_responses_request(json.dumps(body).encode(), LIMITS).chat_request((), LIMITS)


def messages(tool_choice: Any = None, **extra: Any) -> ChatRequest:
    tools = [
        {
            "name": fn["name"],
            "description": fn["description"],
            "input_schema": fn["parameters"],
            **({"strict": True} if fn.get("strict") else {}),
        }
        for fn in FUNCTIONS
    ]
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": tools, **extra}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return parse_messages_request(json.dumps(body).encode(), LIMITS, "hermes").chat


# Each row: one intent, as each surface spells it.
SHAPES = {
    "auto": [chat(), chat("auto"), responses(), responses("auto"), messages(), messages({"type": "auto"})],
    "required": [chat("required"), responses("required"), messages({"type": "any"})],
    "named": [
        chat({"type": "function", "function": {"name": "get_time"}}),
        responses({"type": "function", "name": "get_time"}),
        messages({"type": "tool", "name": "get_time"}),
    ],
    "none": [chat("none"), responses("none"), messages({"type": "none"})],
    "serial": [
        chat("required", parallel=False),
        responses("required", parallel=False),
        messages({"type": "any", "disable_parallel_tool_use": True}),
    ],
}


@pytest.mark.parametrize("intent", SHAPES)
def test_every_surfaces_tool_choice_shape_gives_one_plan(intent: str) -> None:
    plans = [req.plan for req in SHAPES[intent]]
    assert all(p == plans[0] for p in plans), plans


def test_the_plan_of_each_intent() -> None:
    auto, required, named, none, serial = (SHAPES[k][0].plan for k in ("auto", "required", "named", "none", "serial"))
    assert (auto.mode, [t.name for t in auto.tools], auto.parallel) == ("auto", ["get_weather", "get_time"], True)
    assert (required.mode, required.forced, required.named) == ("required", True, None)
    assert (named.mode, [t.name for t in named.tools], named.named, named.forced) == (
        "named",
        ["get_time"],
        "get_time",
        True,
    )
    assert [t["function"]["name"] for t in named.shown or ()] == ["get_weather", "get_time"]  # the prompt shows all
    assert (none.mode, none.tools, none.shown, none.declared) == ("none", (), None, True)
    assert (serial.mode, serial.parallel) == ("required", False)
    # a strict tool's schema is closed, as the validator closes it; a non-strict one is not
    weather, time_ = auto.tools
    assert weather.parameters.get("unevaluatedProperties") is False and "unevaluatedProperties" not in time_.parameters


def test_no_tools_and_a_response_format() -> None:
    free = parse_chat_request(json.dumps({"messages": ASK}).encode(), LIMITS).plan
    assert (free.mode, free.tools, free.shown, free.declared, free.response_schema) == ("none", (), None, False, None)
    assert grammar_of("hermes", free) is None  # nothing constrains free text
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": PARAMS}}
    answer = chat("none", response_format=fmt).plan
    assert (answer.mode, answer.response_schema, answer.json_answer) == ("response_format", PARAMS, False)
    beside = chat(response_format=fmt).plan
    assert (beside.mode, beside.response_schema, beside.json_answer) == ("auto", PARAMS, True)
    # no answer may be written where a call must be: the schema is not part of the plan
    assert chat("required", response_format=fmt).plan.response_schema is None


@pytest.mark.parametrize("intent", SHAPES)
@pytest.mark.parametrize("fmt", ["hermes", "llama3-json", "qwen3-xml"])
def test_the_grammar_of_a_plan_has_the_key_of_the_raw_request(intent: str, fmt: str) -> None:
    req = SHAPES[intent][0]
    raw = grammar_request(fmt, req.tools, req.tool_choice, req.parallel_tool_calls, req.response_format)
    planned = grammar_of(fmt, req.plan)
    assert raw is not None and planned is not None
    assert planned == raw and planned.key() == raw.key()


def test_conform_sets_the_plans_thinking() -> None:
    on = chat(chat_template_kwargs={"enable_thinking": True})
    assert on.plan.thinking is None  # not known before the format is
    assert conform_chat("hermes", on).plan.thinking is True
    # hermes is the Qwen3 ChatML framing: the switch off closes an empty block
    assert conform_chat("hermes", chat(chat_template_kwargs={"enable_thinking": False})).plan.thinking is False
    assert conform_chat("hermes", chat()).plan.thinking is None
    assert conform_chat("hermes", chat(), reasons=False).plan.thinking is False  # a model writing no reasoning


def test_the_readers_of_the_plan() -> None:
    none, named = SHAPES["none"][0], SHAPES["named"][0]
    assert parser_tools(none) == () and len(parser_tools(named)) == 2
    stop = {"stop": ["END"]}
    # llama3-json reads no reasoning block: only a prompt showing tools moves the stops off the engine
    assert not stops_outside_markup("llama3-json", chat("none", **stop))
    assert stops_outside_markup("llama3-json", chat(**stop))
    wrong = parse("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', FUNCTIONS)
    found = choice_violation(named, wrong)
    assert found is not None and found.code == "wrong_tool"
    missing = choice_violation(SHAPES["required"][0], parse("hermes", "It is sunny.", FUNCTIONS))
    assert missing is not None and missing.code == "missing_tool_call"
    assert choice_violation(SHAPES["auto"][0], parse("hermes", "It is sunny.", FUNCTIONS)) is None


BAD = {"type": "object", "properties": {"city": {"type": 5}}}


def refusal(make: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        make()
    return info.value


def test_a_bad_tool_schema_is_refused_once_naming_the_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    real = CallPlan.of.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(CallPlan, "of", classmethod(lambda cls, *a, **k: built.append(a) or real(cls, *a, **k)))
    bad = [
        {"type": "function", "function": FUNCTIONS[0]},
        {"type": "function", "function": {**FUNCTIONS[1], "parameters": BAD}},
    ]
    body = json.dumps({"messages": ASK, "tools": bad}).encode()
    err = refusal(lambda: parse_chat_request(body, LIMITS))
    assert err.param == "tools[1].function.parameters" and "/properties/city/type" in err.message
    rbody = json.dumps(
        {
            "input": ASK,
            "tools": [{"type": "function", **FUNCTIONS[0]}, {"type": "function", **FUNCTIONS[1], "parameters": BAD}],
        }
    )
    err = refusal(lambda: parse_responses_request(rbody.encode(), LIMITS))
    assert err.param is not None and err.param.startswith("tools[1]") and "/properties/city/type" in err.message
    mtools = [{"name": "get_weather", "input_schema": PARAMS}, {"name": "get_time", "input_schema": BAD}]
    mbody = json.dumps({"model": "m", "max_tokens": 8, "messages": ASK, "tools": mtools}).encode()
    err = refusal(lambda: parse_messages_request(mbody, LIMITS, "hermes"))
    assert err.param is not None and err.param.startswith("tools[1]") and "/properties/city/type" in err.message
    assert built == []  # refused before any plan (and so any grammar) was built
    chat()
    assert len(built) == 1  # a good request builds its plan once
