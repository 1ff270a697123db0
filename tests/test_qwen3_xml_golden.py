"""qwen3-xml against the golden files: encode byte for byte, decode verdicts, split invariance."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.errors import TemplateError
from callgate.templates import render
from tests.conftest import load_jsonl
from tests.harness import calls_of, check_split_invariance

FORMAT = "qwen3-xml"
ENCODE = load_jsonl("qwen3-xml/encode.jsonl")
DECODE = load_jsonl("qwen3-xml/decode.jsonl")

# The only allowed exemption from byte identity: the reference writes tool output verbatim,
# callgate neutralises markup in it (tests/test_qwen3_xml_injection.py checks the protection).
EXEMPT = {
    "qwen3xml_vis_tool_result_injection": "tool result imitating markup is neutralised (zero-width joiner after '<')",
}


def _render(case: dict[str, Any]) -> str:
    kwargs = case["render_kwargs"]
    return render(FORMAT, case["messages"], case["tools"], add_generation_prompt=kwargs["add_generation_prompt"])


@pytest.mark.parametrize("case", ENCODE, ids=[c["id"] for c in ENCODE])
def test_golden_encode(case: dict[str, Any]) -> None:
    if "expected_error" in case:
        with pytest.raises(TemplateError):
            _render(case)
        return
    prompt = _render(case)
    if case["id"] in EXEMPT:
        assert prompt != case["expected_prompt"], "exempt case now matches: drop the exemption"
        return
    assert prompt == case["expected_prompt"]


def test_exemptions_name_real_cases() -> None:
    assert set(EXEMPT) <= {c["id"] for c in ENCODE}


VALID = [c for c in DECODE if not c["expected"].get("error")]
MALFORMED = [c for c in DECODE if c["expected"].get("error")]


@pytest.mark.parametrize("case", VALID, ids=[c["id"] for c in VALID])
def test_golden_decode_valid(case: dict[str, Any]) -> None:
    text = case["completion_text"]
    result = check_split_invariance(FORMAT, text, case.get("tools"), thinking=case["thinking"], splits=100)
    expected = case["expected"]
    assert result.diagnostics == ()
    assert (result.content or "") == expected["content"]
    assert (result.reasoning or "") == expected["reasoning"]
    assert calls_of(result) == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
    for cand in result.candidates:
        assert text[cand.span[0] : cand.span[1]] == cand.raw
        assert cand.format == FORMAT


@pytest.mark.parametrize("case", MALFORMED, ids=[c["id"] for c in MALFORMED])
def test_golden_decode_malformed(case: dict[str, Any]) -> None:
    text = case["completion_text"]
    result = check_split_invariance(FORMAT, text, case.get("tools"), thinking=case["thinking"], splits=100)
    codes = [d.code for d in result.diagnostics]
    assert codes and codes[0] == case["expected"]["reason"]
    # A block with a diagnostic yields no candidate; text after a valid call leaves that call standing.
    blocks_with_errors = {
        d.span[0] for d in result.diagnostics if d.code not in {"unknown_tool", "text_between_calls", "trailing_text"}
    }
    assert all(c.span[0] not in blocks_with_errors for c in result.candidates)
    for d in result.diagnostics:
        assert d.message.startswith("expected ") and " at offset " in d.message


def test_every_malformed_reason_is_covered() -> None:
    assert {c["expected"]["reason"] for c in MALFORMED} == {
        "bad_function_tag",
        "call_in_reasoning",
        "duplicate_parameter",
        "invalid_json_value",
        "missing_function_close",
        "missing_parameter_close",
        "missing_tool_call_open",
        "text_in_call",
        "trailing_text",
        "unterminated_block",
        "value_type_mismatch",
    }
