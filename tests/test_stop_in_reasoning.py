"""A client stop string that matches inside a reasoning block ends the turn there: the
reasoning so far, no content, finish_reason "stop" — as `max_tokens` there ends it with
"length" — never a 502 `missing_think_end`. Through the real app (real parsers, the
StopFilter, hermes' real grammar) with a scripted FakeEngine, streamed and not, with and
without tools, for hermes and dsml-v4."""

from __future__ import annotations

from typing import Any

import pytest

from tests import test_server_app
from tests.harness import streamed_text
from tests.test_server_app import ASK, MODEL, WEATHER, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture

FORMATS = ["hermes", "dsml-v4"]
# the stop string arrives split over two deltas; the reasoning would close after it
REPLY = ["Cold ", "north ", "ST", "OP then", " more.", "</think>", "\n\nOslo is cold."]
TOOLS: list[dict[str, Any]] = [{}, {"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "none"}]


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASK, "max_tokens": 64, "chat_template_kwargs": {"enable_thinking": True}, **kw}


def _harness(make: Any, fmt: str, replies: list[Any]) -> Any:
    # FakeTokenizer's byte vocabulary compiles hermes' grammars; dsml's are tested elsewhere
    return make(replies, settings=make_settings(format=fmt, constrained=fmt == "hermes"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tools", TOOLS, ids=["no-tools", "auto", "choice-none"])
async def test_stop_inside_reasoning_ends_the_turn_with_the_reasoning(
    make_harness: Any, fmt: str, tools: dict[str, Any]
) -> None:
    h = _harness(make_harness, fmt, [REPLY, REPLY])
    body = _body(stop=["STOP"], **tools)
    resp = await h.post(body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    message = choice["message"]
    assert (message.get("reasoning_content"), message["content"], choice["finish_reason"]) == (
        "Cold north ",
        "",
        "stop",
    )
    assert "tool_calls" not in message and resp.json()["callgate"]["diagnostics"] == []
    assert streamed_text(await h.events(body)) == ("", "Cold north ", ["stop"])
    # callgate applied the stop string, and freed the slot of the generation it ended
    assert [r.sampling.stop for r in h.engine.requests] == [(), ()]
    assert len(h.engine.aborted) == 2


@pytest.mark.parametrize("fmt", FORMATS)
async def test_stop_after_the_reasoning_cuts_only_the_content(make_harness: Any, fmt: str) -> None:
    h = _harness(make_harness, fmt, [REPLY, REPLY])
    body = _body(stop=[" cold"])
    resp = await h.post(body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    # (dsml keeps the blank line after `</think>` in its content, hermes drops it)
    assert choice["message"]["reasoning_content"] == "Cold north STOP then more."
    assert (choice["message"]["content"].lstrip("\n"), choice["finish_reason"]) == ("Oslo is", "stop")
    content, reasoning, finishes = streamed_text(await h.events(body))
    assert (reasoning, content, finishes) == ("Cold north STOP then more.", choice["message"]["content"], ["stop"])


async def test_stop_inside_a_block_qwen3_opened_unasked(make_harness: Any) -> None:
    """Without the switch Qwen3 opens its own reasoning block; a stop string in it too."""
    reply = ["<think>", "\nCold ", "north ", "STOP", "</think>", "\n\nOslo."]
    h = _harness(make_harness, "hermes", [reply, reply])
    body = {"model": MODEL, "messages": ASK, "max_tokens": 64, "stop": ["STOP"]}
    resp = await h.post(body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert (choice["message"]["reasoning_content"], choice["message"]["content"]) == ("Cold north ", "")
    assert choice["finish_reason"] == "stop"
    assert streamed_text(await h.events(body)) == ("", "Cold north ", ["stop"])


@pytest.mark.parametrize("fmt", FORMATS)
async def test_stop_inside_reasoning_under_tool_choice_required_is_still_a_502(make_harness: Any, fmt: str) -> None:
    """A call was required and none was written (as with max_tokens there)."""
    h = _harness(make_harness, fmt, [REPLY])
    # a budget that holds a call on the byte vocabulary (64 bytes cannot: that is a 400)
    resp = await h.post(_body(stop=["STOP"], tools=[WEATHER], tool_choice="required", max_tokens=256))
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["type"] == "model_output_error"
