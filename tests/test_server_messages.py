"""The official `anthropic` client against a real uvicorn server (loopback) backed by a
scripted FakeEngine: /v1/messages answers and streams with tools, a tool_result loop,
count_tokens, every stop_reason, stream = non-stream in three formats, and each error shape
with its status, Anthropic type and retry header."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import anthropic
import httpx
import pytest

from callgate.formats import get_format
from callgate.serving.engines.engine import GenerationRequest
from callgate.serving.engines.fake_engine import FakeReply
from tests.harness import assistant_completion
from tests.test_server_app import MODEL, WEATHER, call_text
from tests.test_server_openai import Server, serve

__all__ = ["serve"]  # the fixture, used by name

TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": WEATHER["function"]["parameters"],
    }
]
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
CALL = call_text("get_weather", {"city": "Oslo", "days": 3})


_OPEN: list[Any] = []  # every client a test made, closed when it ends (no socket left to the GC)


def _client(server: Server, api_key: str = "none", **kw: Any) -> Any:
    client = anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=20, **kw)
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _blocks(message: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def test_a_tool_call_is_a_tool_use_block_streamed_or_not(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["Let me look.\n", CALL])
    client = _client(server)
    done = client.messages.create(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS)
    assert done.id.startswith("msg_") and done.type == "message" and done.role == "assistant"
    assert done.stop_reason == "tool_use" and done.model == MODEL
    text, use = done.content
    assert text.type == "text" and text.text == "Let me look."
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert (use.name, use.input) == ("get_weather", {"city": "Oslo", "days": 3})
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    assert done.model_extra["callgate"]["candidates"][0]["verdict"]["verdict"] == "accepted"
    with client.messages.stream(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS) as stream:
        kinds = [ev.type for ev in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert streamed.stop_reason == "tool_use"
    ids = [b.id for b in streamed.content if b.type == "tool_use"]
    assert len(ids) == 1 and ids[0].startswith("toolu_")
    assert [{k: v for k, v in b.items() if k != "id"} for b in _blocks(streamed)] == [
        {k: v for k, v in b.items() if k != "id"} for b in _blocks(done)
    ]


def test_message_start_splits_the_input_as_message_delta_does(serve: Callable[..., Server]) -> None:
    """QA's case: on a prompt the prefix cache holds, message_start reported all of it as
    input_tokens and message_delta 5 + 16 cache reads. message_start now comes once the
    engine has read the prompt (as Anthropic's), with the same split."""
    server = serve(respond=lambda req: ["Sunny", " in Oslo."])
    body = {"model": MODEL, "max_tokens": 50, "messages": ASK, "stream": True}
    for _ in range(2):  # the second request reads the first's blocks from the cache
        resp = httpx.post(server.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    payloads = {
        e.split("\n")[0].removeprefix("event: "): json.loads(e.split("\n")[1][6:])
        for e in resp.text.strip().split("\n\n")
    }
    start, end = payloads["message_start"]["message"]["usage"], payloads["message_delta"]["usage"]
    assert end["cache_read_input_tokens"] > 0
    split = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    assert {k: start[k] for k in split} == {k: end[k] for k in split}


def test_the_raw_stream_is_anthropics_event_sequence(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["Hi", " there", "\n", CALL])
    body = {"model": MODEL, "max_tokens": 100, "messages": ASK, "tools": TOOLS, "stream": True}
    resp = httpx.post(server.url + "/v1/messages?beta=true", json=body, headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [
        (e.split("\n")[0].removeprefix("event: "), json.loads(e.split("\n")[1].removeprefix("data: ")))
        for e in resp.text.strip().split("\n\n")
    ]
    names = [name for name, _ in events]
    collapsed = [n for i, n in enumerate(names) if n != "content_block_delta" or names[i - 1] != n]
    assert collapsed == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    texts = [p["delta"]["text"] for n, p in events if n == "content_block_delta" and p["index"] == 0]
    assert "".join(texts) == "Hi there"
    events = [(n, p) for i, (n, p) in enumerate(events) if n != "content_block_delta" or names[i - 1] != n]
    assert all(payload["type"] == name for name, payload in events)
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[5][1]["index"] == 1 and events[5][1]["content_block"]["type"] == "tool_use"
    assert events[6][1]["delta"]["type"] == "input_json_delta"
    assert json.loads(events[6][1]["delta"]["partial_json"]) == {"city": "Oslo", "days": 3}
    delta = events[8][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0 and delta["callgate"]["format"] == "hermes"


def test_a_tool_result_loop_round_trips_the_tool_use_id(serve: Callable[..., Server]) -> None:
    prompts: list[str] = []

    def respond(req: GenerationRequest) -> Any:
        prompts.append(req.prompt)
        return [CALL] if len(prompts) == 1 else ["It is 3 degrees."]

    server = serve(respond=respond)
    client = _client(server)
    first = client.messages.create(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS)
    [use] = [b for b in first.content if b.type == "tool_use"]
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "3 C, wind"}]},
                {"type": "text", "text": "Thanks, and?"},
            ],
        },
    ]
    second = client.messages.create(model=MODEL, max_tokens=100, messages=history, tools=TOOLS)
    assert second.stop_reason == "end_turn" and second.content[0].text == "It is 3 degrees."
    assert "3 C, wind" in prompts[1] and "Thanks, and?" in prompts[1]
    assert prompts[1].index('"city": "Oslo"') < prompts[1].index("3 C, wind") < prompts[1].index("Thanks, and?")


def test_a_failed_tool_result_is_marked_for_the_model(serve: Callable[..., Server]) -> None:
    prompts: list[str] = []
    server = serve(respond=lambda req: prompts.append(req.prompt) or ["ok"])
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout", "is_error": True}],
        },
    ]
    _client(server).messages.create(model=MODEL, max_tokens=10, messages=history, tools=TOOLS)
    assert "Error: timeout" in prompts[0]


def test_mistral_call_ids_survive_the_round_trip(serve: Callable[..., Server]) -> None:
    prompts: list[str] = []
    call = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "aB3dE5fG7"}]</s>'

    def respond(req: GenerationRequest) -> Any:
        prompts.append(req.prompt)
        return [call] if len(prompts) == 1 else ["done</s>"]

    server = serve(respond=respond, format="mistral")
    client = _client(server)
    first = client.messages.create(model=MODEL, max_tokens=100, messages=ASK, tools=TOOLS)
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.id == "toolu_aB3dE5fG7"
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3 C"}]},
    ]
    client.messages.create(model=MODEL, max_tokens=100, messages=history, tools=TOOLS)
    assert prompts[1].count("aB3dE5fG7") == 2  # the call and its result, as the model wrote the id


def test_count_tokens_is_the_rendered_prompts_length(serve: Callable[..., Server]) -> None:
    seen: list[int] = []
    server = serve(respond=lambda req: seen.append(len(req.prompt_ids or ())) or ["ok"])
    client = _client(server)
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, tools=TOOLS, system="Be brief.")
    plain = client.messages.count_tokens(model=MODEL, messages=ASK)
    assert counted.input_tokens > plain.input_tokens > 0
    done = client.messages.create(model=MODEL, max_tokens=10, messages=ASK, tools=TOOLS, system="Be brief.")
    assert seen == [counted.input_tokens] and done.usage.input_tokens == counted.input_tokens


@pytest.mark.parametrize(
    ("reply", "extra", "reason", "sequence", "text"),
    [
        (["Cold", " today."], {}, "end_turn", None, "Cold today."),
        (FakeReply(("a", "b", "c", "d", "e")), {"max_tokens": 3}, "max_tokens", None, "abc"),
        (["Cold", " STOP", " more"], {"stop_sequences": ["STOP"]}, "stop_sequence", "STOP", "Cold "),
        ([CALL], {"tools": TOOLS}, "tool_use", None, None),
    ],
)
def test_stop_reasons(
    serve: Callable[..., Server],
    reply: Any,
    extra: Mapping[str, Any],
    reason: str,
    sequence: str | None,
    text: str | None,
) -> None:
    server = serve(replies=[reply, reply])
    client = _client(server)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "messages": ASK, **extra}
    done = client.messages.create(**body)
    assert (done.stop_reason, done.stop_sequence) == (reason, sequence)
    if text is not None:
        assert done.content[0].text == text
    with client.messages.stream(**body) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == (reason, sequence)


def test_thinking_is_a_thinking_block_first(serve: Callable[..., Server]) -> None:
    reply = ["Oslo is", " north.", "\n</think>\n\n", "Cold."]
    server = serve(replies=[reply, reply])
    client = _client(server)
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 2000,
        "messages": ASK,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    done = client.messages.create(**body)
    assert [b.type for b in done.content] == ["thinking", "text"]
    assert done.content[0].thinking.strip() == "Oslo is north." and done.content[1].text == "Cold."
    with client.messages.stream(**body) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == ["thinking", "text"]
    assert streamed.content[0].thinking == done.content[0].thinking and streamed.content[1].text == "Cold."


# ---- stream = non-stream, per format ------------------------------------------------------------

_FORMAT_TURNS: list[dict[str, Any]] = [
    {"role": "assistant", "content": "Sunny, 20 C."},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        ],
    },
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome", "days": 2}'},
            },
        ],
    },
]


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-xml", "dsml-v4"])
@pytest.mark.parametrize("turn", range(len(_FORMAT_TURNS)))
def test_streamed_message_equals_the_message(serve: Callable[..., Server], fmt: str, turn: int) -> None:
    text = assistant_completion(fmt, ASK, _FORMAT_TURNS[turn], [WEATHER], eos=get_format(fmt).eos)
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]  # markers split across deltas
    server = serve(replies=[pieces, pieces], format=fmt)
    client = _client(server)
    done = client.messages.create(model=MODEL, max_tokens=300, messages=ASK, tools=TOOLS)
    with client.messages.stream(model=MODEL, max_tokens=300, messages=ASK, tools=TOOLS) as stream:
        streamed = stream.get_final_message()
    strip = lambda m: [{k: v for k, v in b.items() if k != "id"} for b in _blocks(m)]  # noqa: E731
    assert strip(streamed) == strip(done)
    assert streamed.stop_reason == done.stop_reason == ("tool_use" if turn else "end_turn")
    expected_calls = [json.loads(c["function"]["arguments"]) for c in _FORMAT_TURNS[turn].get("tool_calls", [])]
    assert [b.input for b in done.content if b.type == "tool_use"] == expected_calls


# ---- errors -------------------------------------------------------------------------------------


def _error(resp: httpx.Response) -> tuple[int, str]:
    body = resp.json()
    assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}
    return resp.status_code, body["error"]["type"]


def test_error_shapes_and_retry_headers(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["ok"])
    url = server.url + "/v1/messages"
    ok = {"model": MODEL, "max_tokens": 10, "messages": ASK}
    missing = httpx.post(url, json={"model": MODEL, "messages": ASK})
    assert _error(missing) == (400, "invalid_request_error") and missing.headers["x-should-retry"] == "false"
    assert "max_tokens" in missing.json()["error"]["message"]
    assert _error(httpx.post(url, content=b"{not json")) == (400, "invalid_request_error")
    image = {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}
    assert _error(httpx.post(url, json={**ok, "messages": [image]})) == (400, "invalid_request_error")
    unknown = httpx.post(url, json={**ok, "model": "claude-sonnet-4-5"})
    assert _error(unknown) == (404, "not_found_error") and unknown.headers["x-should-retry"] == "false"
    assert _error(httpx.get(server.url + "/v1/messages/nowhere")) == (404, "not_found_error")
    assert _error(httpx.post(url, content=b"x" * (4 * 1024 * 1024 + 1))) == (413, "request_too_large")
    openai_shape = httpx.post(server.url + "/v1/chat/completions", json={"model": "nope", "messages": ASK})
    assert openai_shape.status_code == 404 and "type" not in openai_shape.json()  # OpenAI's routes keep theirs
    client = _client(server)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL, max_tokens=10, messages=ASK, tool_choice={"type": "tool", "name": "nope"}, tools=TOOLS
        )


def test_api_key_in_x_api_key_or_bearer(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: ["ok"], api_key="sekrit")
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(server, api_key="wrong").messages.create(model=MODEL, max_tokens=10, messages=ASK)
    assert info.value.status_code == 401 and info.value.body["error"]["type"] == "authentication_error"
    assert info.value.response.headers["x-should-retry"] == "false"
    assert (
        _client(server, api_key="sekrit").messages.create(model=MODEL, max_tokens=10, messages=ASK).content[0].text
        == "ok"
    )
    bearer = _client(server, api_key=None, auth_token="sekrit")
    assert bearer.messages.create(model=MODEL, max_tokens=10, messages=ASK).content[0].text == "ok"
    counted = httpx.post(
        server.url + "/v1/messages/count_tokens",
        json={"model": MODEL, "messages": ASK},
        headers={"x-api-key": "sekrit"},
    )
    assert counted.status_code == 200


def test_queue_full_is_429_rate_limit_error_with_retry_after(serve: Callable[..., Server]) -> None:
    slow = FakeReply(tuple("slow " * 100), token_delay_s=0.01)
    server = serve(respond=lambda req: slow, max_num_seqs=1, max_queue=1)
    client = _client(server)
    held = [client.messages.create(model=MODEL, max_tokens=200, messages=ASK, stream=True) for _ in range(2)]
    busy = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "max_tokens": 10, "messages": ASK})
    assert _error(busy) == (429, "rate_limit_error") and busy.headers["retry-after"] == "1"
    assert busy.headers.get("x-should-retry", "true") == "true"  # retryable: the SDK may retry it
    for stream in held:
        stream.close()


def test_a_rejected_call_is_an_error_event_mid_stream(serve: Callable[..., Server]) -> None:
    bad = call_text("get_weather", {"city": 7})
    server = serve(replies=[[bad], [bad], [bad], [bad]], max_repairs=0)
    body = {"model": MODEL, "max_tokens": 50, "messages": ASK, "tools": TOOLS}
    rejected = httpx.post(server.url + "/v1/messages", json=body)
    assert _error(rejected) == (422, "invalid_request_error")
    assert rejected.json()["error"]["code"] == "tool_call_rejected" and rejected.json()["callgate"]["candidates"]
    streamed = httpx.post(server.url + "/v1/messages", json={**body, "stream": True})
    assert streamed.status_code == 200
    last = streamed.text.strip().split("\n\n")[-1].split("\n")
    assert last[0] == "event: error"
    error = json.loads(last[1].removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["code"] == "tool_call_rejected"
    assert "tool_use" not in streamed.text  # a rejected call never appears


def test_validator_down_fails_closed_with_a_retryable_503(serve: Callable[..., Server]) -> None:
    server = serve(respond=lambda req: [CALL])
    server.validator.down = True
    body = {"model": MODEL, "max_tokens": 100, "messages": ASK, "tools": TOOLS}
    down = httpx.post(server.url + "/v1/messages", json=body)
    assert _error(down) == (503, "overloaded_error") and down.headers["retry-after"] == "1"
    assert "tool_use" not in down.text
    streamed = httpx.post(server.url + "/v1/messages", json={**body, "stream": True})
    assert streamed.text.strip().split("\n\n")[-1].startswith("event: error")
    assert "tool_use" not in streamed.text


def test_current_sdk_fields_and_older_sampling_fields(serve: Callable[..., Server]) -> None:
    """Server tools are left out and named; adaptive thinking leaves the format's default;
    output_config.format constrains the answer; temperature / top_p / top_k (older
    clients' fields) reach the engine."""
    answer = '{"city": "Oslo"}'
    server = serve(replies=[[answer]])
    client = _client(server)
    web_search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    done = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=ASK,
        tools=[*TOOLS, web_search],
        thinking={"type": "adaptive"},
        output_config={"format": {"type": "json_schema", "schema": WEATHER["function"]["parameters"]}},
        extra_body={"temperature": 0.0, "top_p": 0.5, "top_k": 7},
    )
    assert done.content[0].text == answer and done.stop_reason == "end_turn"
    assert done.model_extra["callgate"]["ignored_tools"] == ["web_search"]
    [request] = server.engine.requests
    assert "web_search" not in request.prompt and "get_weather" in request.prompt
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k) == (0.0, 0.5, 7)
    assert request.constraint is not None  # the json_schema format is decoded under a grammar
    with pytest.raises(anthropic.BadRequestError):  # naming a tool callgate left out
        client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=ASK,
            tools=[web_search],
            tool_choice={"type": "tool", "name": "web_search"},
        )


def test_the_anthropic_client_lists_and_retrieves_models(serve: Callable[..., Server]) -> None:
    """QA's case: /v1/models answered an Anthropic client in OpenAI's shape (its 404 too).
    Anthropic's SDK sends `anthropic-version`: the model list, one model, the 404 and the
    x-api-key check take Anthropic's shape; OpenAI's client still gets OpenAI's."""
    server = serve(respond=lambda req: ["ok"], api_key="sekrit")
    client = _client(server, api_key="sekrit")
    page = client.models.list()
    [listed] = page.data
    assert (listed.type, listed.id, listed.display_name) == ("model", MODEL, MODEL)
    assert listed.created_at.tzinfo is not None and page.has_more is False
    one = client.models.retrieve(MODEL)
    assert (one.type, one.id, one.created_at) == ("model", MODEL, listed.created_at)
    with pytest.raises(anthropic.NotFoundError) as info:
        client.models.retrieve("nope")
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _client(server, api_key="wrong").models.list()
    assert denied.value.body["error"]["type"] == "authentication_error"
    assert [m.id for m in server.client("sekrit").models.list()] == [MODEL]  # OpenAI's shape for OpenAI's client
    assert server.client("sekrit").models.retrieve(MODEL).object == "model"
