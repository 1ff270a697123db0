"""Round trip: random tools and calls -> rendered assistant turn -> parser -> the same calls."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgate.formats import get_format
from callgate.parsers import parse
from tests.harness import assistant_completion, calls_of, check_split_invariance, openai_tool_calls, tool_and_calls

FORMATS = ["dsml-v3.2", "dsml-v4"]
# Text a DSML string value cannot carry: its own closing tag, and the end of turn.
FORBIDDEN = {f: (get_format(f).markers.param_close, get_format(f).eos) for f in FORMATS}
PROSE = st.text(alphabet=st.sampled_from([*"abc xyz.,!?\n\t'\"&>/{}[]", "é", "漢", "🙂"]), max_size=30)

CONTEXT = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Go."}]


def _completion(fmt: str, tools: Any, calls: Any, content: str, reasoning: str, thinking: bool) -> str:
    turn: dict[str, Any] = {"role": "assistant", "tool_calls": openai_tool_calls(calls)}
    if content:
        turn["content"] = content
    if reasoning:
        turn["reasoning_content"] = reasoning
    return assistant_completion(fmt, CONTEXT, turn, tools, thinking=thinking, eos=get_format(fmt).eos)


def _check(fmt: str, data: st.DataObject, thinking: bool, *, splits: int) -> None:
    tools, calls = data.draw(tool_and_calls(forbidden=FORBIDDEN[fmt]))
    content, reasoning = data.draw(PROSE), data.draw(PROSE)
    text = _completion(fmt, tools, calls, content, reasoning, thinking)
    result = check_split_invariance(fmt, text, tools, thinking=thinking, splits=splits) if splits else None
    result = result or parse(fmt, text, tools, thinking=thinking)
    assert result.diagnostics == ()
    assert calls_of(result) == calls
    assert (result.content or "") == content
    assert (result.reasoning or "") == (reasoning if thinking else "")
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("thinking", [False, True])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(fmt: str, thinking: bool, data: st.DataObject) -> None:
    _check(fmt, data, thinking, splits=0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("thinking", [False, True])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_split_invariance(fmt: str, thinking: bool, data: st.DataObject) -> None:
    _check(fmt, data, thinking, splits=100)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_after_a_tool_result(fmt: str) -> None:
    """A second call after a result: the completion follows the result group's header."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    first = openai_tool_calls([("f", {"n": 1})])
    context = [
        *CONTEXT,
        {"role": "assistant", "tool_calls": first},
        {"role": "tool", "tool_call_id": "call_0", "content": "1"},
    ]
    turn = {"role": "assistant", "reasoning_content": "again", "tool_calls": openai_tool_calls([("f", {"n": 2})])}
    text = assistant_completion(fmt, context, turn, tools, thinking=True, eos=get_format(fmt).eos)
    result = parse(fmt, text, tools, thinking=True)
    assert result.diagnostics == ()
    assert calls_of(result) == [("f", {"n": 2})]
    assert result.reasoning == "again"
