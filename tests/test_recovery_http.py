"""Recovery of a call written outside the call markup (serving/recovery.py), through the
official `openai` client against a real uvicorn server with a scripted FakeEngine: the model
first answers with the call as bare or fenced JSON, then (asked again under the named tool's
grammar) writes it in its native markup. Every format; streamed and not; the answers that
are not recovered; the switches; the repair budget; the metric; the audit log; and the
Anthropic surface (the official `anthropic` client on /v1/messages)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from callgate.formats import FORMATS, get_format
from callgate.serving.engines.fake_engine import FakeEngine, FakeReply
from callgate.serving.handoff.audit import read_records
from tests.harness import assistant_completion
from tests.test_server_app import ASK, MODEL, WEATHER, SchemaCheck, make_settings
from tests.test_server_openai import Server

OSLO = {"city": "Oslo", "days": 3}
FENCED = "```json\n" + json.dumps({"name": "get_weather", "arguments": OSLO}, indent=2) + "\n```"
BARE = json.dumps({"name": "get_weather", "arguments": OSLO})  # the issue's first reply


def native_call(fmt: str, arguments: dict[str, Any] = OSLO) -> str:
    """The call as the format's renderer writes it (what the named grammar makes the model write)."""
    function = {"name": "get_weather", "arguments": json.dumps(arguments)}
    call = {"id": "abcDEF123", "type": "function", "function": function}
    text = assistant_completion(
        fmt, ASK, {"role": "assistant", "content": "", "tool_calls": [call]}, [WEATHER], eos=get_format(fmt).eos
    )
    return text.removesuffix(get_format(fmt).eos)


_CLIENTS: dict[int, Any] = {}  # one official client per server (the server closes it)


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(replies: Any, **settings_kw: Any) -> Server:
        settings = make_settings(**settings_kw)
        engine = FakeEngine(replies=list(replies), max_model_len=settings.max_model_len)
        server = Server(settings, engine, SchemaCheck())
        servers.append(server.__enter__())
        _CLIENTS[id(server)] = server.client()
        return server

    yield start
    for server in servers:
        _CLIENTS.pop(id(server))  # the server closes it
        server.__exit__()


def ask(server: Server, **kw: Any) -> Any:
    return _CLIENTS[id(server)].chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], **kw)


def metrics(server: Server) -> str:
    return httpx.get(server.url + "/metrics").text


def assert_recovered(server: Server, fmt: str) -> None:
    """Two generations of the same prompt: the first under the request's auto grammar, the
    second under the grammar a request naming get_weather gets."""
    first, second = server.engine.requests
    assert first.prompt == second.prompt and first.prompt_ids == second.prompt_ids
    assert first.constraint is not None and second.constraint is not None
    assert first.constraint.key.startswith(f"{fmt}:auto:") and second.constraint.key.startswith(f"{fmt}:named:")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_fenced_call_is_recovered_into_tool_calls_in_every_format(serve: Callable[..., Server], fmt: str) -> None:
    server = serve([FENCED, native_call(fmt)], format=fmt)
    done = ask(server)
    choice = done.choices[0]
    [call] = choice.message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", OSLO)
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    block = done.model_extra["callgate"]
    assert block["recoveries"] == [{"from_round": 0, "tool": "get_weather", "round": 1, "outcome": "recovered"}]
    assert block["repairs"] == 1
    [diag] = block["diagnostics"]
    assert (diag["code"], diag["round"]) == ("call_outside_markup", 0)
    assert FENCED[diag["span"][0] : diag["span"][1]].startswith('{\n  "name": "get_weather"')
    [cand] = block["candidates"]
    assert (cand["round"], cand["verdict"]["verdict"]) == (1, "accepted")
    assert_recovered(server, fmt)


def test_the_issues_bare_reply_is_recovered(serve: Callable[..., Server]) -> None:
    server = serve([BARE, native_call("hermes")])
    [call] = ask(server).choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == OSLO
    assert_recovered(server, "hermes")


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-xml", "llama3-json"])
def test_a_streamed_recovery_sends_the_first_text_then_the_call(serve: Callable[..., Server], fmt: str) -> None:
    """A stream cannot take back text: the first round's JSON was sent as it was generated
    (as with repair rounds); the recovered call follows as tool_calls."""
    server = serve([FENCED, native_call(fmt)], format=fmt)
    content, name, args, finishes, block = "", "", "", [], None
    for part in ask(server, stream=True):
        if not part.choices:
            continue
        delta = part.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            name += (tc.function.name or "") if tc.function else ""
            args += (tc.function.arguments or "") if tc.function else ""
        if part.choices[0].finish_reason:
            finishes.append(part.choices[0].finish_reason)
            block = part.model_extra["callgate"]
    assert content == FENCED
    assert (name, json.loads(args), finishes) == ("get_weather", OSLO, ["tool_calls"])
    assert block is not None and block["recoveries"][0]["outcome"] == "recovered"
    assert_recovered(server, fmt)


def test_a_call_cut_by_max_tokens_is_recovered(serve: Callable[..., Server]) -> None:
    """The issue's second reply: a fenced call that ran out of tokens inside its arguments."""
    cut = FENCED[: FENCED.index("Oslo") + 2]
    server = serve([FakeReply(tuple(cut), finish_reason="length"), native_call("hermes")])
    choice = ask(server).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    assert_recovered(server, "hermes")


# ---- answers that are not recovered ----------------------------------------------------------

NOT_RECOVERED = {
    "explained among text": "To get it I would call\n" + FENCED + "\nwith your city.",
    "an undeclared tool": json.dumps({"name": "get_time", "arguments": {}}),
    "plain JSON data": json.dumps({"city": "Oslo", "temperature_c": 4}),
}


@pytest.mark.parametrize("case", sorted(NOT_RECOVERED))
def test_content_that_merely_holds_json_is_the_answer(serve: Callable[..., Server], case: str) -> None:
    server = serve([NOT_RECOVERED[case]])
    done = ask(server)
    assert done.choices[0].message.content == NOT_RECOVERED[case] and not done.choices[0].message.tool_calls
    assert done.model_extra["callgate"]["diagnostics"] == [] and "recoveries" not in done.model_extra["callgate"]
    assert len(server.engine.requests) == 1


def test_a_json_answer_under_response_format_is_the_answer(serve: Callable[..., Server]) -> None:
    """The client asked for JSON of exactly a call's shape: the answer is what it asked for."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "arguments": WEATHER["function"]["parameters"]},
        "required": ["name", "arguments"],
    }
    server = serve([BARE])
    done = ask(server, response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": schema}})
    assert done.choices[0].message.content == BARE and not done.choices[0].message.tool_calls
    assert done.model_extra["callgate"]["diagnostics"] == [] and len(server.engine.requests) == 1


@pytest.mark.parametrize("tool_choice", ["none", "required"])
def test_only_auto_answers_are_looked_at(serve: Callable[..., Server], tool_choice: str) -> None:
    reply = BARE if tool_choice == "none" else native_call("hermes")
    server = serve([reply])
    done = ask(server, tool_choice=tool_choice)
    assert "recoveries" not in done.model_extra["callgate"] and len(server.engine.requests) == 1


# ---- switches and budget ----------------------------------------------------------------------


def _left_as_written(done: Any, outcome: str) -> None:
    """Status 200, the content as the model wrote it, the diagnostic reported (advisory)."""
    assert done.choices[0].message.content == BARE and not done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "stop"
    block = done.model_extra["callgate"]
    assert [d["code"] for d in block["diagnostics"]] == ["call_outside_markup"]
    assert block["recoveries"] == [{"from_round": 0, "tool": "get_weather", "round": None, "outcome": outcome}]


def test_the_server_flag_turns_recovery_off(serve: Callable[..., Server]) -> None:
    server = serve([BARE, BARE, native_call("hermes")], recover_calls=False)
    _left_as_written(ask(server), "off")
    assert len(server.engine.requests) == 1
    assert 'callgate_recoveries_total{outcome="off"} 1.0' in metrics(server)
    recovered = ask(server, extra_body={"callgate": {"recover_calls": True}})  # the request's word wins
    assert recovered.choices[0].message.tool_calls and len(server.engine.requests) == 3


def test_the_request_field_turns_recovery_off(serve: Callable[..., Server]) -> None:
    server = serve([BARE])
    _left_as_written(ask(server, extra_body={"callgate": {"recover_calls": False}}), "off")
    assert len(server.engine.requests) == 1


def test_a_streamed_answer_left_as_written_ends_normally(serve: Callable[..., Server]) -> None:
    server = serve([BARE], recover_calls=False)
    parts = [p for p in ask(server, stream=True) if p.choices]
    assert "".join(p.choices[0].delta.content or "" for p in parts) == BARE
    assert [p.choices[0].finish_reason for p in parts if p.choices[0].finish_reason] == ["stop"]
    assert parts[-1].model_extra["callgate"]["diagnostics"][0]["code"] == "call_outside_markup"


def test_the_recovery_is_a_round_of_the_repair_budget(serve: Callable[..., Server]) -> None:
    server = serve([BARE], max_repairs=0)
    _left_as_written(ask(server), "no_repair_budget")
    server = serve([BARE])
    _left_as_written(ask(server, extra_body={"callgate": {"max_repairs": 0}}), "no_repair_budget")
    assert 'callgate_recoveries_total{outcome="no_repair_budget"} 1.0' in metrics(server)


def test_a_rejected_recovered_call_spends_the_budget(serve: Callable[..., Server]) -> None:
    """The recovered call goes to the validator like any candidate: rejected with the budget
    spent by the recovery, it is a 422; with one more round, the repair fixes it."""
    wrong = native_call("hermes", {"city": "Oslo", "days": "three"})
    server = serve([BARE, wrong])
    with pytest.raises(openai.UnprocessableEntityError) as err:
        ask(server)
    body = err.value.response.json()
    assert body["error"]["code"] == "tool_call_rejected"
    assert [(c["round"], c["verdict"]["verdict"]) for c in body["callgate"]["candidates"]] == [(1, "rejected")]
    assert body["callgate"]["recoveries"][0]["outcome"] == "recovered"
    server = serve([BARE, wrong, native_call("hermes")], max_repairs=2)
    done = ask(server)
    [call] = done.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == OSLO
    assert [c["round"] for c in done.model_extra["callgate"]["candidates"]] == [1, 2]
    assert done.model_extra["callgate"]["repairs"] == 2


def test_an_unconstrained_server_reports_but_does_not_recover(serve: Callable[..., Server]) -> None:
    server = serve([BARE], constrained=False)
    _left_as_written(ask(server), "unconstrained")


# ---- metric and audit log ---------------------------------------------------------------------


def test_both_rounds_are_in_the_metrics_and_the_audit_log(serve: Callable[..., Server], tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    server = serve([FENCED, native_call("hermes")], audit_log=str(log))
    done = ask(server)
    text = metrics(server)
    assert 'callgate_recoveries_total{outcome="recovered"} 1.0' in text
    assert 'callgate_parse_diagnostics_total{code="call_outside_markup"} 1.0' in text
    outside, candidate = read_records(log).records
    assert (outside["kind"], outside["round"], outside["tool"]) == ("call_outside_markup", 0, "get_weather")
    assert outside["request_id"] == candidate["request_id"] == done.id
    assert outside["raw"] == FENCED.removeprefix("```json\n").removesuffix("\n```")
    assert outside["recovery"] == {"from_round": 0, "tool": "get_weather", "round": 1, "outcome": "recovered"}
    assert [d["code"] for d in outside["diagnostics"]] == ["call_outside_markup"]
    assert (candidate["round"], candidate["recovered_from_round"]) == (1, 0)
    assert candidate["verdict"]["verdict"] == "accepted"
    assert "kind" not in candidate and candidate["arguments"] == OSLO


# ---- the Anthropic surface (/v1/messages runs the same turn) -----------------------------------

ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER["function"]["parameters"]}]


def test_the_messages_surface_recovers_too(serve: Callable[..., Server]) -> None:
    server = serve([BARE, native_call("hermes"), BARE, native_call("hermes"), BARE])
    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=20) as client:
        kw: dict[str, Any] = {"model": MODEL, "max_tokens": 200, "messages": ASK, "tools": ANTHROPIC_TOOLS}
        done = client.messages.create(**kw)
        assert done.stop_reason == "tool_use"
        [use] = [b for b in done.content if b.type == "tool_use"]
        assert (use.name, use.input) == ("get_weather", OSLO)
        assert done.model_extra["callgate"]["recoveries"][0]["outcome"] == "recovered"
        with client.messages.stream(**kw) as stream:
            streamed = stream.get_final_message()
        assert [b.type for b in streamed.content] == ["text", "tool_use"]  # the first round's text was sent
        assert streamed.content[0].text == BARE and streamed.stop_reason == "tool_use"
        off = client.messages.create(**kw, extra_body={"callgate": {"recover_calls": False}})
        assert off.stop_reason == "end_turn" and [b.type for b in off.content] == ["text"]
        assert off.content[0].text == BARE
        assert off.model_extra["callgate"]["diagnostics"][0]["code"] == "call_outside_markup"


# ---- the Responses surface (/v1/responses runs the same turn) ----------------------------------

RESPONSES_TOOLS = [{"type": "function", **WEATHER["function"]}]


def test_the_responses_surface_recovers_and_honours_the_request_field(serve: Callable[..., Server]) -> None:
    server = serve([BARE, native_call("hermes"), BARE])
    client = _CLIENTS[id(server)]
    done = client.responses.create(model=MODEL, input="Weather in Oslo for 3 days?", tools=RESPONSES_TOOLS)
    [call] = [item for item in done.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", OSLO)
    assert len(server.engine.requests) == 2
    off = client.responses.create(
        model=MODEL,
        input="Weather in Oslo for 3 days?",
        tools=RESPONSES_TOOLS,
        extra_body={"callgate": {"recover_calls": False}},
    )
    assert [item.type for item in off.output] == ["message"] and off.output_text == BARE
    assert len(server.engine.requests) == 3  # no second round
