"""qwen3-xml renderer: refused inputs name the message and field; deliberate choices hold."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.errors import TemplateError
from callgate.formats import get_format
from callgate.templates import render

FORMAT = "qwen3-xml"
FMT = get_format(FORMAT)


def _call_turn(arguments: Any, name: str = "f") -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
    return [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]}]


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        (_call_turn("{not json"), r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: not valid JSON"),
        (_call_turn("[1, 2]"), r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: must be a JSON object"),
        (_call_turn('{"a": 1, "a": 2}'), r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: not valid JSON"),
        (_call_turn("{}", name="get weather"), r"messages\[1\]\.tool_calls\[0\]\.function\.name"),
        (_call_turn("{}", name=""), r"messages\[1\]\.tool_calls\[0\]\.function\.name"),
        (_call_turn('{"a/b": 1}'), r"messages\[1\]\.tool_calls\[0\]\.function\.arguments\.a/b"),
        (_call_turn('{"code": "x\\n</parameter>\\ny"}'), r"function\.arguments\.code: the value holds"),
        (_call_turn('{"code": "</parameter> at the start"}'), r"function\.arguments\.code: the value holds"),
        (_call_turn('{"html": "</function>"}'), r"function\.arguments\.html: the value holds"),
        (_call_turn('{"doc": {"k": "<tool_call>"}}'), r"function\.arguments\.doc: the value holds"),
        (_call_turn('{"t": "bye<|im_end|>"}'), r"function\.arguments\.t: the value holds"),
        ([{"role": "narrator", "content": "x"}], r"messages\[0\]\.role: 'narrator'"),
        ([{"role": "user", "content": None}], r"messages\[0\]\.content: expected a string"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], r"messages\[0\]\.content\[0\]: only text parts"),
        ([{"role": "user", "content": "x", "task": "summarize"}], r"messages\[0\]\.task: 'summarize'"),
        ([{"role": "assistant", "content": "x", "task": "title"}], r"messages\[0\]\.task: 'title'"),
    ],
)
def test_refused_input_names_message_and_field(messages: list[dict[str, Any]], field: str) -> None:
    with pytest.raises(TemplateError, match=field):
        render(FORMAT, messages)


def test_refused_tool_name() -> None:
    tools = [{"type": "function", "function": {"name": "mcp/search", "parameters": {}}}]
    with pytest.raises(TemplateError, match=r"tools\[0\]\.function\.name"):
        render(FORMAT, [{"role": "user", "content": "x"}], tools)


def test_thinking_is_refused_and_reasoning_ignored() -> None:
    with pytest.raises(TemplateError, match="thinking"):
        render(FORMAT, [{"role": "user", "content": "x"}], thinking=True)
    plain = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with_reasoning = [plain[0], {**plain[1], "reasoning_content": "secret plan"}]
    assert render(FORMAT, with_reasoning) == render(FORMAT, plain)


def test_values_are_written_like_the_template() -> None:
    args = '{"s": "True", "b": true, "n": null, "f": 19.0, "i": 12345678901234567890, "o": {"k": [false, "é"]}}'
    prompt = render(FORMAT, _call_turn(args), add_generation_prompt=False)
    values = [block.split("\n")[1] for block in prompt.split("<parameter=")[1:]]
    assert values == ["True", "True", "None", "19.0", "12345678901234567890", '{"k": [false, "é"]}']


def test_text_parts_are_joined_and_developer_is_system() -> None:
    parts = [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]
    prompt = render(FORMAT, [{"role": "developer", "content": parts}, {"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tool_results_first_still_open_a_user_turn() -> None:
    messages = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    prompt = render(FORMAT, messages, add_generation_prompt=False)
    assert (
        prompt
        == "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>\n<|im_end|>\n"
    )


@pytest.mark.parametrize("task", sorted(FMT.quick_tasks))
def test_quick_task_extends_the_user_turn(task: str) -> None:
    base = [{"role": "user", "content": "Best trails near Zurich?"}]
    plain = render(FORMAT, base, add_generation_prompt=False)
    with_task = render(FORMAT, [{**base[0], "task": task}], add_generation_prompt=False)
    instruction = FMT.quick_tasks[task]
    assert with_task == plain.replace("Zurich?<|im_end|>", "Zurich?\n\n" + instruction + "<|im_end|>")
    # the main prompt and the head share everything up to the end of the user text
    assert with_task.startswith(plain[: plain.index("<|im_end|>")])
