"""parsers/outside_markup.py: an answer that is wholly a call written as JSON, outside the
format's call markup, is found (name and span in the output), in every format; content that
merely contains JSON, or JSON that is not a call to a declared tool, is not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.formats import FORMATS, get_format
from callgate.parsers import parse
from callgate.parsers.outside_markup import CODE, OutsideCall, find_call_outside_markup

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}}},
]
ALL_FORMATS = sorted(FORMATS)
ARGS = {"city": "Paris", "unit": "c"}
# The shapes every format reads as a call written outside its markup.
SHAPES = {
    "name+arguments": {"name": "get_weather", "arguments": ARGS},
    "name+parameters": {"name": "get_weather", "parameters": ARGS},
    "openai tool_call": {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(ARGS)},
    },
    "openai function object": {"function": {"name": "get_weather", "arguments": ARGS}},
    "function+arguments": {"function": "get_weather", "arguments": ARGS},
    "function+parameters": {"function": "get_weather", "parameters": ARGS},
}


def find(format: str, content_text: str, *, tools: Any = TOOLS, truncated: bool = False) -> OutsideCall | None:
    output = content_text + get_format(format).eos
    return find_call_outside_markup(format, output, parse(format, output, tools), tools, truncated=truncated)


def fenced(value: Any, lang: str = "json") -> str:
    return f"```{lang}\n{json.dumps(value, indent=2)}\n```"


def reaches_content(format: str, text: str) -> bool:
    """Whether the format's parser reads `text` as content (llama3-json reads a leading JSON
    object as its own call attempt, so a bare object never is content there)."""
    result = parse(format, text + get_format(format).eos, TOOLS)
    return result.content is not None and not result.diagnostics and not result.candidates


@pytest.mark.parametrize("format", ALL_FORMATS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_whole_fenced_call_is_found_in_every_format(format: str, shape: str) -> None:
    text = fenced(SHAPES[shape])
    found = find(format, text)
    assert found is not None and found.name == "get_weather"
    assert found.diagnostic.code == CODE == "call_outside_markup"
    start, end = found.diagnostic.span
    assert (text + get_format(format).eos)[start:end] == json.dumps(SHAPES[shape], indent=2)
    assert "get_weather" in found.diagnostic.message and str(start) in found.diagnostic.message


@pytest.mark.parametrize("format", ALL_FORMATS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_whole_bare_call_is_found_where_it_is_content(format: str, shape: str) -> None:
    text = "\n" + json.dumps(SHAPES[shape]) + "\n"
    if not reaches_content(format, text):
        assert format == "llama3-json"  # its leading object is a call attempt of its own
        return
    found = find(format, text)
    assert found is not None and found.name == "get_weather"
    assert text[found.diagnostic.span[0] : found.diagnostic.span[1]] == json.dumps(SHAPES[shape])


@pytest.mark.parametrize("format", ["hermes", "dsml-v4", "dsml-v3.2"])
def test_the_span_indexes_the_output_after_reasoning(format: str) -> None:
    fmt = get_format(format)
    call = json.dumps(SHAPES["name+arguments"])
    # the prompt opened the reasoning block (as a thinking request's does)
    output = f"I should look it up {call}{fmt.reasoning_close}\n\n{call}{fmt.eos}"
    result = parse(format, output, TOOLS, thinking=True)
    found = find_call_outside_markup(format, output, result, TOOLS)
    assert found is not None and found.diagnostic.span[0] > output.index(str(fmt.reasoning_close))
    assert output[found.diagnostic.span[0] : found.diagnostic.span[1]] == call


def test_a_call_only_in_the_reasoning_is_not_an_answer() -> None:
    call = json.dumps(SHAPES["name+arguments"])
    output = f"<think>{call}</think>\n\nIt is sunny.<|im_end|>"
    assert find_call_outside_markup("hermes", output, parse("hermes", output, TOOLS), TOOLS) is None


def test_mistral_reads_its_own_call_list_without_the_marker() -> None:
    listed = [{"name": "get_weather", "arguments": ARGS, "id": "abcDEF123"}]
    found = find("mistral", json.dumps(listed))
    assert found is not None and found.name == "get_weather"
    assert find("hermes", json.dumps(listed)) is None  # a list is no hermes call body
    assert find("mistral", json.dumps(listed * 2)) is None  # two calls: not one tool to ask for


NOT_CALLS = {
    "text before": "Call this:\n" + fenced(SHAPES["name+arguments"]),
    "text after": fenced(SHAPES["name+arguments"]) + "\nThat would fetch the weather.",
    "explained inline": 'You could send {"name": "get_weather", "arguments": {"city": "Paris"}} to the API.',
    "two fences": fenced(SHAPES["name+arguments"]) + "\n" + fenced(SHAPES["name+parameters"]),
    "two values": json.dumps(SHAPES["name+arguments"]) + "\n" + json.dumps(SHAPES["name+arguments"]),
    "undeclared tool": fenced({"name": "get_time", "arguments": {}}),
    "arguments not an object": fenced({"name": "get_weather", "arguments": "Paris"}),
    "arguments string not an object": fenced({"function": {"name": "get_weather", "arguments": "[1]"}}),
    "extra key": fenced({"name": "get_weather", "arguments": ARGS, "confidence": 0.9}),
    "both argument keys": fenced({"name": "get_weather", "arguments": ARGS, "parameters": ARGS}),
    "type not function": fenced({"type": "tool", "name": "get_weather", "arguments": ARGS}),
    "empty name": fenced({"name": "", "arguments": {}}),
    "a JSON answer": fenced({"city": "Paris", "temperature_c": 21}),
    "single quotes": "```json\n{'name': 'get_weather', 'arguments': {}}\n```",
    "trailing comma": '```json\n{"name": "get_weather", "arguments": {},}\n```',
    "duplicate key": '```json\n{"name": "get_weather", "name": "get_weather", "arguments": {}}\n```',
    "unclosed fence": '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "cut JSON": '```json\n{"name": "get_weather", "arguments": {"city": "Par',
    "fence on one line": '```{"name": "get_weather", "arguments": {}}```',
}


@pytest.mark.parametrize("format", ALL_FORMATS)
@pytest.mark.parametrize("case", sorted(NOT_CALLS))
def test_content_that_merely_holds_json_is_not_a_call(format: str, case: str) -> None:
    assert find(format, NOT_CALLS[case]) is None


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_no_declared_tools_no_call(format: str) -> None:
    text = fenced(SHAPES["name+arguments"])
    assert find(format, text, tools=None) is None
    assert find(format, text, tools=[]) is None


def test_an_output_with_a_real_call_has_no_call_outside_markup() -> None:
    call = json.dumps(SHAPES["name+arguments"])
    output = f"{call}\n<tool_call>\n{call}\n</tool_call><|im_end|>"
    result = parse("hermes", output, TOOLS)
    assert result.candidates and find_call_outside_markup("hermes", output, result, TOOLS) is None


@pytest.mark.parametrize("format", ALL_FORMATS)
def test_a_call_cut_by_max_tokens_is_found_only_when_truncated(format: str) -> None:
    """The issue's second reply: a fenced call that max_tokens cut inside its arguments."""
    text = '```json\n{\n  "name": "list_files",\n  "arguments": {\n    "path": "sr'
    found = find(format, text, truncated=True)
    assert found is not None and found.name == "list_files"
    assert find(format, text) is None
    for early in ('```json\n{\n  "name": "list_fi', '```json\n{\n  "name": "list_files", "arguments": "x'):
        assert find(format, early, truncated=True) is None  # the name or the object not begun
    assert find(format, '```json\n{"name": "nope", "arguments": {"a', truncated=True) is None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL_FORMATS), st.text(max_size=120), st.booleans())
def test_never_raises_and_spans_stay_in_the_output(format: str, text: str, truncated: bool) -> None:
    for candidate in (text, "```json\n" + text, '{"name": "get_weather", "arguments": ' + text):
        found = find(format, candidate, truncated=truncated)
        if found is not None:
            start, end = found.diagnostic.span
            assert 0 <= start <= end <= len(candidate) + len(get_format(format).eos)
            assert found.name in {"get_weather", "list_files"}
