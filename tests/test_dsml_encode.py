"""DSML renderer: golden encode cases byte for byte, refusals, and callgate's own choices."""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

import pytest

from callgate.errors import TemplateError
from callgate.formats import get_format
from callgate.templates import render
from callgate.templates.dsml_blocks import fixed_text
from tests.conftest import GOLDEN, load_jsonl

FORMATS = {"dsv32": "dsml-v3.2", "dsv4": "dsml-v4"}

# Golden cases callgate does not reproduce, with the reason (only the allowed kinds).
ENCODE_EXEMPT = {
    "v32_vis_context_incremental_assistant": "training-only `context` prefix",
    "v32_vis_context_incremental_tool_results": "training-only `context` prefix",
    "v4_vis_context_incremental_assistant": "training-only `context` prefix",
    "v4_vis_context_incremental_tool_result": "training-only `context` prefix",
    "v4_vis_wo_eos_prefill": "training-only `wo_eos` field",
    "v4_official_test_3": "tools attached to a developer message, not the first system message",
    "v4_vis_developer_tools_think": "tools attached to a developer message, not the first system message",
    "v4_vis_args_invalid_json_fallback": "strict arguments: callgate refuses arguments that are not strict JSON in "
    "every format (callgate/strict_json.py); the V4 reference passes them on as one string parameter",
}

# What each refusal's message must name (the field at fault).
REFUSAL_NAMES = {
    "missing_reasoning_after_last_user": "messages[1].reasoning_content",
    "tool_result_without_call": "messages[2]",
    "too_many_tool_results": "messages[4]",
    "empty_developer_content": "messages[0].content",
    "unknown_role": "messages[1].role",
    "invalid_thinking_mode": "thinking",
    "arguments_not_json": "messages[2].tool_calls[0].function.arguments: not valid JSON",
    "arguments_not_object": "messages[2].tool_calls[0].function.arguments: must be a JSON object",
    "developer_dropped_breaks_render": "messages[0]",
    "invalid_task": "messages[0].task",
    "invalid_reasoning_effort": "reasoning_effort",
    "non_string_user_content": "messages[0].content",
}


def _cases() -> list[Any]:
    cases = [*load_jsonl("dsml/encode_dsv32.jsonl"), *load_jsonl("dsml/encode_dsv4.jsonl")]
    return [pytest.param(c, id=c["id"]) for c in cases]


def _attach_target(messages: list[dict[str, Any]]) -> int:
    """Where callgate puts the request's tools: first system, else first developer message."""
    for role in ("system", "developer"):
        for i, m in enumerate(messages):
            if m.get("role") == role:
                return i
    return -1


def _run(case: dict[str, Any]) -> str:
    args = case["encoder_args"]
    messages = copy.deepcopy(case["messages"])
    tools = case.get("tools")
    for m in messages:
        if "tools" in m:  # official fixtures carry the tools on the message itself
            tools = m.pop("tools")
    mode = args["thinking_mode"]
    thinking = {"thinking": True, "chat": False}.get(mode, mode)  # anything else must be refused
    return render(
        FORMATS[case["version"]],
        messages,
        tools,
        thinking=thinking,
        drop_thinking=args.get("drop_thinking", True),
        reasoning_effort=args.get("reasoning_effort"),
        add_bos=args.get("add_default_bos_token", True),
    )


@pytest.mark.parametrize("case", _cases())
def test_golden_encode(case: dict[str, Any]) -> None:
    if case["id"] in ENCODE_EXEMPT:
        _check_exemption(case)
        pytest.skip(ENCODE_EXEMPT[case["id"]])
    if "expected_error" in case:
        with pytest.raises(TemplateError) as err:
            _run(case)
        assert REFUSAL_NAMES[case["expected_error"]["reason"]] in err.value.message
        assert err.value.status == 400
        return
    assert _run(case) == case["expected_prompt"]


def _check_exemption(case: dict[str, Any]) -> None:
    """An exemption must match a property of the case, not a failure."""
    reason = ENCODE_EXEMPT[case["id"]]
    if "context" in reason:
        assert case.get("context")
    elif "wo_eos" in reason:
        assert any(m.get("wo_eos") for m in case["messages"])
    elif "strict arguments" in reason:
        with pytest.raises(TemplateError, match=r"function\.arguments: not valid JSON"):
            _run(case)
    else:
        index = case.get("tools_attach_index")
        if index is None:
            index = next(i for i, m in enumerate(case["messages"]) if "tools" in m)
        assert index != _attach_target(case["messages"])


def test_exemptions_name_real_cases() -> None:
    ids = {c["id"] for f in ("dsml/encode_dsv32.jsonl", "dsml/encode_dsv4.jsonl") for c in load_jsonl(f)}
    assert set(ENCODE_EXEMPT) <= ids


# ---- callgate's own choices -------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.mark.parametrize("fmt", ["dsml-v3.2", "dsml-v4"])
def test_tools_without_system_message_open_the_prompt(fmt: str) -> None:
    prompt = render(fmt, [{"role": "user", "content": "hi"}], [WEATHER])
    spec = get_format(fmt)
    assert prompt.startswith(spec.bos + "\n\n## Tools\n")
    assert prompt.index('"name": "get_weather"') < prompt.index(spec.markers.user)


@pytest.mark.parametrize("fmt", ["dsml-v3.2", "dsml-v4"])
def test_text_part_lists_are_joined(fmt: str) -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert render(fmt, [{"role": "user", "content": parts}]) == render(fmt, [{"role": "user", "content": "one\n\ntwo"}])
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with pytest.raises(TemplateError, match=r"messages\[0\]\.content\[1\]"):
        render(fmt, [{"role": "user", "content": [parts[0], image]}])


@pytest.mark.parametrize("fmt", ["dsml-v3.2", "dsml-v4"])
def test_object_arguments_render_like_their_json_string(fmt: str) -> None:
    def turn(arguments: Any) -> list[dict[str, Any]]:
        call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        return [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}]

    as_object = render(fmt, turn({"city": "Oslo", "n": 2}), [WEATHER])
    assert as_object == render(fmt, turn('{"city": "Oslo", "n": 2}'), [WEATHER])
    assert 'string="false">2<' in as_object


@pytest.mark.parametrize("fmt", ["dsml-v3.2", "dsml-v4"])
def test_no_generation_header_when_asked(fmt: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    spec = get_format(fmt)
    with_header = render(fmt, msgs, thinking=True)
    without = render(fmt, msgs, thinking=True, add_generation_prompt=False)
    assert with_header == without + spec.markers.assistant + "<think>"


def test_v32_refuses_what_it_cannot_represent() -> None:
    user = {"role": "user", "content": "hi"}
    with pytest.raises(TemplateError, match="reasoning_effort"):
        render("dsml-v3.2", [user], reasoning_effort="max")
    with pytest.raises(TemplateError, match=r"messages\[0\]\.task"):
        render("dsml-v3.2", [{**user, "task": "query"}])
    with pytest.raises(TemplateError, match=r"messages\[1\]\.role"):
        render("dsml-v3.2", [user, {"role": "latest_reminder", "content": "x"}])


def test_v4_task_survives_merging_into_tool_results() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    msgs = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "user", "content": "title please", "task": "title"},
    ]
    prompt = render("dsml-v4", msgs, [WEATHER])
    assert prompt.endswith("<tool_result>sunny</tool_result>\n\ntitle please<｜title｜>")


def test_v4_quick_task_tokens_come_from_the_spec() -> None:
    spec = get_format("dsml-v4")
    assert set(spec.quick_tasks) == {"action", "query", "authority", "domain", "title", "read_url"}
    for task, token in spec.quick_tasks.items():
        prompt = render("dsml-v4", [{"role": "user", "content": "q", "task": task}])
        assert prompt.endswith(token)
        assert token in spec.special_tokens


def test_packaged_texts_are_the_golden_fixed_texts() -> None:
    """The renderer reads its long constants from the package, never from tests/ or golden/."""
    golden = json.loads((GOLDEN / "dsml" / "fixed_texts.json").read_text(encoding="utf-8"))
    packaged = json.loads(resources.files("callgate.templates").joinpath("dsml_texts.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in packaged.items() if not k.startswith("_")} == {
        k: v for k, v in golden.items() if not k.startswith("_")
    }
    for version, texts in packaged.items():
        if not version.startswith("_"):
            assert all(fixed_text(version, key) == value for key, value in texts.items())
