"""A 502 `model_output_error` can be debugged from its body: beside OpenAI's `error`, the
`callgate` block's `raw` holds the failed round's model output (bounded, with its offset),
which the diagnostics' spans index, and that round's candidates (never judged: verdict
null). Streamed or not. Through the real app, the real hermes parser, a scripted FakeEngine."""

from __future__ import annotations

import json
from typing import Any

from callgate.serving.surfaces.protocol_response import RAW_TEXT_MAX_CHARS, raw_output_dict
from callgate.types import ParseResult
from tests import test_server_app
from tests.test_server_app import ASK, MODEL, WEATHER, call_text, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture

DUPLICATE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a", "city": "b"}}\n</tool_call>'
BODY = {"model": MODEL, "messages": ASK, "tools": [WEATHER]}


def _error_event(text: str) -> dict[str, Any]:
    """The body of the terminal `event: error` of a streamed response."""
    lines = text.split("\n")
    i = lines.index("event: error")
    body: dict[str, Any] = json.loads(lines[i + 1][len("data: ") :])
    return body


def _failure(body: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """(the text the failure's diagnostic spans, the diagnostic, the whole raw text shown)."""
    assert set(body) == {"error", "callgate"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "model_output_error"
    code = body["error"]["code"]
    raw = body["callgate"]["raw"]
    diag = next(d for d in body["callgate"]["diagnostics"] if d["round"] == raw["round"] and d["code"] == code)
    start, end = (offset - raw["text_start"] for offset in diag["span"])
    return raw["text"][start:end], diag, raw["text"]


async def test_unparseable_call_body_carries_the_output_it_failed_on(make_harness: Any) -> None:
    h = make_harness([DUPLICATE, list(DUPLICATE)], settings=make_settings(constrained=False))
    resp = await h.post(BODY)
    assert resp.status_code == 502
    spanned, diag, text = _failure(resp.json())
    assert (diag["code"], spanned, text) == ("duplicate_key", '"city"', DUPLICATE)
    assert resp.json()["callgate"]["raw"] | {"text": None} == {
        "round": 0,
        "text": None,
        "text_start": 0,
        "text_chars": len(DUPLICATE),
        "content": None,
        "reasoning": None,
        "calls": [],
    }
    # streaming stops generating at the failure: the output shown ends there
    body = _error_event((await h.post({**BODY, "stream": True})).text)
    spanned, diag, text = _failure(body)
    assert (diag["code"], spanned) == ("duplicate_key", '"city"')
    assert DUPLICATE.startswith(text) and text.endswith('"city"')
    assert body["callgate"]["raw"]["text_chars"] == len(text)


async def test_a_failed_repair_round_shows_its_own_output_and_candidates(make_harness: Any) -> None:
    rejected = call_text("get_weather", {"city": 5})
    second = "Retrying. " + call_text("get_weather", {"city": "Oslo"}) + "\n" + DUPLICATE
    h = make_harness([rejected, second], settings=make_settings(constrained=False))
    resp = await h.post(BODY)
    assert resp.status_code == 502
    body = resp.json()
    spanned, diag, text = _failure(body)
    assert (spanned, text, diag["round"], body["callgate"]["raw"]["round"]) == ('"city"', second, 1, 1)
    rounds = [(c["round"], c["arguments"], (c["verdict"] or {}).get("verdict")) for c in body["callgate"]["candidates"]]
    assert rounds == [(0, {"city": 5}, "rejected"), (1, {"city": "Oslo"}, None)]


async def test_a_long_output_is_shown_as_a_bounded_window_around_the_failure(make_harness: Any) -> None:
    before, after = "x" * (RAW_TEXT_MAX_CHARS + 1000), "y" * RAW_TEXT_MAX_CHARS
    reply = [before, "\n" + DUPLICATE + "\n", after]  # one token each for the fake
    h = make_harness([reply], settings=make_settings(constrained=False))
    resp = await h.post({**BODY, "tool_choice": "auto"})
    assert resp.status_code == 502
    body = resp.json()
    spanned, diag, text = _failure(body)
    raw = body["callgate"]["raw"]
    assert spanned == '"city"' and len(text) == RAW_TEXT_MAX_CHARS
    assert raw["text_chars"] == len("".join(reply)) and raw["text_start"] > 0
    assert diag["span"][0] - raw["text_start"] == RAW_TEXT_MAX_CHARS // 2  # centred on the failure


def test_the_window_stays_inside_the_output() -> None:
    result = ParseResult(None, None, (), ())
    text = "".join(chr(ord("a") + i % 26) for i in range(RAW_TEXT_MAX_CHARS * 2))
    for focus, start in [
        (0, 0),
        (10, 0),
        (RAW_TEXT_MAX_CHARS, RAW_TEXT_MAX_CHARS // 2),
        (len(text), RAW_TEXT_MAX_CHARS),
    ]:
        raw = raw_output_dict(0, text, result, focus)
        assert (raw["text_start"], raw["text"]) == (start, text[start : start + RAW_TEXT_MAX_CHARS])
    assert raw_output_dict(2, "short", result, 99)["text"] == "short"
