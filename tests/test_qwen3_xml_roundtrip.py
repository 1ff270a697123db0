"""qwen3-xml round trip (render an assistant turn, parse it back) and robustness on any text."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgate.formats import Qwen3XmlMarkers, get_format
from callgate.parsers import parse, sequential_call_ids, stream_parser
from callgate.templates.qwen3_xml import neutralise
from callgate.types import ParseResult
from tests.harness import assistant_completion, calls_of, check_split_invariance, openai_tool_calls, tool_and_calls

FORMAT = "qwen3-xml"
FMT = get_format(FORMAT)
M = FMT.markers_as(Qwen3XmlMarkers)
# Value texts the format cannot write (the renderer refuses them); "<|" covers every control token.
FORBIDDEN = (M.parameter_close, M.parameter_open, M.function_close, M.call_open, M.call_close, "<|")
CONTEXT = [{"role": "user", "content": "Do it."}]
CONTENT = st.one_of(st.none(), st.text(max_size=30))


def _turn(calls: list[tuple[str, dict[str, Any]]], content: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": openai_tool_calls(calls)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_and_calls(forbidden=FORBIDDEN), CONTENT)
def test_round_trip_calls_and_content(
    tools_calls: tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]], content: str | None
) -> None:
    tools, calls = tools_calls
    text = assistant_completion(FORMAT, CONTEXT, _turn(calls, content), tools, eos=FMT.eos)
    result = check_split_invariance(FORMAT, text, tools, splits=100)
    assert result.diagnostics == ()
    assert calls_of(result) == calls
    expected_content = neutralise(FMT, (content or "").strip())
    assert (result.content or "") == expected_content
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60))
def test_plain_answer_round_trips_untrimmed(content: str) -> None:
    turn = {"role": "assistant", "content": content}
    text = assistant_completion(FORMAT, CONTEXT, turn, None, eos=FMT.eos)
    result = check_split_invariance(FORMAT, text, None, splits=20)
    assert result.diagnostics == ()
    assert result.candidates == ()
    assert (result.content or "") == neutralise(FMT, content)


# ---- any text: never raises, same result for every split, no candidate from a bad block ----

_PIECES = st.sampled_from(
    [
        M.call_open,
        M.call_close,
        M.function_open,
        M.function_close,
        M.parameter_open,
        M.parameter_close,
        M.think_open,
        M.think_close,
        FMT.eos,
        "\n",
        ">",
        "get_weather>",
        "location>",
        "days>",
        "Paris",
        "12",
        "[1, 2]",
        "True",
        " ",
        "<",
    ]
)
_NOISY_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=40).map("".join)
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}, "days": {"type": ["integer", "null"]}},
            },
        },
    }
]


def _assert_consistent(text: str, result: ParseResult) -> None:
    bad_blocks = {
        d.span[0] for d in result.diagnostics if d.code not in {"unknown_tool", "text_between_calls", "trailing_text"}
    }
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw
        assert cand.span[0] not in bad_blocks
    for d in result.diagnostics:
        assert 0 <= d.span[0] <= d.span[1] <= len(text) + 1


@settings(max_examples=300, deadline=None)
@given(_NOISY_TEXT, st.booleans())
def test_any_text_parses_consistently(text: str, thinking: bool) -> None:
    result = check_split_invariance(FORMAT, text, _TOOLS, thinking=thinking, splits=10)
    _assert_consistent(text, result)


@settings(max_examples=100, deadline=None)
@given(_NOISY_TEXT)
def test_any_text_without_tools(text: str) -> None:
    result = parse(FORMAT, text, None, call_ids=sequential_call_ids())
    _assert_consistent(text, result)


def test_hold_back_stays_bounded() -> None:
    """feed never keeps more than one marker's worth of text, whatever the output's length."""
    value = ("line <b>\n" * 2000) + "end"
    text = (
        "Let me write it.\n\n<tool_call>\n<function=write_file>\n<parameter=content>\n"
        + value
        + "\n</parameter>\n</function>\n</tool_call>"
        + FMT.eos
    )
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}}]
    parser = stream_parser(FORMAT, tools, call_ids=sequential_call_ids())
    longest = max(len(m) for m in (*M.texts(), FMT.eos))
    held_max = 0
    for ch in text:
        parser.feed(ch)
        held_max = max(held_max, len(parser._held))
    parser.finish()
    assert held_max <= longest
    (cand,) = parser.result().candidates
    assert cand.arguments == {"content": value}
