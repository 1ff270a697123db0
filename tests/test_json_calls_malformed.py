"""JSON family: a malformed corpus per format (hermes, llama3-json, mistral), each case with
the diagnostic code it must produce, plus truncation at every offset of a valid call.

Every case must: not raise, give the expected code as its first diagnostic, create no
candidate out of the malformed text, keep every candidate's raw equal to its span, and
stream identically under random splits.
"""

from __future__ import annotations

from typing import Any

import pytest

from callgate.parsers import parse, sequential_call_ids
from tests.harness import check_split_invariance

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]

# ---- hermes -------------------------------------------------------------------------------

H_ARGS = '{"city": "Paris"}'
H_CALL = '<tool_call>\n{"name": "get_weather", "arguments": ' + H_ARGS + "}\n</tool_call>"


def _h(body: str) -> str:
    return "<tool_call>\n" + body + "\n</tool_call><|im_end|>"


HERMES = [
    ("truncated_after_open", "<tool_call>", "unterminated_block"),
    ("truncated_in_name", '<tool_call>\n{"name": "get_w', "unterminated_block"),
    ("truncated_in_argument", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "unterminated_block"),
    ("truncated_after_json", H_CALL[: H_CALL.index("\n</tool_call>")], "unterminated_block"),
    ("truncated_in_close_tag", H_CALL[:-3], "unterminated_block"),
    ("eos_before_close_tag", H_CALL.replace("</tool_call>", "<|im_end|>"), "unterminated_block"),
    ("eos_inside_json", '<tool_call>\n{"name": "get_weather", <|im_end|>', "unterminated_block"),
    ("nested_open_tag", "<tool_call>\n" + H_CALL, "unbalanced_tags"),
    ("open_tag_instead_of_close", H_CALL.replace("</tool_call>", "<tool_call>"), "unbalanced_tags"),
    ("stray_close_tag", "Done.</tool_call>", "unbalanced_tags"),
    ("single_quotes", _h("{'name': 'get_weather', 'arguments': {}}"), "invalid_json"),
    ("trailing_comma_arguments", _h('{"name": "get_weather", "arguments": {"city": "P",}}'), "invalid_json"),
    ("trailing_comma_object", _h('{"name": "get_weather", "arguments": {},}'), "invalid_json"),
    ("nan_value", _h('{"name": "get_weather", "arguments": {"t": NaN}}'), "invalid_json"),
    ("infinity_value", _h('{"name": "get_weather", "arguments": {"t": -Infinity}}'), "invalid_json"),
    ("number_overflow", _h('{"name": "get_weather", "arguments": {"t": 1e999}}'), "invalid_json"),
    ("leading_zero", _h('{"name": "get_weather", "arguments": {"t": 007}}'), "invalid_json"),
    ("unquoted_key", _h('{name: "get_weather", "arguments": {}}'), "invalid_json"),
    ("raw_newline_in_string", _h('{"name": "get_weather", "arguments": {"city": "a\nb"}}'), "invalid_json"),
    ("bad_escape", _h('{"name": "get_weather", "arguments": {"city": "\\x41"}}'), "invalid_json"),
    ("text_after_json_in_block", _h('{"name": "get_weather", "arguments": {}} ok'), "invalid_json"),
    (
        "two_objects_in_block",
        _h('{"name": "get_time", "arguments": {}} {"name": "get_time", "arguments": {}}'),
        "invalid_json",
    ),
    ("close_tag_inside_json", '<tool_call>\n{"name": "get_weather"</tool_call>', "invalid_json"),
    ("duplicate_parameter", _h('{"name": "get_weather", "arguments": {"city": "a", "city": "b"}}'), "duplicate_key"),
    ("duplicate_name", _h('{"name": "get_weather", "name": "get_time", "arguments": {}}'), "duplicate_key"),
    (
        "arguments_as_string",
        _h('{"name": "get_weather", "arguments": "{\\"city\\": \\"P\\"}"}'),
        "arguments_not_object",
    ),
    ("arguments_as_array", _h('{"name": "get_weather", "arguments": ["Paris"]}'), "arguments_not_object"),
    ("arguments_null", _h('{"name": "get_weather", "arguments": null}'), "arguments_not_object"),
    ("missing_arguments", _h('{"name": "get_weather"}'), "bad_call_object"),
    ("extra_key", _h('{"name": "get_weather", "arguments": {}, "id": "c1"}'), "bad_call_object"),
    ("name_not_string", _h('{"name": 7, "arguments": {}}'), "bad_call_object"),
    ("empty_name", _h('{"name": "", "arguments": {}}'), "bad_call_object"),
    ("body_is_array", _h('[{"name": "get_weather", "arguments": {}}]'), "bad_call_object"),
    ("empty_block", "<tool_call>\n\n</tool_call>", "empty_call_block"),
    ("text_after_call", H_CALL + "\nAnything else?<|im_end|>", "trailing_text"),
    ("newline_after_call", H_CALL + "\n", "trailing_text"),
    ("text_after_eos", H_CALL + "<|im_end|>\n", "trailing_text"),
    ("text_between_calls", H_CALL + "\nand\n" + H_CALL, "text_between_calls"),
    ("blank_line_between_calls", H_CALL + "\n\n" + H_CALL, "text_between_calls"),
    ("call_in_reasoning", "<think>\n" + H_CALL + "\n</think>\n\nok", "call_in_reasoning"),
    ("close_tag_in_reasoning", "<think>\nhm </tool_call>\n</think>\n\nok", "call_in_reasoning"),
    ("unclosed_think", "<think>\nI should call get_weather", "missing_think_end"),
    ("eos_inside_think", "<think>\nhm<|im_end|>", "missing_think_end"),
    ("stray_think_open", "Sure. <think>hm</think> ok", "stray_think_tag"),
    ("stray_think_close", "Sure.</think>", "stray_think_tag"),
    ("control_token_in_content", "Hi<|im_start|>user\nhi", "special_token_in_content"),
    ("unknown_tool", _h('{"name": "send_email", "arguments": {}}'), "unknown_tool"),
]

# ---- llama3-json --------------------------------------------------------------------------

L_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'

LLAMA3 = [
    ("truncated_open_brace", "{", "unterminated_block"),
    ("truncated_in_name", '{"name": "get_we', "unterminated_block"),
    ("truncated_in_parameters", L_CALL[:-5], "unterminated_block"),
    ("truncated_before_last_brace", L_CALL[:-1], "unterminated_block"),
    ("python_tag_only", "<|python_tag|>", "unterminated_block"),
    ("python_tag_then_eot", "<|python_tag|><|eot_id|>", "unterminated_block"),
    ("eot_inside_json", '{"name": "get_weather", <|eot_id|>', "unterminated_block"),
    ("truncated_array", '[{"name": "get_weather"', "unterminated_block"),
    ("single_quotes", "{'name': 'get_weather', 'parameters': {}}<|eot_id|>", "invalid_json"),
    ("trailing_comma", '{"name": "get_weather", "parameters": {"city": "P",}}<|eot_id|>', "invalid_json"),
    ("nan_value", '{"name": "get_weather", "parameters": {"t": NaN}}<|eot_id|>', "invalid_json"),
    ("builtin_call_syntax", '<|python_tag|>brave_search.call(query="x")<|eom_id|>', "invalid_json"),
    ("python_tag_then_text", "<|python_tag|>get_weather Paris<|eom_id|>", "invalid_json"),
    ("comment_in_json", '{"name": "get_weather", /* c */ "parameters": {}}<|eot_id|>', "invalid_json"),
    ("duplicate_parameter", '{"name": "get_weather", "parameters": {"city": "a", "city": "b"}}', "duplicate_key"),
    ("duplicate_parameters_key", '{"name": "get_weather", "parameters": {}, "parameters": {}}', "duplicate_key"),
    ("arguments_instead_of_parameters", '{"name": "get_weather", "arguments": {}}<|eot_id|>', "bad_call_object"),
    ("missing_name", '{"parameters": {}}<|eot_id|>', "bad_call_object"),
    ("extra_key", '{"name": "get_weather", "parameters": {}, "id": "1"}<|eot_id|>', "bad_call_object"),
    ("empty_name", '{"name": "", "parameters": {}}<|eot_id|>', "bad_call_object"),
    ("name_not_string", '{"name": null, "parameters": {}}<|eot_id|>', "bad_call_object"),
    ("empty_object", "{}<|eot_id|>", "bad_call_object"),
    ("parameters_as_string", '{"name": "get_weather", "parameters": "city=Paris"}<|eot_id|>', "arguments_not_object"),
    ("parameters_as_array", '{"name": "get_weather", "parameters": []}<|eot_id|>', "arguments_not_object"),
    ("array_of_calls", "[" + L_CALL + ", " + L_CALL + "]<|eot_id|>", "parallel_calls_unsupported"),
    ("python_tag_array", "<|python_tag|>[" + L_CALL + "]<|eom_id|>", "parallel_calls_unsupported"),
    ("two_calls_newline", L_CALL + "\n" + L_CALL + "<|eot_id|>", "parallel_calls_unsupported"),
    ("two_calls_semicolon", L_CALL + ";" + L_CALL, "parallel_calls_unsupported"),
    ("text_after_call", L_CALL + " Done.<|eot_id|>", "trailing_text"),
    ("newline_after_call", L_CALL + "\n<|eot_id|>", "trailing_text"),
    ("text_after_eot", L_CALL + "<|eot_id|>\n", "trailing_text"),
    ("text_after_eom", "<|python_tag|>" + L_CALL + "<|eom_id|>x", "trailing_text"),
    ("text_before_call", "Calling: " + L_CALL + "<|eot_id|>", "text_before_call"),
    ("text_before_python_tag", "Ok.<|python_tag|>" + L_CALL + "<|eom_id|>", "text_before_call"),
    ("header_in_content", "Hi<|start_header_id|>user<|end_header_id|>", "special_token_in_content"),
    ("reserved_token_in_content", "Hi<|reserved_special_token_7|>", "special_token_in_content"),
    ("unknown_tool", '{"name": "send_email", "parameters": {}}<|eot_id|>', "unknown_tool"),
]

# ---- mistral ------------------------------------------------------------------------------

M_OBJ = '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "Pa1rIs001"}'
M_CALL = "[TOOL_CALLS][" + M_OBJ + "]"


def _m(payload: str) -> str:
    return "[TOOL_CALLS]" + payload + "</s>"


MISTRAL = [
    ("truncated_after_token", "[TOOL_CALLS]", "unterminated_block"),
    ("empty_payload", "[TOOL_CALLS]</s>", "unterminated_block"),
    ("truncated_in_list", M_CALL[:-1], "unterminated_block"),
    ("truncated_in_id", M_CALL[:-6], "unterminated_block"),
    ("eos_inside_json", '[TOOL_CALLS][{"name": "get_weather", </s>', "unterminated_block"),
    ("object_not_array", _m('{"name": "get_weather", "arguments": {}}'), "calls_not_array"),
    ("string_payload", _m('"get_weather"'), "calls_not_array"),
    ("number_payload", _m("42"), "calls_not_array"),
    ("number_payload_at_end", "[TOOL_CALLS]42", "calls_not_array"),
    ("empty_list", _m("[]"), "empty_call_list"),
    ("element_not_object", _m('["get_weather"]'), "bad_call_object"),
    ("missing_name", _m('[{"arguments": {}}]'), "bad_call_object"),
    ("missing_arguments", _m('[{"name": "get_weather"}]'), "bad_call_object"),
    ("extra_key", _m('[{"name": "get_weather", "arguments": {}, "type": "function"}]'), "bad_call_object"),
    ("empty_name", _m('[{"name": "", "arguments": {}}]'), "bad_call_object"),
    ("second_element_bad", _m("[" + M_OBJ + ', {"name": "get_time"}]'), "bad_call_object"),
    ("arguments_as_string", _m('[{"name": "get_weather", "arguments": "{}"}]'), "arguments_not_object"),
    ("arguments_as_list", _m('[{"name": "get_weather", "arguments": [1]}]'), "arguments_not_object"),
    ("id_too_short", _m('[{"name": "get_weather", "arguments": {}, "id": "abc"}]'), "bad_call_id"),
    ("id_with_underscore", _m('[{"name": "get_weather", "arguments": {}, "id": "call_abc1"}]'), "bad_call_id"),
    ("id_not_string", _m('[{"name": "get_weather", "arguments": {}, "id": 123456789}]'), "bad_call_id"),
    ("trailing_comma", _m('[{"name": "get_weather", "arguments": {}},]'), "invalid_json"),
    ("single_quotes", _m("[{'name': 'get_weather', 'arguments': {}}]"), "invalid_json"),
    ("nan_value", _m('[{"name": "get_weather", "arguments": {"t": NaN}}]'), "invalid_json"),
    ("python_call_syntax", _m('get_weather(city="Paris")'), "invalid_json"),
    ("v11_call_syntax", _m('get_weather[ARGS]{"city": "Paris"}'), "invalid_json"),
    ("duplicate_argument", _m('[{"name": "get_weather", "arguments": {"a": 1, "a": 2}}]'), "duplicate_key"),
    ("duplicate_id_key", _m('[{"name": "get_weather", "arguments": {}, "id": "a", "id": "b"}]'), "duplicate_key"),
    ("text_after_array", M_CALL + " Done.</s>", "trailing_text"),
    ("newline_after_array", M_CALL + "\n</s>", "trailing_text"),
    ("text_after_eos", M_CALL + "</s>Done.", "trailing_text"),
    ("newline_after_eos", M_CALL + "</s>\n", "trailing_text"),
    ("second_call_block", M_CALL + M_CALL + "</s>", "multiple_call_blocks"),
    ("inst_in_content", "Sure[INST]hi[/INST]</s>", "special_token_in_content"),
    ("bos_in_content", "Sure<s>again</s>", "special_token_in_content"),
    ("tool_results_in_content", "Sure[TOOL_RESULTS]{}[/TOOL_RESULTS]</s>", "special_token_in_content"),
    ("unknown_tool", _m('[{"name": "send_email", "arguments": {}}]'), "unknown_tool"),
]

CASES = [("hermes", *c) for c in HERMES] + [("llama3-json", *c) for c in LLAMA3] + [("mistral", *c) for c in MISTRAL]


def test_corpus_size() -> None:
    for table in (HERMES, LLAMA3, MISTRAL):
        assert len(table) >= 30
        assert len({case_id for case_id, _, _ in table}) == len(table)


def _check(format: str, text: str, code: str) -> Any:
    result = parse(format, text, TOOLS, call_ids=sequential_call_ids())
    assert result.diagnostics, "a malformed completion must yield a diagnostic"
    first = result.diagnostics[0]
    assert first.code == code, result.diagnostics
    assert f"at offset {first.span[0]}" in first.message and first.message.startswith("expected ")
    assert 0 <= first.span[0] <= first.span[1] <= len(text)
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw
        if code != "unknown_tool":
            assert cand.span[1] <= first.span[0] or cand.span[0] >= first.span[1]
    return result


@pytest.mark.parametrize(("format", "case_id", "text", "code"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_malformed(format: str, case_id: str, text: str, code: str) -> None:
    result = _check(format, text, code)
    if code == "unknown_tool":  # still a candidate, for the validator to reject
        assert [c.name for c in result.candidates] == ["send_email"]
    check_split_invariance(format, text, TOOLS, splits=30)


VALID_BLOCKS = [
    ("hermes", "<tool_call>", H_CALL),
    ("llama3-json", "", L_CALL),
    ("llama3-json", "<|python_tag|>", "<|python_tag|>" + L_CALL),
    ("mistral", "[TOOL_CALLS]", M_CALL),
]


@pytest.mark.parametrize(("format", "opener", "text"), VALID_BLOCKS, ids=[f"{v[0]}:{v[1]}" for v in VALID_BLOCKS])
def test_truncated_at_every_offset(format: str, opener: str, text: str) -> None:
    assert parse(format, text, TOOLS).diagnostics == ()
    for cut in range(max(1, len(opener)), len(text)):
        result = _check(format, text[:cut], "unterminated_block")
        assert result.candidates == ()
        assert result.content is None
