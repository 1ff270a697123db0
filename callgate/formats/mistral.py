"""The mistral format (mistral-common v3 tekken); see golden/mistral/FORMAT.md.

Knows: the layout (sections 1-4):
  bos, then per turn: user [tools_open JSON tools_close] inst_open TEXT inst_close
  assistant TEXT eos | calls JSON-list eos ; tool results_open JSON results_close
the control tokens (the 20 named ones of tekken_240718 plus <SPECIAL_20..999>), and the
form of the call ids the model writes itself (exactly 9 letters/digits). The parser's
layout is "list": one JSON list of call objects after `calls`.
Does not know: rendering, parsing or constraining.
Rendered by templates/mistral.py, parsed by parsers/json_*.py, constrained by
constraints/lark_json.py.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Literal

from callgate.formats.quick_tasks import TEXT_QUICK_TASKS
from callgate.formats.spec import CallIdForm, FormatMarkers, ToolCallFormat

_SPECIAL_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
    *(f"<SPECIAL_{i}>" for i in range(20, 1000)),
)

# mistral-common v3 tekken: ids of exactly 9 letters/digits
CALL_IDS = CallIdForm(alphabet=string.ascii_letters + string.digits, length=9, pattern="[a-zA-Z0-9]{9}")


@dataclass(frozen=True, slots=True)
class MistralMarkers(FormatMarkers):
    """The mistral texts: the renderer's, then the parser's call syntax."""

    inst_open: str
    inst_close: str
    tools_open: str
    tools_close: str
    results_open: str
    results_close: str
    calls: str
    message_join: str
    name_pattern: str  # a regex (no anchors): the tool names the format can write
    quick_task_join: str
    call_layout: Literal["list"]
    name_key: str
    arguments_key: str
    id_key: str


MISTRAL = ToolCallFormat(
    name="mistral",
    family="json",
    framing="mistral-v3-tekken",
    argument_encoding="json",
    bos="<s>",
    eos="</s>",
    call_trigger="[TOOL_CALLS]",
    reasoning_open=None,
    reasoning_close=None,
    markers=MistralMarkers(
        inst_open="[INST]",
        inst_close="[/INST]",
        tools_open="[AVAILABLE_TOOLS]",
        tools_close="[/AVAILABLE_TOOLS]",
        results_open="[TOOL_RESULTS]",
        results_close="[/TOOL_RESULTS]",
        calls="[TOOL_CALLS]",
        message_join="\n\n",
        name_pattern="[a-zA-Z0-9_-]{1,64}",
        quick_task_join="\n\n",
        call_layout="list",
        name_key="name",
        arguments_key="arguments",
        id_key="id",
    ),
    special_tokens=_SPECIAL_TOKENS,
    quick_tasks=TEXT_QUICK_TASKS,
    call_ids=CALL_IDS,
)
