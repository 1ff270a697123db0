"""`/v1/responses` through the official `openai` client against a real uvicorn server backed
by a scripted FakeEngine: function calls, streams, the function_call_output loop,
previous_response_id chaining, GET / DELETE / input_items, text.format, hosted tools left
out, errors in OpenAI's shape, and stream = non-stream for hermes, qwen3-xml and dsml-v4."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pydantic
import pytest

from callgate.formats import get_format
from callgate.serving.engines.fake_engine import FakeReply
from tests import test_server_openai
from tests.harness import assistant_completion
from tests.test_server_app import MODEL, WEATHER, call_text
from tests.test_server_openai import Server

serve = test_server_openai.serve  # the real-server fixture


@pytest.fixture(autouse=True)
def _clients_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every client a test opens is closed after it, so no pooled connection is left for the
    garbage collector to find during a later test (a ResourceWarning, an error here)."""
    opened: list[Any] = []
    open_client = Server.client

    def client(self: Server, *args: Any, **kw: Any) -> Any:
        opened.append(open_client(self, *args, **kw))
        return opened[-1]

    monkeypatch.setattr(Server, "client", client)
    yield
    for c in opened:
        c.close()


TOOL = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]  # the flat Responses shape
CALL = call_text("get_weather", {"city": "Oslo", "days": 3})
ASK = "Weather in Oslo?"


def pieces(text: str, n: int = 4) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


def without_ids(output: list[Any]) -> list[Any]:
    """The output items without their ids and call ids (fresh per response) and the stream helper's
    `parsed` / `parsed_arguments` additions."""
    return [_plain(item.model_dump()) for item in output]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k not in ("id", "call_id", "parsed", "parsed_arguments")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def test_a_function_call_is_a_function_call_item(serve: Callable[..., Server]) -> None:
    server = serve(replies=[CALL])
    r = server.client().responses.create(model=MODEL, input=ASK, tools=[TOOL, {"type": "web_search_preview"}])
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    [call] = r.output
    assert call.type == "function_call" and call.id is not None and call.id.startswith("fc_")
    assert (call.name, json.loads(call.arguments), call.status) == (
        "get_weather",
        {"city": "Oslo", "days": 3},
        "completed",
    )
    assert call.call_id.startswith("call_")
    assert (
        r.usage is not None and r.usage.output_tokens == len(CALL) + 1 and r.usage.total_tokens > r.usage.output_tokens
    )
    extra = r.model_extra or {}
    [candidate] = extra["callgate"]["candidates"]
    assert candidate["verdict"]["verdict"] == "accepted" and candidate["call_id"] == call.call_id
    assert extra["callgate"]["ignored_tools"] == [{"index": 1, "type": "web_search_preview"}]
    prompt = server.engine.requests[0].prompt
    assert "get_weather" in prompt and "web_search" not in prompt and ASK in prompt


def test_the_stream_adds_up_to_the_non_streamed_response(serve: Callable[..., Server]) -> None:
    text = "<think>\nCold there?\n</think>\n\nChecking." + CALL
    server = serve(replies=[text, pieces(text)])
    client = server.client()
    whole = client.responses.create(model=MODEL, input=ASK, tools=[TOOL])
    with client.responses.stream(model=MODEL, input=ASK, tools=[TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [i.type for i in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output_text == "Checking."
    assert without_ids(final.output) == without_ids(whole.output)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "<tool_call>" not in "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_two_turn_loop_with_function_call_output(serve: Callable[..., Server]) -> None:
    server = serve(replies=[CALL, "Oslo is at -3 C."])
    client = server.client()
    first = client.responses.create(model=MODEL, input=ASK, tools=[TOOL], store=False)
    [call] = first.output
    history: list[Any] = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True)]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "-3 C"})
    second = client.responses.create(model=MODEL, input=history, tools=[TOOL], store=False)
    assert second.output_text == "Oslo is at -3 C." and second.status == "completed"
    prompt = server.engine.requests[1].prompt
    assert prompt.index(ASK) < prompt.index('"city": "Oslo"') < prompt.index("-3 C")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)  # store=False: not kept


def test_previous_response_id_continues_the_conversation(serve: Callable[..., Server]) -> None:
    server = serve(replies=[CALL, "It is -3 C."])
    client = server.client()
    first = client.responses.create(model=MODEL, input=ASK, tools=[TOOL], instructions="Be brief.")
    [call] = first.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "-3 C"}
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input=[output], tools=[TOOL])
    assert second.output_text == "It is -3 C." and second.previous_response_id == first.id
    prompt = server.engine.requests[1].prompt
    assert ASK in prompt and '"city": "Oslo"' in prompt and "-3 C" in prompt
    assert "Be brief." not in prompt  # instructions are not carried over, as OpenAI documents
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, previous_response_id="resp_unknown", input="Hi")
    assert info.value.body == {
        "message": "Previous response with id 'resp_unknown' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }


def test_an_evicted_response_cannot_be_continued(serve: Callable[..., Server]) -> None:
    server = serve(replies=["One.", "Two.", "Three."], responses_store_max=1)
    client = server.client()
    first = client.responses.create(model=MODEL, input="1")
    client.responses.create(model=MODEL, input="2")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, previous_response_id=first.id, input="3")


def test_get_input_items_and_delete(serve: Callable[..., Server]) -> None:
    server = serve(replies=["Hello."])
    client = server.client()
    made = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Hi"}], metadata={"k": "v"})
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump() and got.metadata == {"k": "v"}
    [item] = list(client.responses.input_items.list(made.id))
    assert item.type == "message" and item.role == "user" and item.content[0].text == "Hi"  # type: ignore[union-attr]
    deleted = httpx.delete(f"{server.url}/v1/responses/{made.id}")
    assert deleted.status_code == 200 and deleted.json() == {"id": made.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    assert httpx.delete(f"{server.url}/v1/responses/{made.id}").status_code == 404


class Forecast(pydantic.BaseModel):
    city: str
    celsius: int


def test_text_format_json_schema(serve: Callable[..., Server]) -> None:
    answer = '{"city": "Oslo", "celsius": -3}'
    server = serve(replies=[answer])
    parsed = server.client().responses.parse(model=MODEL, input=ASK, text_format=Forecast)
    assert parsed.output_parsed == Forecast(city="Oslo", celsius=-3)
    sent = server.engine.requests[0]
    assert sent.constraint is not None  # the schema is enforced by the grammar


def test_max_output_tokens_cut_is_incomplete(serve: Callable[..., Server]) -> None:
    server = serve(replies=[FakeReply(("Oslo ", "is ", "very"), finish_reason="length")])
    r = server.client().responses.create(model=MODEL, input=ASK, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output_text == "Oslo is very"
    assert server.engine.requests[0].sampling.max_tokens == 3


def test_tool_choice_and_sampling_reach_the_engine(serve: Callable[..., Server]) -> None:
    server = serve(replies=[CALL])
    r = server.client().responses.create(
        model=MODEL,
        input=ASK,
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0.3,
        top_p=0.5,
        parallel_tool_calls=False,
    )
    assert r.output[0].type == "function_call" and r.tool_choice.type == "function"  # type: ignore[union-attr]
    sampling = server.engine.requests[0].sampling
    assert (sampling.temperature, sampling.top_p) == (0.3, 0.5) and server.engine.requests[0].constraint is not None


# ---- errors ---------------------------------------------------------------------------------


def test_bad_requests_are_400s_naming_the_field(serve: Callable[..., Server]) -> None:
    server = serve()
    client = server.client()
    bad = [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input=bad)
    assert info.value.body["param"] == "input[0].call_id" and info.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model=MODEL, input="x", tools=[{"type": "web_search"}], tool_choice={"type": "web_search"}
        )
    assert info.value.body["param"] == "tool_choice.type"  # type: ignore[index]
    resp = httpx.post(f"{server.url}/v1/responses", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="other-model", input="x")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert server.in_flight() == 0


def test_a_rejected_call_never_appears(serve: Callable[..., Server]) -> None:
    bad = call_text("get_weather", {"city": 7})  # wrong type: rejected, repaired once, rejected again
    server = serve(replies=[bad, bad, bad, bad], max_repairs=1)
    client = server.client()
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(model=MODEL, input=ASK, tools=[TOOL, {"type": "file_search"}])
    assert info.value.status_code == 422
    body = info.value.response.json()
    assert body["error"]["type"] == "tool_call_rejected" and body["callgate"]["repairs"] == 1
    assert body["callgate"]["ignored_tools"] == [{"index": 1, "type": "file_search"}]
    with client.responses.stream(model=MODEL, input=ASK, tools=[TOOL]) as stream:
        events = list(stream)
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert not any(e.type == "response.output_item.added" and e.item.type == "function_call" for e in events)  # type: ignore[union-attr]
    failed = events[-1].response  # type: ignore[union-attr]
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "tool_call_rejected"
    assert server.in_flight() == 0


# ---- stream = non-stream in three formats -------------------------------------------------


def _completion(fmt: str) -> str:
    tools = [WEATHER]
    turn = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        ],
    }
    eos = get_format(fmt).eos
    return assistant_completion(fmt, [{"role": "user", "content": ASK}], turn, tools, eos=eos).removesuffix(eos)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-xml", "dsml-v4"])
def test_stream_equals_non_stream(serve: Callable[..., Server], fmt: str) -> None:
    text = _completion(fmt)
    server = serve(replies=[text, pieces(text, 3)], format=fmt, constrained=fmt == "hermes")
    client = server.client()
    whole = client.responses.create(model=MODEL, input=ASK, tools=[TOOL])
    with client.responses.stream(model=MODEL, input=ASK, tools=[TOOL]) as stream:
        final = stream.get_final_response()
    assert [i.type for i in whole.output][-1] == "function_call"
    call = whole.output[-1]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo"}
    assert whole.output_text.strip() == "Checking."
    assert without_ids(final.output) == without_ids(whole.output)
    assert final.status == whole.status == "completed"


def test_input_items_pages_and_refuses_bad_parameters(serve: Callable[..., Server]) -> None:
    server = serve(replies=["Hello."])
    client = server.client()
    made = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": "A"}, {"role": "user", "content": "B"}]
    )
    url = f"{server.url}/v1/responses/{made.id}/input_items"
    first = httpx.get(url, params={"limit": 1, "order": "asc"}).json()
    assert [i["content"][0]["text"] for i in first["data"]] == ["A"] and first["has_more"] is True
    rest = httpx.get(url, params={"order": "asc", "after": first["last_id"]}).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["B"] and rest["has_more"] is False
    assert [i.content[0].text for i in client.responses.input_items.list(made.id)] == ["B", "A"]  # type: ignore[union-attr]
    for params, param in (({"limit": 0}, "limit"), ({"limit": "x"}, "limit"), ({"order": "up"}, "order")):
        resp = httpx.get(url, params=params)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    missing = httpx.get(f"{server.url}/v1/responses/resp_nope/input_items")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
