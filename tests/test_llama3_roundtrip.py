"""llama3-json round trip: calls rendered into an assistant turn by the renderer are parsed back
by the JSON-family parser as exactly those calls, under any split of the text into deltas; and the
renderer reproduces the golden completions that were cut from the reference's own renders."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import load_jsonl
from tests.harness import (
    assistant_completion,
    calls_of,
    check_split_invariance,
    openai_tool_calls,
    tool_and_calls,
)

FORMAT = "llama3-json"
EOS = "<|eot_id|>"

DECODE = load_jsonl("llama3-json/decode.jsonl")
REFERENCE_TURNS = [c for c in DECODE if c.get("origin", "").startswith("reference") and "derived_from" in c]
REFERENCE_TURNS = [c for c in REFERENCE_TURNS if "rewritten" not in c["origin"]]

USER_TEXT = st.text(st.characters(codec="utf-8"), max_size=20)


@st.composite
def contexts(draw: st.DrawFn, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation the next assistant turn follows: optional system message, a user question,
    optionally an earlier call with its result and a follow-up question."""
    context: list[dict[str, Any]] = []
    if draw(st.booleans()):
        context.append({"role": "system", "content": draw(USER_TEXT)})
    context.append({"role": "user", "content": draw(USER_TEXT)})
    if draw(st.booleans()):
        fn = tools[0]["function"]
        call = {"id": "c0", "type": "function", "function": {"name": fn["name"], "arguments": "{}"}}
        context += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": draw(USER_TEXT)},
            {"role": "user", "content": draw(USER_TEXT)},
        ]
    return context


@st.composite
def call_turns(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    tools, calls = draw(tool_and_calls(max_calls=1))  # the format holds one call per turn
    return tools, draw(contexts(tools)), calls


def _completion(tools: Any, context: list[dict[str, Any]], calls: list[tuple[str, dict[str, Any]]]) -> str:
    turn = {"role": "assistant", "content": None, "tool_calls": openai_tool_calls(calls)}
    return assistant_completion(FORMAT, context, turn, tools, eos=EOS)


@settings(max_examples=120, deadline=None)
@given(case=call_turns())
def test_rendered_call_parses_back(case: Any) -> None:
    tools, context, calls = case
    text = _completion(tools, context, calls)
    result = check_split_invariance(FORMAT, text, tools, splits=5)
    assert result.diagnostics == ()
    assert calls_of(result) == calls
    assert result.content is None
    assert [c.raw for c in result.candidates] == [text.removesuffix(EOS)]


@settings(max_examples=25, deadline=None)
@given(case=call_turns())
def test_rendered_call_split_invariance_100(case: Any) -> None:
    tools, context, calls = case
    result = check_split_invariance(FORMAT, _completion(tools, context, calls), tools, splits=100)
    assert calls_of(result) == calls


PLAIN = st.text(st.characters(codec="utf-8", exclude_characters="{[<"), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(text=PLAIN.filter(lambda s: s.strip() != ""))
def test_rendered_text_turn_parses_back_as_content(text: str) -> None:
    turn = {"role": "assistant", "content": text}
    completion = assistant_completion(FORMAT, [{"role": "user", "content": "q"}], turn, None, eos=EOS)
    result = check_split_invariance(FORMAT, completion, None, splits=20)
    assert result.diagnostics == ()
    assert result.candidates == ()
    assert result.content == text.strip()


@pytest.mark.parametrize("case", REFERENCE_TURNS, ids=[c["id"] for c in REFERENCE_TURNS])
def test_renderer_reproduces_golden_completion(case: dict[str, Any]) -> None:
    derived = case["derived_from"]
    completion = assistant_completion(FORMAT, derived["context"], derived["message"], None, eos=EOS)
    if case["origin"] == "reference, end-of-turn token removed":
        completion = completion.removesuffix(EOS)
    assert completion == case["completion_text"]
    result = check_split_invariance(FORMAT, completion, case["tools"], splits=100)
    expected = case["expected"]
    assert result.diagnostics == ()
    assert (result.content or "") == expected["content"]
    assert calls_of(result) == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
