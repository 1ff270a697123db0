"""mistral round trip: calls rendered into an assistant turn by the renderer are parsed back by the
JSON-family parser as exactly those calls, with their native ids, under any split of the text into
deltas; and the renderer reproduces the golden completions cut from mistral-common's own encoding."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.errors import TemplateError
from tests.conftest import load_jsonl
from tests.harness import (
    assistant_completion,
    calls_of,
    check_split_invariance,
    openai_tool_calls,
    tool_and_calls,
)

FORMAT = "mistral"
EOS = "</s>"

DECODE = load_jsonl("mistral/decode.jsonl")
REFERENCE_TURNS = [c for c in DECODE if c.get("origin", "").startswith("reference") and "derived_from" in c]
REFERENCE_TURNS = [c for c in REFERENCE_TURNS if "rewritten" not in c["origin"]]
# mistral-common's assistant-message encoder writes calls without ids, but its request check
# (which the renderer follows) refuses them: such a turn cannot be rendered in a conversation.
NO_IDS = "mistral_dec_vis_no_call_ids"

TEXT = st.text(st.characters(codec="utf-8"), max_size=20)
CALL_IDS = st.from_regex(r"[A-Za-z0-9]{9}", fullmatch=True)


def _with_ids(calls: list[tuple[str, dict[str, Any]]], ids: list[str]) -> list[dict[str, Any]]:
    return [{**c, "id": i} for c, i in zip(openai_tool_calls(calls), ids, strict=True)]


@st.composite
def call_turns(draw: st.DrawFn) -> tuple[Any, list[dict[str, Any]], list[tuple[str, dict[str, Any]]], list[str]]:
    """(tools, context, calls, ids): a context with optional system message and an optional earlier
    call/result exchange, then an assistant turn with one to three calls."""
    tools, calls = draw(tool_and_calls(max_calls=3))
    context: list[dict[str, Any]] = []
    if draw(st.booleans()):
        context.append({"role": "system", "content": draw(TEXT)})
    context.append({"role": "user", "content": draw(TEXT)})
    ids = draw(st.lists(CALL_IDS, min_size=len(calls) + 1, max_size=len(calls) + 1, unique=True))
    if draw(st.booleans()):
        earlier = _with_ids(calls[:1], ids[-1:])
        context += [
            {"role": "assistant", "content": None, "tool_calls": earlier},
            {"role": "tool", "tool_call_id": ids[-1], "content": draw(TEXT)},
        ]
    return tools, context, calls, ids[: len(calls)]


def _completion(tools: Any, context: list[dict[str, Any]], calls: Any, ids: list[str]) -> str:
    turn = {"role": "assistant", "content": None, "tool_calls": _with_ids(calls, ids)}
    return assistant_completion(FORMAT, context, turn, tools, eos=EOS)


@settings(max_examples=120, deadline=None)
@given(case=call_turns())
def test_rendered_calls_parse_back_with_their_ids(case: Any) -> None:
    tools, context, calls, ids = case
    text = _completion(tools, context, calls, ids)
    result = check_split_invariance(FORMAT, text, tools, splits=5)
    assert result.diagnostics == ()
    assert calls_of(result) == calls
    assert [c.call_id for c in result.candidates] == ids
    assert result.content is None


@settings(max_examples=25, deadline=None)
@given(case=call_turns())
def test_rendered_calls_split_invariance_100(case: Any) -> None:
    tools, context, calls, ids = case
    result = check_split_invariance(FORMAT, _completion(tools, context, calls, ids), tools, splits=100)
    assert calls_of(result) == calls


PLAIN = st.text(st.characters(codec="utf-8", exclude_characters="[<"), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(text=PLAIN.filter(lambda s: s.rstrip(" ") != ""))
def test_rendered_text_turn_parses_back_as_content(text: str) -> None:
    turn = {"role": "assistant", "content": text}
    completion = assistant_completion(FORMAT, [{"role": "user", "content": "q"}], turn, None, eos=EOS)
    result = check_split_invariance(FORMAT, completion, None, splits=20)
    assert result.diagnostics == ()
    assert result.candidates == ()
    assert result.content == text.rstrip(" ")


@pytest.mark.parametrize("case", REFERENCE_TURNS, ids=[c["id"] for c in REFERENCE_TURNS])
def test_renderer_reproduces_golden_completion(case: dict[str, Any]) -> None:
    message = case["derived_from"]["message"]
    context = [{"role": "user", "content": "q"}]
    if case["id"] == NO_IDS:
        with pytest.raises(TemplateError, match=re.escape("messages[1].tool_calls[0].id")):
            assistant_completion(FORMAT, context, message, None, eos=EOS)
        return
    completion = assistant_completion(FORMAT, context, message, None, eos=EOS)
    if case["origin"] == "reference, end-of-turn token removed":
        completion = completion.removesuffix(EOS)
    assert completion == case["completion_text"]
    result = check_split_invariance(FORMAT, completion, case["tools"], splits=100)
    expected = case["expected"]
    assert result.diagnostics == ()
    assert (result.content or "") == expected["content"]
    assert calls_of(result) == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
    assert [c.call_id for c in result.candidates] == [c["id"] for c in expected["tool_calls"]]
