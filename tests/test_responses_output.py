"""The Responses renderer on hand-made turn events: the stream's event sequence (each event
validated against the official `openai` types), the response object it adds up to, and the
non-streaming response of the same turn."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from callgate.serving.surfaces.responses_output import ResponseRender, render_response
from callgate.serving.turn_events import (
    AcceptedCall,
    CallsAccepted,
    ContentDelta,
    ReasoningDelta,
    RoundStart,
    TurnDone,
    TurnEvent,
    TurnUsage,
)

SKELETON = {
    "id": "resp_1",
    "created_at": 1,
    "model": "m",
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
}
USAGE = TurnUsage(prompt_tokens=10, completion_tokens=7, cached_tokens=4)
CALL = AcceptedCall("call_1", "get_weather", '{"city": "Oslo"}')
EVENT = TypeAdapter(ResponseStreamEvent)


def done(
    content: str = "", reasoning: str | None = None, calls: tuple[AcceptedCall, ...] = (), finish: Any = "stop"
) -> TurnDone:
    return TurnDone(finish, content, reasoning, calls, USAGE, {"format": "hermes", "candidates": []})


def stream(events: list[TurnEvent]) -> tuple[list[dict[str, Any]], ResponseRender]:
    render = ResponseRender(SKELETON, callgate={"ignored_tools": []}, count_tokens=lambda text: len(text.split()))
    out = render.opening()
    for ev in events:
        out += render.feed(ev)
    for event in out:
        EVENT.validate_python(event)  # every event parses as the official client's type
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out, render


def accumulated(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items a client builds from the deltas, as the official stream helper does."""
    items: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            items[e["output_index"]] = {**e["item"], "text": "", "arguments": e["item"].get("arguments", "")}
        elif e["type"] in ("response.output_text.delta", "response.reasoning_text.delta"):
            items[e["output_index"]]["text"] += e["delta"]
        elif e["type"] == "response.function_call_arguments.delta":
            items[e["output_index"]]["arguments"] += e["delta"]
    return [items[i] for i in sorted(items)]


def test_reasoning_text_and_calls_stream_as_items_in_order() -> None:
    turn = [
        RoundStart(0),
        ReasoningDelta("Need ", 0),
        ReasoningDelta("weather.", 0),
        ContentDelta("Checking", 0),
        ContentDelta(".", 0),
        CallsAccepted(0, (CALL,)),
        done("Checking.", "Need weather.", (CALL,), "tool_calls"),
    ]
    events, render = stream(turn)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    Response.model_validate(final)
    reasoning, message, call = final["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "Need weather."}
    ]
    assert message["content"][0]["text"] == "Checking." and message["status"] == "completed"
    assert call["id"].startswith("fc_") and (call["call_id"], call["name"], call["arguments"]) == (
        "call_1",
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert [a["text"] or a["arguments"] for a in accumulated(events)] == [
        "Need weather.",
        "Checking.",
        '{"city": "Oslo"}',
    ]
    assert final["status"] == "completed" and final["incomplete_details"] is None
    assert final["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 17,
    }
    assert final["callgate"] == {"format": "hermes", "candidates": [], "ignored_tools": []}
    assert render.response() == final
    # the non-streaming response of the same turn has the same items (ids aside)
    whole = render_response(SKELETON, turn[-1], callgate={"ignored_tools": []}, count_tokens=lambda t: len(t.split()))
    assert _without_ids(whole) == _without_ids(final)


def _without_ids(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "output": [{k: v for k, v in i.items() if k != "id"} for i in response["output"]]}


def test_output_cut_by_max_tokens_is_incomplete() -> None:
    events, _ = stream([RoundStart(0), ContentDelta("Oslo is", 0), done("Oslo is", finish="length")])
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"
    whole = render_response(SKELETON, done("Oslo is", finish="length"))
    assert whole["status"] == "incomplete" and whole["output"][0]["status"] == "incomplete"


def test_a_turn_that_wrote_nothing_has_one_empty_message() -> None:
    events, _ = stream([RoundStart(0), done()])
    [message] = events[-1]["response"]["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == ""
    assert render_response(SKELETON, done())["output"][0]["content"][0]["text"] == ""


def test_a_repair_rounds_text_stays_in_the_stream_but_not_in_the_answer() -> None:
    turn = [
        RoundStart(0),
        ContentDelta("First try.", 0),
        RoundStart(1),
        ContentDelta("Second.", 1),
        CallsAccepted(1, (CALL,)),
        done("Second.", calls=(CALL,), finish="tool_calls"),
    ]
    events, _ = stream(turn)
    streamed = events[-1]["response"]["output"]
    assert [i["type"] for i in streamed] == ["message", "message", "function_call"]
    assert [i["content"][0]["text"] for i in streamed[:2]] == ["First try.", "Second."]
    whole = render_response(SKELETON, turn[-1])  # type: ignore[arg-type]
    assert [i["type"] for i in whole["output"]] == ["message", "function_call"]


def test_a_failure_under_way_is_an_error_event_then_response_failed() -> None:
    render = ResponseRender(SKELETON, callgate={"ignored_tools": [{"index": 0, "type": "web_search"}]})
    events = render.opening() + render.feed(RoundStart(0)) + render.feed(ContentDelta("Hal", 0))
    events += render.failed("tool_call_rejected", "1 tool call(s) rejected", None, {"repairs": 1})
    error, failed = events[-2:]
    assert error == {
        "type": "error",
        "sequence_number": error["sequence_number"],
        "code": "tool_call_rejected",
        "message": "1 tool call(s) rejected",
        "param": None,
    }
    assert failed["type"] == "response.failed" and failed["sequence_number"] == error["sequence_number"] + 1
    response = failed["response"]
    assert response["status"] == "failed"
    assert response["error"] == {"code": "tool_call_rejected", "message": "1 tool call(s) rejected"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["callgate"] == {"repairs": 1, "ignored_tools": [{"index": 0, "type": "web_search"}]}


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_the_opening_events_carry_the_response_in_progress(finish: str) -> None:
    events, _ = stream([RoundStart(0), ContentDelta("x", 0), done("x", finish=finish)])
    created, in_progress = events[:2]
    for e in (created, in_progress):
        assert e["response"]["status"] == "in_progress" and e["response"]["output"] == []
        assert e["response"]["id"] == "resp_1" and "callgate" not in e["response"]
