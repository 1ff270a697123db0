"""The hermes formats (ChatML: Qwen3, Qwen2.5, Hermes, SmolLM): `hermes` under the Qwen3
framing and `hermes-qwen2.5` under the Qwen2.5-Instruct one; see golden/hermes/FORMAT.md.

Knows: the call layout (sections 5 and 8), spelled with these markers:
  CONTENT ["\\n" <tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>]* <|im_end|>
calls are separated by exactly `call_separator`; the body is one strict JSON object with
exactly the keys `name_key` and `arguments_key`. Tool results go back in a user turn as
<tool_response>\\nRESULT\\n</tool_response>. The long system-prompt texts are the Qwen3 /
Qwen2.5 templates' own (golden/hermes/fixed_texts.json). Also the two framing names (the
Qwen3 framing reads `reasoning_effort="none"` as its `enable_thinking=False`).
Does not know: rendering, parsing or constraining.
Rendered by templates/chatml.py, parsed by parsers/json_*.py (parsers/json_spec.py reads these
markers), constrained by constraints/lark_json.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from callgate.formats.quick_tasks import TEXT_QUICK_TASKS
from callgate.formats.spec import FormatMarkers, ToolCallFormat

QWEN3_FRAMING = "chatml-qwen3"
QWEN25_FRAMING = "chatml-qwen2.5"

_CALL_OPEN = "<tool_call>"
_CALL_CLOSE = "</tool_call>"
_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    f"{_CALL_OPEN}{_CALL_CLOSE} XML tags:\n{_CALL_OPEN}\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    f"{_CALL_CLOSE}"
)


@dataclass(frozen=True, slots=True)
class HermesMarkers(FormatMarkers):
    """The hermes texts: the parser's and renderer's call syntax, then the renderer's."""

    call_layout: Literal["object"]
    block_open: str
    block_close: str
    call_separator: str
    name_key: str
    arguments_key: str
    turn_open: str
    turn_close: str
    result_open: str
    result_close: str
    tools_open: str
    tools_close: str
    tools_intro: str
    tools_outro: str
    # Qwen2.5 variant: a default system prompt, and the tools text after a blank line
    qwen25_default_system: str


HERMES = ToolCallFormat(
    name="hermes",
    family="json",
    framing=QWEN3_FRAMING,
    argument_encoding="json",
    bos="",
    eos="<|im_end|>",
    call_trigger=_CALL_OPEN,
    reasoning_open="<think>",
    reasoning_close="</think>",
    markers=HermesMarkers(
        call_layout="object",
        block_open=_CALL_OPEN,
        block_close=_CALL_CLOSE,
        call_separator="\n",
        name_key="name",
        arguments_key="arguments",
        turn_open="<|im_start|>",
        turn_close="<|im_end|>",
        result_open="<tool_response>",
        result_close="</tool_response>",
        tools_open="<tools>",
        tools_close="</tools>",
        tools_intro=_TOOLS_INTRO,
        tools_outro=_TOOLS_OUTRO,
        qwen25_default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    ),
    special_tokens=(
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        _CALL_OPEN,
        _CALL_CLOSE,
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ),
    # No task tokens in ChatML: a quick head is one more user turn holding the instruction,
    # so the conversation before it is byte-identical to the main prompt.
    quick_tasks=TEXT_QUICK_TASKS,
)

# The same calls under the Qwen2.5-Instruct framing (Qwen2.5, Qwen2.5-Coder): the template
# writes a default system prompt when the conversation has none, and has no reasoning
# block, so `<think>` is plain text for these models (neither reasoning nor a tag).
HERMES_QWEN25 = dataclasses.replace(
    HERMES,
    name="hermes-qwen2.5",
    framing=QWEN25_FRAMING,
    reasoning_open=None,
    reasoning_close=None,
    special_tokens=tuple(t for t in HERMES.special_tokens if t not in ("<think>", "</think>")),
)
