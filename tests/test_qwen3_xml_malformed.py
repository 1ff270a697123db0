"""qwen3-xml malformed corpus: each bad completion gives its diagnostic code, never content
made of a call block, never a candidate from a block with a diagnostic."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import check_split_invariance

FORMAT = "qwen3-xml"
EOS = "<|im_end|>"


def _tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


TOOLS = [
    _tool("get_weather", {"location": {"type": "string"}, "unit": {"type": "string"}, "days": {"type": "integer"}}),
    _tool("set_thermostat", {"room": {"type": "string"}, "target_c": {"type": "number"}, "eco": {"type": "boolean"}}),
    _tool(
        "send_email",
        {"to": {"type": "array"}, "meta": {"type": "object"}, "cc": {"type": ["array", "null"]}},
    ),
]


def _call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# codes about text around blocks, not about a block (their spans may touch a valid block)
OUTSIDE_BLOCKS = {"unknown_tool", "text_between_calls", "trailing_text"}
GOOD = _call("get_weather", ("location", "Paris"))
HEAD = "<tool_call>\n<function=get_weather>\n"

# (id, completion, expected first diagnostic code, candidates expected, thinking)
CASES: list[tuple[str, str, str, int, bool]] = [
    # truncated anywhere
    ("truncated_after_call_open", "<tool_call>", "unterminated_block", 0, False),
    ("truncated_in_function_tag", "<tool_call>\n<function=get_wea", "unterminated_block", 0, False),
    ("truncated_before_body", HEAD, "unterminated_block", 0, False),
    ("truncated_in_parameter_tag", HEAD + "<parameter=loc", "unterminated_block", 0, False),
    ("truncated_in_value", HEAD + "<parameter=location>\nPar", "unterminated_block", 0, False),
    ("truncated_in_parameter_close", HEAD + "<parameter=location>\nParis\n</param", "unterminated_block", 0, False),
    (
        "truncated_before_function_close",
        HEAD + "<parameter=location>\nP\n</parameter>\n",
        "unterminated_block",
        0,
        False,
    ),
    ("truncated_in_function_close", HEAD + "</func", "unterminated_block", 0, False),
    ("truncated_before_call_close", HEAD + "</function>\n", "unterminated_block", 0, False),
    ("truncated_in_call_close", HEAD + "</function>\n</tool_", "unterminated_block", 0, False),
    ("end_of_turn_inside_value", HEAD + "<parameter=location>\nParis" + EOS, "unterminated_block", 0, False),
    ("end_of_turn_inside_body", HEAD + EOS, "unterminated_block", 0, False),
    # unbalanced tags
    (
        "missing_parameter_close_next_param",
        HEAD + "<parameter=location>\nP\n<parameter=unit>\nC\n</parameter>\n</function>\n</tool_call>",
        "missing_parameter_close",
        0,
        False,
    ),
    (
        "missing_parameter_close_at_function_close",
        HEAD + "<parameter=location>\nParis\n</function>\n</tool_call>",
        "missing_parameter_close",
        0,
        False,
    ),
    (
        "parameter_close_without_newline",
        HEAD + "<parameter=location>\nParis</parameter>\n</function>\n</tool_call>",
        "missing_parameter_close",
        0,
        False,
    ),
    (
        "missing_parameter_close_at_call_close",
        HEAD + "<parameter=location>\nParis\n</tool_call>",
        "missing_parameter_close",
        0,
        False,
    ),
    (
        "missing_function_close",
        HEAD + "<parameter=location>\nP\n</parameter>\n</tool_call>" + EOS,
        "missing_function_close",
        0,
        False,
    ),
    (
        "missing_tool_call_open",
        "<function=get_weather>\n<parameter=location>\nP\n</parameter>\n</function>" + EOS,
        "missing_tool_call_open",
        0,
        False,
    ),
    ("nested_tool_call", HEAD + GOOD, "unbalanced_tags", 1, False),
    ("stray_call_close_in_content", "Hello </tool_call> there", "unbalanced_tags", 0, False),
    ("stray_parameter_in_content", "See <parameter=x> here", "unbalanced_tags", 0, False),
    # bad tags / attribute values
    (
        "function_name_with_space",
        "<tool_call>\n<function=get weather>\n</function>\n</tool_call>",
        "bad_function_tag",
        0,
        False,
    ),
    ("function_name_empty", "<tool_call>\n<function=>\n</function>\n</tool_call>", "bad_function_tag", 0, False),
    (
        "function_name_quoted",
        '<tool_call>\n<function="get_weather">\n</function>\n</tool_call>',
        "bad_function_tag",
        0,
        False,
    ),
    (
        "function_name_too_long",
        "<tool_call>\n<function=" + "a" * 300 + ">\n</function>\n</tool_call>",
        "bad_function_tag",
        0,
        False,
    ),
    (
        "hermes_json_body",
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        "bad_function_tag",
        0,
        False,
    ),
    (
        "parameter_name_empty",
        HEAD + "<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
        "bad_parameter_tag",
        0,
        False,
    ),
    (
        "parameter_name_with_slash",
        HEAD + "<parameter=a/b>\nx\n</parameter>\n</function>\n</tool_call>",
        "bad_parameter_tag",
        0,
        False,
    ),
    (
        "parameter_value_on_tag_line",
        HEAD + "<parameter=location>Paris\n</parameter>\n</function>\n</tool_call>",
        "bad_parameter_tag",
        0,
        False,
    ),
    # invalid JSON / values that fit no declared type
    ("array_trailing_comma", _call("send_email", ("to", '["a@x.io",]')), "invalid_json_value", 0, False),
    ("object_single_quotes", _call("send_email", ("meta", "{'a': 1}")), "invalid_json_value", 0, False),
    ("object_duplicate_key", _call("send_email", ("meta", '{"a": 1, "a": 2}')), "invalid_json_value", 0, False),
    ("array_with_nan", _call("send_email", ("to", "[NaN]")), "invalid_json_value", 0, False),
    ("object_given_an_array", _call("send_email", ("meta", "[1]")), "value_type_mismatch", 0, False),
    ("integer_given_a_float", _call("get_weather", ("days", "3.5")), "value_type_mismatch", 0, False),
    ("integer_with_leading_zero", _call("get_weather", ("days", "07")), "value_type_mismatch", 0, False),
    ("integer_given_a_word", _call("get_weather", ("days", "three")), "value_type_mismatch", 0, False),
    ("number_with_comma", _call("set_thermostat", ("target_c", "12,5")), "value_type_mismatch", 0, False),
    ("number_overflowing", _call("set_thermostat", ("target_c", "1e400")), "value_type_mismatch", 0, False),
    ("boolean_yes", _call("set_thermostat", ("eco", "yes")), "value_type_mismatch", 0, False),
    ("union_fits_no_type", _call("send_email", ("cc", "x@y.io")), "value_type_mismatch", 0, False),
    ("array_with_padding", _call("send_email", ("to", ' ["a"]')), "value_type_mismatch", 0, False),
    # duplicate parameters
    (
        "duplicate_parameter",
        _call("get_weather", ("location", "P"), ("location", "R")),
        "duplicate_parameter",
        0,
        False,
    ),
    # text where the layout allows none
    (
        "text_before_first_parameter",
        HEAD + "Sure!\n<parameter=location>\nP\n</parameter>\n</function>\n</tool_call>",
        "text_in_call",
        0,
        False,
    ),
    (
        "text_after_parameter",
        HEAD + "<parameter=location>\nP\n</parameter>\nok\n</function>\n</tool_call>",
        "text_in_call",
        0,
        False,
    ),
    (
        "parameters_not_separated",
        HEAD + "<parameter=location>\nP\n</parameter><parameter=unit>\nC\n</parameter>\n</function>\n</tool_call>",
        "text_in_call",
        0,
        False,
    ),
    ("function_close_not_separated", HEAD + "</function></tool_call>", "text_in_call", 0, False),
    ("text_after_call", GOOD + "\nI have called the tool." + EOS, "trailing_text", 1, False),
    ("newline_after_last_call", GOOD + "\n", "trailing_text", 1, False),
    ("text_after_end_of_turn", GOOD + EOS + "more", "trailing_text", 1, False),
    ("content_after_end_of_turn", "Hello" + EOS + "again", "trailing_text", 0, False),
    ("text_between_calls", GOOD + "\nand then\n" + GOOD + EOS, "text_between_calls", 2, False),
    ("calls_not_separated", GOOD + GOOD + EOS, "text_between_calls", 2, False),
    # reasoning
    ("call_in_reasoning", "<think>\n" + GOOD + "\n</think>\n\n" + EOS, "call_in_reasoning", 0, False),
    ("call_in_reasoning_thinking_mode", "plan: " + GOOD + "\n</think>\n\nok" + EOS, "call_in_reasoning", 0, True),
    ("reasoning_never_closed", "<think>\nhmm", "missing_think_end", 0, False),
    ("end_of_turn_inside_reasoning", "still thinking" + EOS, "missing_think_end", 0, True),
    # a call to an undeclared tool is still a candidate
    ("undeclared_tool", _call("delete_everything", ("path", "/")) + EOS, "unknown_tool", 1, False),
]


@pytest.mark.parametrize(("text", "code", "n_calls", "thinking"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed(text: str, code: str, n_calls: int, thinking: bool) -> None:
    result = check_split_invariance(FORMAT, text, TOOLS, thinking=thinking, splits=100)
    assert [d.code for d in result.diagnostics][:1] == [code]
    assert len(result.candidates) == n_calls
    bad_blocks = {d.span[0] for d in result.diagnostics if d.code not in OUTSIDE_BLOCKS}
    for cand in result.candidates:
        assert cand.span[0] not in bad_blocks
        assert text[cand.span[0] : cand.span[1]] == cand.raw
    # no call syntax leaks into content, except stray tags, which are reported
    if code != "unbalanced_tags" or n_calls:
        assert "<function=" not in (result.content or "")


def test_corpus_is_large_and_ids_unique() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


def test_diagnostic_message_names_offset() -> None:
    text = _call("get_weather", ("days", "three"))
    result = check_split_invariance(FORMAT, text, TOOLS, splits=1)
    (diag,) = result.diagnostics
    value_at = text.index("three")
    assert diag.message == f"expected 'integer', got 'three' at offset {value_at}"
    assert diag.span == (0, value_at + len("three"))
