"""Follow-ups reported by the format helpers, through the real app with a scripted
FakeEngine: the reasoning switch (`chat_template_kwargs.enable_thinking`) per format, no
tools meaning `[]` for the parser, and mistral's 9-character call ids."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
import pytest

from callgate.formats import call_id_pattern, get_format
from callgate.serving.app import create_app
from callgate.serving.conform import call_id_factory, conform_call_ids
from callgate.serving.engines.fake_engine import FakeEngine
from tests.harness import streamed_text
from tests.test_server_app import ASK, MODEL, WEATHER, Harness, SchemaCheck, make_settings

MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


@pytest.fixture
async def harness() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    def make(fmt: str, replies: Sequence[Any] = ()) -> Harness:
        engine = FakeEngine(replies=list(replies))
        validator = SchemaCheck()
        # what is tested here is rendering and parsing; some grammars of the other formats
        # (llama3-json auto, every tool_choice none) do not compile against the
        # FakeTokenizer's vocabulary since grammars are anchored at the end of text
        settings = make_settings(format=fmt, constrained=fmt == "hermes")
        app = create_app(settings, engine=engine, validator=validator)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://callgate.test")
        clients.append(client)
        return Harness(engine, validator, client)

    yield make
    for client in clients:
        await client.aclose()


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASK, "max_tokens": 64, **kw}


def _message(resp: httpx.Response) -> Mapping[str, Any]:
    assert resp.status_code == 200, resp.text
    message: Mapping[str, Any] = resp.json()["choices"][0]["message"]
    return message


# ---- 1. enable_thinking ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["enable_thinking", "thinking"])
async def test_hermes_thinking_off_renders_qwen3_empty_think_block(harness: Any, key: str) -> None:
    h = harness("hermes", [["Oslo ", "is ", "cold."]])
    message = _message(await h.post(_body(chat_template_kwargs={key: False})))
    assert h.engine.requests[0].prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert message["content"] == "Oslo is cold."
    assert "reasoning_content" not in message


async def test_hermes_thinking_off_wins_over_a_reasoning_effort(harness: Any) -> None:
    h = harness("hermes", [["Hi."]])
    _message(await h.post(_body(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})))
    assert h.engine.requests[0].prompt.endswith("assistant\n<think>\n\n</think>\n\n")


async def test_hermes_thinking_on_opens_the_block_and_parses_reasoning(harness: Any) -> None:
    h = harness("hermes", [["Cold ", "north.", "</think>", "\n\nOslo is cold."]])
    message = _message(await h.post(_body(chat_template_kwargs={"enable_thinking": True})))
    assert h.engine.requests[0].prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert message["reasoning_content"] == "Cold north."
    assert message["content"] == "Oslo is cold."


async def test_max_tokens_inside_the_reasoning_is_a_length_answer_not_a_502(harness: Any) -> None:
    """As OpenAI answers a reasoning model out of tokens: the reasoning so far, no content,
    streamed and not; under tool_choice required it stays the documented 502 (and a budget
    that cannot hold a call is a 400 before any generation)."""
    h = harness("hermes", [["Cold ", "north ", "and ", "more ", "thought."]] * 3)
    body = _body(chat_template_kwargs={"enable_thinking": True}, max_tokens=3)
    resp = await h.post(body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    message = choice["message"]
    assert (message["reasoning_content"], message["content"] or "", choice["finish_reason"]) == (
        "Cold north and ",
        "",
        "length",
    )
    chunks = [json.loads(e) for e in (await h.events(body))[:-1]]
    deltas = [c["choices"][0] for c in chunks if c.get("choices")]
    streamed = "".join(d["delta"].get("reasoning_content") or "" for d in deltas)
    assert streamed == "Cold north and " and not any(d["delta"].get("content") for d in deltas)
    assert deltas[-1]["finish_reason"] == "length"
    small = await h.post({**body, "tools": [WEATHER], "tool_choice": "required"})
    assert small.status_code == 400 and small.json()["error"]["param"] == "max_tokens"  # cannot hold a call
    forced = await h.post({**body, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 400})
    assert forced.status_code == 502 and forced.json()["error"]["code"] == "missing_think_end"


@pytest.mark.parametrize("fmt", ["hermes", "dsml-v4"])
async def test_a_model_ending_inside_its_reasoning_is_a_reasoning_only_answer(harness: Any, fmt: str) -> None:
    """QA: with no tools (no grammar) the model may end its turn before closing the block; the
    reply is the reasoning so far with finish_reason "stop", streamed and not, not a 502."""
    h = harness(fmt, [["Cold ", "north."]] * 3)
    body = _body(chat_template_kwargs={"enable_thinking": True})
    resp = await h.post(body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert (choice["message"]["reasoning_content"], choice["message"]["content"] or "") == ("Cold north.", "")
    assert choice["finish_reason"] == "stop"
    content, reasoning, finishes = streamed_text(await h.events(body))
    assert (content, reasoning, finishes) == ("", "Cold north.", ["stop"])
    forced = await h.post({**body, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 400})
    assert forced.status_code == 502


async def test_hermes_without_the_switch_leaves_the_generation_prompt_open(harness: Any) -> None:
    h = harness("hermes", [["Hi."]])
    _message(await h.post(_body()))
    assert h.engine.requests[0].prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("fmt", ["qwen3-xml", "llama3-json", "mistral"])
async def test_formats_without_reasoning_accept_thinking_off(harness: Any, fmt: str) -> None:
    h = harness(fmt, [["Oslo ", "is ", "cold."]])
    message = _message(await h.post(_body(chat_template_kwargs={"enable_thinking": False})))
    assert message["content"] == "Oslo is cold."


@pytest.mark.parametrize("fmt", ["qwen3-xml", "llama3-json", "mistral"])
@pytest.mark.parametrize("key", ["enable_thinking", "thinking"])
async def test_formats_without_reasoning_refuse_thinking_on_clearly(harness: Any, fmt: str, key: str) -> None:
    h = harness(fmt)
    resp = await h.post(_body(chat_template_kwargs={key: True}))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == f"chat_template_kwargs.{key}"
    assert fmt in error["message"] and "reasoning" in error["message"]
    assert h.engine.requests == []


async def test_conflicting_thinking_switches_are_refused(harness: Any) -> None:
    h = harness("hermes")
    resp = await h.post(_body(chat_template_kwargs={"enable_thinking": True, "thinking": False}))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "chat_template_kwargs"


# ---- 2. no tools: the parser gets [] ---------------------------------------------------------


@pytest.mark.parametrize("tools", [None, []])
async def test_llama3_json_answer_without_tools_is_content(harness: Any, tools: list[Any] | None) -> None:
    answer = '{"name": "Oslo", "parameters": {"days": 3}}'
    h = harness("llama3-json", [[answer[:9], answer[9:], "<|eot_id|>"]])
    body = _body() if tools is None else _body(tools=tools)
    resp = await h.post(body)
    message = _message(resp)
    assert message["content"] == answer
    assert "tool_calls" not in message
    assert resp.json()["choices"][0]["finish_reason"] == "stop"
    assert h.validator.seen == []


async def test_llama3_json_call_with_tools_is_still_a_call(harness: Any) -> None:
    call = json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}})
    h = harness("llama3-json", [[call, "<|eot_id|>"]])
    message = _message(await h.post(_body(tools=[WEATHER])))
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_llama3_json_answer_under_tool_choice_none_is_content(harness: Any) -> None:
    answer = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    h = harness("llama3-json", [[answer, "<|eot_id|>"]])
    message = _message(await h.post(_body(tools=[WEATHER], tool_choice="none")))
    assert message["content"] == answer
    assert "tool_calls" not in message


# ---- 3. mistral call ids ---------------------------------------------------------------------


def _mistral_call(arguments: Mapping[str, Any], call_id: str | None = None) -> str:
    obj: dict[str, Any] = {"name": "get_weather", "arguments": dict(arguments)}
    if call_id is not None:
        obj["id"] = call_id
    return "[TOOL_CALLS][" + json.dumps(obj) + "]</s>"


async def test_mistral_call_without_id_gets_a_9_character_id(harness: Any) -> None:
    h = harness("mistral", [[_mistral_call({"city": "Oslo"})]])
    message = _message(await h.post(_body(tools=[WEATHER])))
    call_id = message["tool_calls"][0]["id"]
    assert MISTRAL_ID.fullmatch(call_id), call_id


async def test_mistral_call_keeps_the_id_the_model_wrote(harness: Any) -> None:
    h = harness("mistral", [[_mistral_call({"city": "Oslo"}, "Wq3pZ8rLm")]])
    message = _message(await h.post(_body(tools=[WEATHER])))
    assert message["tool_calls"][0]["id"] == "Wq3pZ8rLm"


def _history(*ids: str) -> list[dict[str, Any]]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
        for i, c in zip(ids, ("Oslo", "Bergen", "Tromso"), strict=False)
    ]
    results = [{"role": "tool", "tool_call_id": i, "content": json.dumps({"temp": n})} for n, i in enumerate(ids)]
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": calls}, *results]


def _rendered_ids(prompt: str) -> tuple[list[str], list[str]]:
    calls = re.findall(r'"id": "([^"]*)"', prompt)
    results = re.findall(r'"call_id": "([^"]*)"', prompt)
    return calls, results


async def test_mistral_accepts_openai_style_ids_in_history(harness: Any) -> None:
    h = harness("mistral", [["Cold ", "everywhere."], ["Cold ", "everywhere."]])
    body = _body(tools=[WEATHER], messages=_history("call_abc123", "call_def456", "Wq3pZ8rLm"))
    assert _message(await h.post(body))["content"] == "Cold everywhere."
    calls, results = _rendered_ids(h.engine.requests[0].prompt)
    assert len(calls) == 3 and calls == results  # each result answers its own call
    assert all(MISTRAL_ID.fullmatch(i) for i in calls), calls
    assert len(set(calls)) == 3 and calls[2] == "Wq3pZ8rLm"  # valid ids are kept as they are
    _message(await h.post(body))
    assert _rendered_ids(h.engine.requests[1].prompt) == (calls, results)  # deterministic


async def test_mistral_repair_round_renders_valid_ids(harness: Any) -> None:
    bad = _mistral_call({"city": "Oslo", "days": "three"})
    good = _mistral_call({"city": "Oslo", "days": 3})
    h = harness("mistral", [[bad], [good]])
    message = _message(await h.post(_body(tools=[WEATHER])))
    assert message["tool_calls"][0]["function"]["arguments"] == json.dumps({"city": "Oslo", "days": 3})
    assert len(h.engine.requests) == 2
    calls, results = _rendered_ids(h.engine.requests[1].prompt)
    assert len(calls) == 1 and calls == results and MISTRAL_ID.fullmatch(calls[0])


def test_conformed_ids_are_in_the_spec_form_and_stable() -> None:
    pattern = re.compile(call_id_pattern(get_format("mistral")))
    history = _history("call_abc123", "call_abc124", "Wq3pZ8rLm")
    once = conform_call_ids("mistral", history)
    assert all(pattern.fullmatch(i) for i in _rendered_ids(json.dumps(once))[0])
    assert conform_call_ids("mistral", once) == once  # ids in form are kept: mapping twice changes nothing
    assert conform_call_ids("hermes", history) == tuple(history)  # OpenAI ids are fine elsewhere
    assert pattern.fullmatch(call_id_factory("mistral")(0))
    assert call_id_factory("hermes")(0).startswith("call_")
