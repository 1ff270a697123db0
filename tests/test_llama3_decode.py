"""llama3-json decode: golden completions (valid and malformed) and the streaming invariant."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.parsers import parse, sequential_call_ids
from tests.conftest import load_jsonl
from tests.harness import calls_of, check_split_invariance

FORMAT = "llama3-json"
CASES = load_jsonl("llama3-json/decode.jsonl")
VALID = [c for c in CASES if not c["expected"].get("error")]
MALFORMED = [c for c in CASES if c["expected"].get("error")]


def _parse(case: dict[str, Any]) -> Any:
    return parse(
        FORMAT, case["completion_text"], case["tools"], thinking=case["thinking"], call_ids=sequential_call_ids()
    )


@pytest.mark.parametrize("case", VALID, ids=[c["id"] for c in VALID])
def test_golden_valid(case: dict[str, Any]) -> None:
    result = _parse(case)
    expected = case["expected"]
    assert result.diagnostics == ()
    assert (result.content or "") == expected["content"]
    assert (result.reasoning or "") == expected["reasoning"]
    assert calls_of(result) == [(c["name"], c["arguments"]) for c in expected["tool_calls"]]
    for cand in result.candidates:
        assert case["completion_text"][cand.span[0] : cand.span[1]] == cand.raw
        assert cand.format == FORMAT


@pytest.mark.parametrize("case", MALFORMED, ids=[c["id"] for c in MALFORMED])
def test_golden_malformed(case: dict[str, Any]) -> None:
    result = _parse(case)
    assert result.diagnostics, "a malformed completion must yield a diagnostic"
    first = result.diagnostics[0]
    assert first.code == case["expected"]["reason"]
    # a call block that is complete before the malformed text may still be a candidate
    # (the response fails as a whole); none may come from the malformed text itself
    for cand in result.candidates:
        assert cand.span[1] <= first.span[0] or cand.span[0] >= first.span[1]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_split_invariance(case: dict[str, Any]) -> None:
    check_split_invariance(FORMAT, case["completion_text"], case["tools"], thinking=case["thinking"])
