"""Stop sequences never cut a tool call: where calls may be written they end only the text
outside calls (serving/stop_filter.py over the real hermes parser), through the real app
with a scripted FakeEngine; plain text keeps the engine's own stop strings."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate import parsers
from callgate.serving.stop_filter import StopFilter
from callgate.types import Event, TextDelta, coalesce
from tests import test_server_app
from tests.harness import random_split
from tests.test_server_app import ASK, MODEL, WEATHER, call_text, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture
OSLO = call_text("get_weather", {"city": "Oslo"})


def _body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASK, "tools": [WEATHER], "max_tokens": 200, **kw}


def _streamed(events: list[str]) -> tuple[str, list[dict[str, Any]], list[str | None]]:
    """(content, tool calls, finish reasons) reassembled from the `data:` payloads."""
    assert events[-1] == "[DONE]"
    content, calls, finishes = "", {}, []
    for raw in events[:-1]:
        chunk = json.loads(raw)
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            content += choice["delta"].get("content") or ""
            for tc in choice["delta"].get("tool_calls", ()):
                call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                call["name"] += tc.get("function", {}).get("name", "")
                call["arguments"] += tc.get("function", {}).get("arguments", "")
            finishes.append(choice["finish_reason"])
    return content, [calls[i] for i in sorted(calls)], [f for f in finishes if f]


@pytest.mark.parametrize("stop", [["\n"], ["Oslo", "}"], "<tool_call>"])
async def test_required_call_is_not_cut_by_stop_strings(make_harness: Any, stop: Any) -> None:
    h = make_harness([OSLO, [OSLO[i : i + 3] for i in range(0, len(OSLO), 3)]])
    resp = await h.post(_body(tool_choice="required", stop=stop))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert choice["finish_reason"] == "tool_calls"
    content, calls, finishes = _streamed(await h.events(_body(tool_choice="required", stop=stop)))
    assert (content, calls, finishes) == ("", [call["function"]], ["tool_calls"])
    assert [r.sampling.stop for r in h.engine.requests] == [(), ()]


async def test_auto_stop_ends_content_but_not_a_call(make_harness: Any) -> None:
    reply = ["It is", " sun", "ny.\nBye", " now.", OSLO]
    h = make_harness(["Checking. " + OSLO, reply, reply])
    resp = await h.post(_body(stop=["Oslo"]))
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    assert message["content"] == "Checking. " and len(message["tool_calls"]) == 1
    # a stop string in content ends the output there, across deltas, streamed or not
    resp = await h.post(_body(stop=["sunny", "\n"]))
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "It is "} and choice["finish_reason"] == "stop"
    assert resp.json()["callgate"]["candidates"] == []
    content, calls, finishes = _streamed(await h.events(_body(stop=["sunny", "\n"])))
    assert (content, calls, finishes) == ("It is ", [], ["stop"])
    assert [r.sampling.stop for r in h.engine.requests] == [(), (), ()]
    assert len(h.engine.aborted) == 2  # the generation ended at the stop string, its slot freed


@pytest.mark.parametrize(("fmt", "engine_stops"), [("llama3-json", True), ("hermes", False)])
async def test_plain_text_keeps_the_engine_stop_strings(make_harness: Any, fmt: str, engine_stops: bool) -> None:
    """Where no call and no reasoning block can be written the engine applies the stop
    strings; a format with a reasoning block (hermes: Qwen3 opens one unasked) applies
    them itself (test_stop_in_reasoning.py), with the same content."""
    h = make_harness(["Oslo\nis cold.", "Oslo\nis cold."], settings=make_settings(format=fmt, constrained=False))
    for body in (_body(tools=None, stop=["\n"]), _body(tool_choice="none", stop=["\n"])):
        resp = await h.post(body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"] == "Oslo"
    assert [r.sampling.stop for r in h.engine.requests] == [("\n",) if engine_stops else ()] * 2


# ---- the filter over the real parser ------------------------------------------------------


def _filtered(pieces: list[str], stop: Sequence[str]) -> tuple[list[Event], Any, bool]:
    parser = parsers.stream_parser("hermes", [WEATHER], call_ids=parsers.sequential_call_ids())
    stops = StopFilter(stop)
    events: list[Event] = []
    for piece in pieces:
        events += stops.feed(parser.feed(piece))
        if stops.stopped:
            break
    events += stops.finish([] if stops.stopped else parser.finish())
    return events, (stops.result() if stops.stopped else parser.result()), stops.stopped


@settings(max_examples=200, deadline=None)
@given(
    content=st.text(alphabet="ab\n }{O", min_size=1, max_size=12).filter(lambda t: t.strip() and "{" not in t),
    stop=st.lists(st.sampled_from(["\n", "}", "Oslo", "b b", "a\nb", "{", "<tool"]), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_filter_cuts_content_at_the_first_stop_and_never_a_call(content: str, stop: list[str], seed: int) -> None:
    text = content + OSLO
    whole = parsers.parse("hermes", text, [WEATHER], call_ids=parsers.sequential_call_ids())
    # the newline before a call is its markup, not content
    assert whole.content is not None and content.startswith(whole.content) and len(whole.candidates) == 1
    hits = [i for i in (whole.content.find(s) for s in stop) if i >= 0]
    events, result, stopped = _filtered(random_split(text, random.Random(seed)), stop)
    if hits:
        cut = whole.content[: min(hits)]
        assert stopped and result.content == (cut or None) and result.candidates == ()
        assert coalesce(events) == ([TextDelta(cut)] if cut else [])
    else:
        assert not stopped and result == whole
        assert coalesce(events) == coalesce(_filtered([text], ())[0])
