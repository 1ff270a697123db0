"""JSON-family decode (hermes, llama3-json, mistral): golden completions (valid and
malformed) and the streaming invariant, one table for the three formats."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.parsers import parse, sequential_call_ids
from tests.conftest import load_jsonl
from tests.harness import calls_of, check_split_invariance

FORMATS = ("hermes", "llama3-json", "mistral")
CASES = [(fmt, case) for fmt in FORMATS for case in load_jsonl(f"{fmt}/decode.jsonl")]
VALID = [(fmt, c) for fmt, c in CASES if not c["expected"].get("error")]
MALFORMED = [(fmt, c) for fmt, c in CASES if c["expected"].get("error")]


def _ids(cases: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [c["id"] for _, c in cases]


def _parse(fmt: str, case: dict[str, Any]) -> Any:
    return parse(fmt, case["completion_text"], case["tools"], thinking=case["thinking"], call_ids=sequential_call_ids())


@pytest.mark.parametrize(("fmt", "case"), VALID, ids=_ids(VALID))
def test_golden_valid(fmt: str, case: dict[str, Any]) -> None:
    result = _parse(fmt, case)
    expected = case["expected"]
    assert result.diagnostics == ()
    assert (result.content or "") == expected["content"]
    assert (result.reasoning or "") == expected["reasoning"]
    assert calls_of(result) == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
    for cand, call in zip(result.candidates, expected["tool_calls"], strict=True):
        # the model's own id where it wrote one (mistral), else callgate's
        assert cand.call_id == call.get("id", cand.call_id)
        assert "id" in call or cand.call_id.startswith("call_")
    for cand in result.candidates:
        assert case["completion_text"][cand.span[0] : cand.span[1]] == cand.raw
        assert cand.format == fmt


@pytest.mark.parametrize(("fmt", "case"), MALFORMED, ids=_ids(MALFORMED))
def test_golden_malformed(fmt: str, case: dict[str, Any]) -> None:
    result = _parse(fmt, case)
    assert result.diagnostics, "a malformed completion must yield a diagnostic"
    first = result.diagnostics[0]
    assert first.code == case["expected"]["reason"]
    # a call block that is complete before the malformed text may still be a candidate
    # (the response fails as a whole); none may come from the malformed text itself
    for cand in result.candidates:
        assert cand.span[1] <= first.span[0] or cand.span[0] >= first.span[1]


@pytest.mark.parametrize(("fmt", "case"), CASES, ids=_ids(CASES))
def test_golden_split_invariance(fmt: str, case: dict[str, Any]) -> None:
    check_split_invariance(fmt, case["completion_text"], case["tools"], thinking=case["thinking"])
