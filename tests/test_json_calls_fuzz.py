"""JSON family: arbitrary model text never raises, streams identically under any split,
and keeps the candidate invariants (raw is its span; no candidate overlaps a malformed span;
arguments are a JSON object)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.formats import get_format
from callgate.parsers import parse
from tests.harness import check_split_invariance

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
JSON_BITS = ['{"name": "f", ', '"arguments": ', '"parameters": ', '{"a": [1, "x"]}', "}", "]", "[", '"id": "Abc123xyz"',
             ", ", "\n", " ", "'", '"', "\\", "NaN", "1e999", "é", "\ud83d"]  # fmt: skip


WHOLE_CALLS = {
    "hermes": [
        '<tool_call>\n{"name": "f", "arguments": {"a": [1, "</tool_call>"]}}\n</tool_call>',
        '<tool_call>\n{"arguments": {}, "name": "g"}\n</tool_call>',
        "\n",
    ],
    "llama3-json": ['{"name": "f", "parameters": {"a": "\\u00e9"}}', '<|python_tag|>{"name": "g", "parameters": {}}'],
    "mistral": [
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "Abc123xyz"}, {"name": "g", "arguments": {}}]'
    ],
}


def _pieces(format: str) -> list[str]:
    fmt = get_format(format)
    markers = [fmt.eos, fmt.call_trigger, *fmt.special_tokens[:12], *fmt.markers.texts()]
    markers += [m for m in (fmt.reasoning_open, fmt.reasoning_close) if m]
    short = [m for m in markers if len(m) < 40]
    return short + [m[: len(m) // 2] for m in short if len(m) > 1] + JSON_BITS + WHOLE_CALLS[format] * 8


def texts(format: str) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(_pieces(format)), max_size=14).map("".join)


def _check(format: str, text: str, thinking: bool) -> None:
    result = check_split_invariance(format, text, TOOLS, thinking=thinking, splits=8)
    again = parse(format, text, TOOLS, thinking=thinking)
    assert [d.code for d in again.diagnostics] == [d.code for d in result.diagnostics]
    bad = [d.span for d in result.diagnostics if d.code != "unknown_tool"]
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw
        assert isinstance(cand.arguments, dict)
        assert all(cand.span[1] <= s or cand.span[0] >= e for s, e in bad if e > s)


@settings(max_examples=300, deadline=None)
@given(texts("hermes"), st.booleans())
def test_hermes_fuzz(text: str, thinking: bool) -> None:
    _check("hermes", text, thinking)


@settings(max_examples=300, deadline=None)
@given(texts("llama3-json"))
def test_llama3_fuzz(text: str) -> None:
    _check("llama3-json", text, False)


@settings(max_examples=300, deadline=None)
@given(texts("mistral"))
def test_mistral_fuzz(text: str) -> None:
    _check("mistral", text, False)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.sampled_from(["hermes", "llama3-json", "mistral"]))
def test_any_text(text: str, format: str) -> None:
    _check(format, text, False)
