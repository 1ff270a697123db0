"""hermes round trip: random tools and calls -> the rendered assistant turn -> parse ->
exactly the same calls (and content, reasoning) with no diagnostics, also when streamed."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.formats import HERMES
from callgate.parsers import parse
from tests.harness import assistant_completion, calls_of, check_split_invariance, openai_tool_calls, tool_and_calls

# Free text without `<`, so that no marker is neutralised on the way (tests/test_hermes_injection.py covers that).
PLAIN = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<"), max_size=30)


@st.composite
def turns(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], Any]:
    tools, calls = draw(tool_and_calls())
    context: list[dict[str, Any]] = [{"role": "user", "content": draw(PLAIN)}]
    if draw(st.booleans()):
        context.insert(0, {"role": "system", "content": draw(PLAIN)})
    turn: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), PLAIN))}
    turn["tool_calls"] = openai_tool_calls(calls)
    if draw(st.booleans()):
        turn["reasoning_content"] = draw(PLAIN)
    return tools, context, turn, calls


def _expected_text(text: str | None, *, reasoning: bool) -> str:
    text = text or ""
    return text.strip("\n") if reasoning else text.lstrip("\n")


@settings(max_examples=200, deadline=None)
@given(turns(), st.booleans())
def test_round_trip(case: Any, thinking: bool) -> None:
    tools, context, turn, calls = case
    completion = assistant_completion("hermes", context, turn, tools, thinking=thinking, eos=HERMES.eos)
    result = parse("hermes", completion, tools, thinking=thinking)
    assert result.diagnostics == ()
    assert calls_of(result) == calls
    assert (result.content or "") == _expected_text(turn["content"], reasoning=False)
    assert (result.reasoning or "") == _expected_text(turn.get("reasoning_content"), reasoning=True)
    for cand in result.candidates:
        assert completion[cand.span[0] : cand.span[1]] == cand.raw


@settings(max_examples=20, deadline=None)
@given(turns(), st.booleans())
def test_round_trip_streams_identically(case: Any, thinking: bool) -> None:
    tools, context, turn, _ = case
    completion = assistant_completion("hermes", context, turn, tools, thinking=thinking, eos=HERMES.eos)
    check_split_invariance("hermes", completion, tools, thinking=thinking, splits=100)


@settings(max_examples=50, deadline=None)
@given(PLAIN, st.booleans())
def test_plain_answer_round_trip(text: str, with_eos: bool) -> None:
    context = [{"role": "user", "content": "hi"}]
    completion = assistant_completion("hermes", context, {"role": "assistant", "content": text}, None, eos=HERMES.eos)
    if not with_eos:  # engines strip the end-of-turn token; that is not malformed
        completion = completion.removesuffix(HERMES.eos)
    result = parse("hermes", completion)
    assert result.diagnostics == ()
    assert result.candidates == ()
    assert (result.content or "") == text.lstrip("\n")
