"""The Responses request translator: a /v1/responses body (with the conversation of the
response it continues) -> the internal ChatRequest, and its 400s naming the Responses field;
and the bounded response store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.errors import InvalidRequestError
from callgate.serving.settings import Limits
from callgate.serving.surfaces.responses_request import ResponsesRequest, parse_responses_request
from callgate.serving.surfaces.responses_store import ResponseStore

LIMITS = Limits()
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def parse(**body: Any) -> ResponsesRequest:
    return parse_responses_request(json.dumps({"model": "m", **body}).encode(), LIMITS)


def refused(**body: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        req = parse(**body)
        req.chat_request((), LIMITS)
    return info.value


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    chat = parse(input="Hi", instructions="Be brief.").chat_request((), LIMITS)
    assert chat.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    assert (chat.tools, chat.tool_choice, chat.parallel_tool_calls) == (None, "none", True)
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.response_format) == (None, 1.0, 1.0, None)


def test_items_become_chat_messages_in_order() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "-3 C"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2 C"}]},
    ]
    req = parse(input=items, tools=[WEATHER], max_output_tokens=64, temperature=0.2, parallel_tool_calls=False)
    chat = req.chat_request((), LIMITS)
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}},
    ]
    assert list(chat.messages) == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": calls, "reasoning_content": "Need the tool."},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "2 C"},
    ]
    assert chat.tools == ({"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}},)
    assert (chat.tool_choice, chat.parallel_tool_calls, chat.max_tokens, chat.temperature) == ("auto", False, 64, 0.2)
    assert all(item["id"] and item["status"] == "completed" for item in req.input_items)


def test_history_comes_before_the_new_input_and_instructions_before_both() -> None:
    first = parse(input="Weather in Oslo?", tools=[WEATHER])
    call = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    history = (*first.input_items, call)
    follow = parse(input=[{"type": "function_call_output", "call_id": "c1", "output": "cold"}], instructions="New.")
    chat = follow.chat_request(history, LIMITS)
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.messages[0]["content"] == "New."


def test_hosted_tools_are_left_out_and_named() -> None:
    tools = [
        {"type": "web_search_preview"},
        WEATHER,
        {"type": "mcp", "server_label": "gh"},
        {"type": "custom", "name": "patch"},
    ]
    req = parse(input="x", tools=tools)
    assert [t["function"]["name"] for t in req.tools or ()] == ["get_weather"]
    assert req.ignored_tools == (
        {"index": 0, "type": "web_search_preview"},
        {"index": 2, "type": "mcp", "name": "gh"},
        {"index": 3, "type": "custom", "name": "patch"},
    )
    only_hosted = parse(input="x", tools=[{"type": "image_generation"}])
    assert (only_hosted.tools, only_hosted.tool_choice) == (None, "none")


def test_tool_choice_shapes() -> None:
    named = parse(input="x", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    assert named.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert parse(input="x", tools=[WEATHER], tool_choice="required").tool_choice == "required"
    allowed = parse(
        input="x",
        tools=[WEATHER, {**WEATHER, "name": "other"}],
        tool_choice={"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "other"}]},
    )
    assert allowed.tool_choice == "required"
    assert [t["function"]["name"] for t in allowed.tools or ()] == ["other"]


def test_text_format_and_reasoning_and_user() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = parse(
        input="x",
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
        reasoning={"effort": "high"},
        safety_identifier="u-1",
    )
    assert req.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert (req.reasoning_effort, req.user) == ("high", "u-1")
    assert req.echo["text"] == {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}}
    assert parse(input="x", text={"format": {"type": "json_object"}}).response_format == {"type": "json_object"}
    assert parse(input="x", text={"format": {"type": "text"}}).response_format is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": [{"type": "computer_call_output", "call_id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}, "input[0]"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
            "tools[0].parameters",
        ),
        ({"input": "x", "tools": [WEATHER, WEATHER]}, "tools[1].name"),
        ({"input": "x", "tools": [{"name": "f"}]}, "tools[0].type"),
        ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
        (
            {
                "input": "x",
                "tools": [{"type": "custom", "name": "p"}],
                "tool_choice": {"type": "function", "name": "p"},
            },
            "tool_choice.name",
        ),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "o"}}}, "text.format.schema"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": 3}}}},
            "text.format.schema",
        ),
        ({"input": "x", "max_output_tokens": 10**6}, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
        ({"input": 3}, "input"),
        ({"input": []}, "input"),
        ({"input": [], "instructions": "Be brief."}, "input"),
    ],
)
def test_errors_name_the_responses_field(body: dict[str, Any], param: str) -> None:
    err = refused(**body)
    assert err.status == 400 and err.param == param, (err.param, err.message)
    assert err.message.startswith(param), err.message


def test_a_call_answered_twice_is_refused() -> None:
    items = [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "1"},
        {"type": "function_call_output", "call_id": "c", "output": "2"},
    ]
    err = refused(input=items)
    assert err.param == "input[2].call_id" and "already answered" in err.message


def test_errors_in_the_stored_conversation_name_previous_response_id() -> None:
    call = {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    with pytest.raises(InvalidRequestError) as info:
        parse(input="next").chat_request((call,), LIMITS)
    assert info.value.param == "previous_response_id"


# ---- the store -------------------------------------------------------------------------


def _response(rid: str, text: str = "") -> dict[str, Any]:
    return {"id": rid, "object": "response", "text": text}


def test_store_evicts_the_least_recently_used_beyond_the_count() -> None:
    store = ResponseStore(max_responses=2, max_bytes=1 << 20)
    assert store.put(_response("a"), (), (), ())
    assert store.put(_response("b"), (), (), ())
    assert store.get("a") is not None  # a is now the most recent
    store.put(_response("c"), (), (), ())
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert len(store) == 2


def test_store_evicts_beyond_the_bytes_and_refuses_what_alone_is_too_big() -> None:
    store = ResponseStore(max_responses=100, max_bytes=400)
    for i in range(5):
        store.put(_response(f"r{i}", "x" * 100), (), (), ())
        assert store.size_bytes <= 400
    assert store.get("r0") is None and store.get("r4") is not None
    assert not store.put(_response("big", "x" * 500), (), (), ())
    assert store.get("big") is None


def test_store_keeps_the_conversation_and_deletes() -> None:
    store = ResponseStore(max_responses=10, max_bytes=1 << 20)
    h, i, o = ({"id": "h"},), ({"id": "i"},), ({"id": "o"},)
    store.put(_response("a"), h, i, o)
    entry = store.get("a")
    assert entry is not None and entry.conversation() == (*h, *i, *o)
    before = store.size_bytes
    assert store.delete("a") and not store.delete("a")
    assert store.size_bytes == 0 < before
