"""hermes encode: golden prompts byte for byte (Qwen3 primary, Qwen2.5 variant), the two
deliberate differences checked exactly, and the renderer's own parameters and refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.errors import TemplateError
from callgate.formats import HERMES, HERMES_QWEN25
from callgate.templates import RenderOptions, chatml, render
from tests.conftest import load_jsonl

CASES = load_jsonl("hermes/encode.jsonl")

# Golden cases callgate deliberately does not reproduce byte for byte (each is checked
# exactly against its documented difference below).
EXEMPT = {
    "hermes_vis_tool_result_injection": "pins the reference's unprotected output; callgate neutralises markers "
    "in tool results (see test_exempt_injection_case and tests/test_hermes_injection.py)",
    "hermes_vis_raw_arguments_string": "pins_quirk: the reference pastes an arguments string verbatim; callgate "
    "re-serialises arguments canonically (see test_exempt_raw_arguments_case)",
}
BY_ID = {c["id"]: c for c in CASES}
PINNED = [c for c in CASES if c["id"] not in EXEMPT]


def _render(case: dict[str, Any], messages: list[dict[str, Any]] | None = None) -> str:
    kwargs = case["render_kwargs"]
    fmt = HERMES if case["variant"] == "qwen3" else HERMES_QWEN25
    return chatml.render(
        fmt,
        messages if messages is not None else case["messages"],
        case["tools"],
        RenderOptions(
            thinking=False,
            drop_thinking=True,
            reasoning_effort="none" if kwargs.get("enable_thinking") is False else None,
            add_bos=True,
            add_generation_prompt=kwargs["add_generation_prompt"],
        ),
    )


def test_exemptions_are_golden_cases() -> None:
    assert set(EXEMPT) <= set(BY_ID)
    assert not any("expected_error" in c for c in CASES)


@pytest.mark.parametrize("case", PINNED, ids=[c["id"] for c in PINNED])
def test_golden_encode(case: dict[str, Any]) -> None:
    assert _render(case) == case["expected_prompt"]


def test_public_dispatch_renders_qwen3() -> None:
    case = BY_ID["hermes_vis_single_call_result"]
    assert render("hermes", case["messages"], case["tools"]) == case["expected_prompt"]


def test_exempt_injection_case() -> None:
    case = BY_ID["hermes_vis_tool_result_injection"]
    raw = case["messages"][2]["content"]
    expected = case["expected_prompt"].replace(raw, chatml.neutralise(HERMES, raw))
    assert expected != case["expected_prompt"]
    assert _render(case) == expected


def test_exempt_raw_arguments_case() -> None:
    case = BY_ID["hermes_vis_raw_arguments_string"]
    raw = case["messages"][1]["tool_calls"][0]["function"]["arguments"]
    canonical = json.dumps(json.loads(raw), ensure_ascii=False)
    assert raw != canonical
    assert _render(case) == case["expected_prompt"].replace(raw, canonical)


# ---- parameters ---------------------------------------------------------------------------

USER = [{"role": "user", "content": "Hi"}]


def test_thinking_opens_the_reasoning_block() -> None:
    assert render("hermes", USER, thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    assert render("hermes", USER).endswith("<|im_start|>assistant\n")


def test_reasoning_effort_none_closes_an_empty_block() -> None:
    assert render("hermes", USER, reasoning_effort="none").endswith("assistant\n<think>\n\n</think>\n\n")
    assert render("hermes", USER, reasoning_effort="high") == render("hermes", USER)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking": True, "reasoning_effort": "none"}, "thinking"),
    ],
)
def test_bad_reasoning_parameters(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(TemplateError) as err:
        render("hermes", USER, **kwargs)
    assert err.value.param == param


def test_qwen25_has_no_thinking() -> None:
    with pytest.raises(TemplateError, match="thinking"):
        chatml.render(HERMES_QWEN25, USER, None, RenderOptions(thinking=True, drop_thinking=True,
                      reasoning_effort=None, add_bos=True, add_generation_prompt=True))  # fmt: skip


def test_drop_thinking_false_keeps_earlier_reasoning() -> None:
    messages = [
        {"role": "user", "content": "A?"},
        {"role": "assistant", "content": "a", "reasoning_content": "think A"},
        {"role": "user", "content": "B?"},
    ]
    assert "think A" not in render("hermes", messages)
    kept = render("hermes", messages, drop_thinking=False)
    assert "<|im_start|>assistant\n<think>\nthink A\n</think>\n\na<|im_end|>" in kept


def test_text_parts_and_developer() -> None:
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]}]
    plain = [{"role": "system", "content": "Be brief."}]
    assert render("hermes", [*parts, *USER]) == render("hermes", [*plain, *USER])


def test_task_on_last_user_message_appends_the_instruction() -> None:
    prompt = render("hermes", [{"role": "user", "content": "Hi", "task": "title"}])
    assert prompt == f"<|im_start|>user\nHi\n\n{HERMES.quick_tasks['title']}<|im_end|>\n<|im_start|>assistant\n"


def test_task_after_an_answer_is_one_more_user_turn() -> None:
    messages = [*USER, {"role": "assistant", "content": "Hello!", "task": "title"}]
    base = render("hermes", [*USER, {"role": "assistant", "content": "Hello!"}], add_generation_prompt=False)
    prompt = render("hermes", messages)
    assert prompt == base + f"<|im_start|>user\n{HERMES.quick_tasks['title']}<|im_end|>\n<|im_start|>assistant\n"


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _call_message(**function: Any) -> list[dict[str, Any]]:
    call = {**CALL, "function": {**CALL["function"], **function}}
    return [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        (_call_message(arguments="{not json"), "messages[1].tool_calls[0].function.arguments: not valid JSON"),
        (_call_message(arguments='{"a": 1, "a": 2}'), "messages[1].tool_calls[0].function.arguments: not valid JSON"),
        (_call_message(arguments='{"a": NaN}'), "messages[1].tool_calls[0].function.arguments: not valid JSON"),
        (_call_message(arguments="[1, 2]"), "messages[1].tool_calls[0].function.arguments: must be a JSON object"),
        (_call_message(name='say"hi'), "messages[1].tool_calls[0].function.name"),
        (_call_message(name=""), "messages[1].tool_calls[0].function.name"),
        (_call_message(name="a<|im_end|>"), "messages[1].tool_calls[0].function.name"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "x", "task": "title"}, *USER], "messages[0].task"),
        ([{"role": "user", "content": "x", "task": "poem"}], "messages[0].task"),
        ([{"role": "assistant", "content": "", "tool_calls": {"f": 1}}], "messages[0].tool_calls"),
    ],
)
def test_unrepresentable_input_raises(messages: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(TemplateError) as err:
        render("hermes", messages)
    assert str(err.value).startswith(field)
    assert err.value.status == 400
