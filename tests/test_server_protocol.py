"""The wire: request validation turns bad input into 400/413 naming the field; good input
into a frozen ChatRequest ready for the templates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.errors import InvalidRequestError, PayloadTooLargeError
from callgate.serving.settings import Limits
from callgate.serving.surfaces.anthropic_request import parse_messages_request
from callgate.serving.surfaces.protocol import ChatRequest, chunk_dict, parse_chat_request
from callgate.serving.surfaces.protocol_completions import parse_completion_request
from callgate.serving.surfaces.responses_request import parse_responses_request

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}


def _parse(body: dict[str, Any], limits: Limits | None = None) -> ChatRequest:
    return parse_chat_request(json.dumps(body).encode(), limits or Limits())


def _error(body: dict[str, Any] | bytes, limits: Limits | None = None) -> InvalidRequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request(raw, limits or Limits())
    return info.value


def test_minimal_request_gets_openai_defaults() -> None:
    req = _parse({"messages": [{"role": "user", "content": "hi"}]})
    assert req.messages == ({"role": "user", "content": "hi"},)
    assert (req.tools, req.tool_choice, req.stream, req.max_tokens) == (None, "none", False, None)
    assert (req.temperature, req.top_p, req.stop, req.thinking) == (1.0, 1.0, (), False)


def test_full_request_is_carried_over() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    req = _parse(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
            "max_completion_tokens": 64,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 7,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
            "response_format": {"type": "json_object"},
            "user": "u1",
            "reasoning_effort": "high",
            "chat_template_kwargs": {"enable_thinking": True},
            "callgate": {"max_repairs": 2, "quick": ["title"]},
        }
    )
    assert req.messages[1]["content"] == "ab"
    assert req.messages[3]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert req.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert req.schema_of("get_weather") == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert req.schema_of("nope") is None
    assert (req.parallel_tool_calls, req.max_tokens, req.temperature, req.top_p, req.seed) == (False, 64, 0.0, 0.5, 7)
    assert (req.stop, req.stream, req.include_usage, req.user) == (("END",), True, True, "u1")
    assert req.response_format == {"type": "json_object"}
    assert (req.reasoning_effort, req.thinking, req.max_repairs, req.quick) == ("high", True, 2, ("title",))


def test_tools_default_tool_choice_to_auto() -> None:
    req = _parse({"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]})
    assert req.tool_choice == "auto"


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", ""),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", ""),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature", ""),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, "max_tokens", ""),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", ""),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n", "n=1"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream", ""),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 2**70}, "seed", ""),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "top_p", ""),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "needs content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
            "",
        ),
    ],
)
def test_wrong_fields_name_the_field(body: dict[str, Any], param: str, fragment: str) -> None:
    err = _error(body)
    assert err.status == 400 and err.error_type == "invalid_request_error"
    assert err.param is not None and err.param.startswith(param), err.param
    assert param in err.message and fragment in err.message


def test_malformed_json_and_non_object() -> None:
    assert _error(b'{"messages": [').code == "invalid_json"
    assert _error(b"\xff\xfe").code == "invalid_json"
    assert _error(b"").code == "invalid_json"
    assert _error(b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}").code == "invalid_json"
    assert "JSON object" in _error(b"[1, 2]").message
    assert "JSON object" in _error(b"null").message


def test_invalid_tool_schema_is_rejected_with_its_location() -> None:
    bad = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}},
    }
    err = _error({"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER, bad]})
    assert err.param == "tools[1].function.parameters"
    assert "Draft 2020-12" in err.message and "/properties/a/type" in err.message


def test_tool_schema_limits() -> None:
    deep: dict[str, Any] = {"type": "object"}
    node = deep
    for _ in range(10):
        node["properties"] = {"x": {"type": "object"}}
        node = node["properties"]["x"]
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [tool]}
    assert "nests" in _error(body, Limits(max_schema_depth=8)).message
    assert "bytes" in _error(body, Limits(max_schema_bytes=100)).message
    assert _parse(body).tools is not None
    assert "tools" in _error({**body, "tools": [WEATHER, tool]}, Limits(max_tools=1)).message


def test_duplicate_and_non_object_tools() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER, WEATHER]}
    assert "duplicate" in _error(body).message
    scalar = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    assert "'object'" in _error({**body, "tools": [scalar]}).message


def test_tool_choice_must_name_a_declared_tool() -> None:
    choice = {"type": "function", "function": {"name": "launch_rockets"}}
    err = _error({"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER], "tool_choice": choice})
    assert err.param == "tool_choice.function.name" and "launch_rockets" in err.message
    err = _error({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})
    assert err.param == "tool_choice"
    assert _error({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}).param == "tool_choice"


def test_tool_message_must_answer_a_call() -> None:
    orphan = {
        "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "r"}]
    }
    err = _error(orphan)
    assert err.param == "messages[1].tool_call_id" and "call_9" in err.message
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    twice = [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "r"},
        {"role": "tool", "tool_call_id": "call_1", "content": "again"},
    ]
    assert _error({"messages": twice}).param == "messages[2].tool_call_id"
    assert _error({"messages": [twice[1]]}).param == "messages[0].tool_call_id"
    no_id = {"role": "tool", "content": "r"}
    assert _error({"messages": [twice[0], no_id]}).param == "messages[1].tool_call_id"


def test_assistant_arguments_must_be_a_json_object_string() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    err = _error({"messages": [{"role": "assistant", "tool_calls": [call]}]})
    assert err.param == "messages[0].tool_calls[0].function.arguments"
    assert _error({"messages": [{"role": "assistant"}]}).param == "messages[0].content"


def test_limits_on_messages_tokens_and_stops() -> None:
    msgs = [{"role": "user", "content": "x"}] * 3
    assert _error({"messages": msgs}, Limits(max_messages=2)).param == "messages"
    assert _error({"messages": msgs, "max_tokens": 10}, Limits(max_tokens=5)).param == "max_tokens"
    assert _error({"messages": msgs, "stop": ["a", "b", "c"]}, Limits(max_stop_sequences=2)).param == "stop"
    assert _error({"messages": msgs, "stop": [""]}).param == "stop"
    assert _error({"messages": msgs, "callgate": {"max_repairs": -1}}).param == "callgate.max_repairs"


def test_oversized_body_is_413() -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    with pytest.raises(PayloadTooLargeError) as info:
        parse_chat_request(body, Limits(max_body_bytes=1000))
    assert info.value.status == 413


def test_response_format_schema_is_checked() -> None:
    body = {"messages": [{"role": "user", "content": "x"}]}
    bad = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "nope"}}}
    assert _error({**body, "response_format": bad}).param == "response_format"
    good = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}
    assert _parse({**body, "response_format": good}).response_format == good
    assert _parse({**body, "response_format": {"type": "text"}}).response_format is None


def test_usage_only_chunk_has_empty_choices() -> None:
    chunk = chunk_dict(completion_id="c", created=1, model="m", delta=None, usage={"total_tokens": 3})
    assert chunk["choices"] == [] and chunk["usage"] == {"total_tokens": 3}
    assert chunk["object"] == "chat.completion.chunk"


def test_strict_tools_are_known_by_name() -> None:
    strict = {"type": "function", "function": {"name": "s", "strict": True, "parameters": {"type": "object"}}}
    bare = {"type": "function", "function": {"name": "b"}}
    req = _parse({"messages": [{"role": "user", "content": "x"}], "tools": [strict, bare, WEATHER]})
    assert (req.is_strict("s"), req.is_strict("b"), req.is_strict("get_weather"), req.is_strict("zz")) == (
        True,
        False,
        False,
        False,
    )
    assert req.schema_of("b") == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (parse_chat_request, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
        (parse_chat_request, b'{"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}', "top_p"),
        (
            lambda body, limits: parse_messages_request(body, limits, "hermes"),
            b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            "temperature",
        ),
        (parse_responses_request, b'{"input": "hi", "temperature": Infinity}', "temperature"),
        (parse_completion_request, b'{"prompt": "hi", "top_p": NaN}', "top_p"),
    ],
)
def test_nan_and_infinity_are_refused_as_not_finite(parse: Any, body: bytes, param: str) -> None:
    """QA's case: NaN temperature was refused as 'less than or equal to 2'."""
    with pytest.raises(InvalidRequestError) as info:
        parse(body, Limits())
    assert info.value.param == param and "finite number" in str(info.value)
