"""The mistral renderer against the reference encoder itself, on random conversations.

mistral-common (a dependency of vLLM, with the tekken tokenizer file bundled, so hermetic) encodes
random requests; our text must equal its text view, with the same control tokens, and we must
refuse exactly the requests it refuses. Skipped where mistral-common is not installed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgate.errors import TemplateError
from callgate.formats import MISTRAL
from callgate.templates import render
from tests.harness import NAMES, tool_and_calls

pytest.importorskip("mistral_common")

_CONTROL = re.compile("|".join(re.escape(t) for t in sorted(MISTRAL.special_tokens, key=len, reverse=True)))


@functools.cache
def _tokenizer() -> Any:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.v3(is_tekken=True)


def reference(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> tuple[str, list[str]] | None:
    """(text, control tokens) from mistral-common, or None where it refuses the request."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    tok = _tokenizer()
    try:
        encoded = tok.encode_chat_completion(
            ChatCompletionRequest.model_validate({"messages": messages, "tools": tools})
        )
    except Exception:  # any refusal: pydantic, validator, normaliser or encoder
        return None
    inner = tok.instruct_tokenizer.tokenizer
    controls = [inner.id_to_piece(t) for t in encoded.tokens if t < inner.num_special_tokens]
    return inner.decode(encoded.tokens, special_token_policy=SpecialTokenPolicy.KEEP), controls


def ours(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> tuple[str, list[str]] | None:
    try:
        prompt = render("mistral", messages, tools)
    except TemplateError:
        return None
    return prompt, _CONTROL.findall(prompt)


# Text without control-token look-alikes (those are neutralised on purpose; tested elsewhere).
TEXT = st.text(
    alphabet=st.one_of(st.sampled_from(list(" \n\t[]<>/{}\"'\\é漢🙂")), st.characters(codec="utf-8")),
    max_size=16,
).filter(lambda s: not _CONTROL.search(s))
CONTENT = st.one_of(TEXT, st.lists(st.builds(lambda t: {"type": "text", "text": t}, TEXT), min_size=1, max_size=3))
CALL_IDS = st.from_regex(r"[A-Za-z0-9]{9}", fullmatch=True)


@st.composite
def valid_conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Requests mistral-common accepts: allowed role order, every call answered, ending on user/tool."""
    # descriptions and argument strings without control-token look-alikes, like TEXT above
    tools, calls = draw(tool_and_calls(forbidden=MISTRAL.special_tokens, max_calls=3))
    messages: list[dict[str, Any]] = [{"role": draw(st.sampled_from(["system", "user"])), "content": draw(CONTENT)}]
    for _ in range(draw(st.integers(0, 6))):
        prev = messages[-1]["role"]
        options = {"system": ["user", "system"], "user": ["user", "system", "text", "calls"]}.get(
            prev, ["user", "text", "calls"]
        )
        if prev == "assistant" and not messages[-1].get("tool_calls"):
            options = ["user", "text"]
        kind = draw(st.sampled_from(options))
        if kind in ("user", "system"):
            messages.append({"role": kind, "content": draw(CONTENT)})
        elif kind == "text":
            messages.append({"role": "assistant", "content": draw(TEXT.filter(bool))})
        else:
            chosen = draw(st.lists(st.sampled_from(calls), min_size=1, max_size=3))
            ids = draw(st.lists(CALL_IDS, min_size=len(chosen), max_size=len(chosen), unique=True))
            messages.append({"role": "assistant", "content": None, "tool_calls": _openai_calls(chosen, ids)})
            messages.extend({"role": "tool", "tool_call_id": i, "content": draw(_RESULT)} for i in ids)
    if messages[-1]["role"] == "assistant" or (messages[-1]["role"] == "system" and len(messages) > 1):
        messages.append({"role": "user", "content": draw(CONTENT)})
    return messages, draw(st.sampled_from([[_loosen(t, draw) for t in tools], None, []]))


def _loosen(tool: dict[str, Any], draw: st.DrawFn) -> dict[str, Any]:
    """OpenAI tool variants the reference normalises: no description, a `strict` flag."""
    function = dict(tool["function"])
    if draw(st.booleans()):
        del function["description"]
    if draw(st.booleans()):
        function["strict"] = draw(st.booleans())
    return {**tool, "function": function}


_RESULT = st.one_of(TEXT, st.sampled_from(["42", "true", "null", '{"a": [1, 2.5]}', "", " 7 ", "[1"]))


def _openai_calls(calls: list[tuple[str, dict[str, Any]]], ids: list[str]) -> list[dict[str, Any]]:
    import json

    return [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
        for (n, a), i in zip(calls, ids, strict=True)
    ]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(conversation=valid_conversations())
def test_same_prompt_as_mistral_common(conversation: tuple[list[dict[str, Any]], list[dict[str, Any]] | None]) -> None:
    messages, tools = conversation
    expected = reference(messages, tools)
    assert expected is not None, "the strategy only builds requests the reference accepts"
    assert ours(messages, tools) == expected


@st.composite
def any_messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Loosely shaped requests (valid field types, any order, good and bad ids and names)."""
    out: list[dict[str, Any]] = []
    ids = st.one_of(CALL_IDS, st.sampled_from(["call_abc123", "short", "Abc123xyZ"]))
    names = st.one_of(NAMES, st.sampled_from(["bad name", "x" * 65]))
    for _ in range(draw(st.integers(0, 5))):
        role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
        if role == "assistant":
            calls = draw(st.none() | st.lists(st.tuples(names, ids), max_size=2))
            tool_calls = None
            if calls is not None:
                tool_calls = [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}} for n, i in calls
                ]
            out.append({"role": role, "content": draw(st.none() | TEXT), "tool_calls": tool_calls})
        elif role == "tool":
            out.append({"role": role, "content": draw(TEXT), "tool_call_id": draw(ids)})
        else:
            out.append({"role": role, "content": draw(TEXT)})
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(messages=any_messages())
def test_refuses_exactly_what_mistral_common_refuses(messages: list[dict[str, Any]]) -> None:
    assert ours(messages, None) == reference(messages, None)


@pytest.mark.parametrize("result", ["1e999", "-1e999", "NaN", '{"a": 1e999}'])
def test_non_finite_tool_result_written_as_the_reference_writes_it(result: str) -> None:
    """A tool result that reads as JSON with a non-finite number is data, not a refusal
    (found by the reference comparison above: ours refused, mistral-common writes Infinity)."""
    call = {"id": "000000000", "type": "function", "function": {"name": "A", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "000000000", "content": result},
    ]
    tools = [{"type": "function", "function": {"name": "A", "description": "", "parameters": {"type": "object"}}}]
    expected = reference(messages, tools)
    assert expected is not None
    assert ours(messages, tools) == expected
