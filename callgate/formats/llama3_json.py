"""The llama3-json format (Llama 3.1, 3.2); see golden/llama3-json/FORMAT.md.

Knows: the renderer's markers (sections 1-5, fixed_texts.json): a turn is
header_open ROLE header_close TEXT end_of_turn; a call turn's TEXT is
call_open NAME call_parameters json.dumps(arguments) call_close. Tools are
json.dumps(tool, indent=tools_indent) + tool_separator each, after the prefix of
`tools_position` ("user": first user message, the template default; "system"). The
parser's: one bare call object, optionally after python_tag (layout "single").
Does not know: rendering, parsing or constraining.
Rendered by templates/llama3.py (templates/json_messages.py), parsed by parsers/json_*.py,
constrained by constraints/lark_json.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from callgate.formats.quick_tasks import TEXT_QUICK_TASKS
from callgate.formats.spec import FormatMarkers, ToolCallFormat

ToolsPosition = Literal["user", "system"]

# Llama 3.1 tokenizer control tokens: the named ones and <|reserved_special_token_0..247|>.
_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(248)),
)


@dataclass(frozen=True, slots=True)
class Llama3Markers(FormatMarkers):
    """The llama3-json texts: the renderer's, then the parser's call syntax."""

    header_open: str
    header_close: str
    end_of_turn: str
    end_of_message: str
    python_tag: str
    tool_role: str
    call_open: str
    call_parameters: str
    call_close: str
    environment_line: str
    knowledge_line: str
    date_prefix: str
    date_suffix: str
    today_date: str
    tools_position: ToolsPosition
    tools_indent: int
    tool_separator: str
    tools_in_user_prefix: str
    tools_in_system_prefix: str
    quick_task_join: str
    call_layout: Literal["single"]
    name_key: str
    arguments_key: str
    call_in_text: str


LLAMA3_JSON = ToolCallFormat(
    name="llama3-json",
    family="json",
    framing="llama3.1",
    argument_encoding="json",
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    call_trigger='{"name"',
    reasoning_open=None,
    reasoning_close=None,
    markers=Llama3Markers(
        header_open="<|start_header_id|>",
        header_close="<|end_header_id|>\n\n",
        end_of_turn="<|eot_id|>",
        end_of_message="<|eom_id|>",
        python_tag="<|python_tag|>",
        tool_role="ipython",
        call_open='{"name": "',
        call_parameters='", "parameters": ',
        call_close="}",
        environment_line="Environment: ipython\n",
        knowledge_line="Cutting Knowledge Date: December 2023\n",
        date_prefix="Today Date: ",
        date_suffix="\n\n",
        today_date="26 Jul 2024",
        tools_position="user",
        tools_indent=4,
        tool_separator="\n\n",
        tools_in_user_prefix="Given the following functions, please respond with a JSON for a function call "
        "with its proper arguments that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n",
        tools_in_system_prefix="You have access to the following functions. To call a function, please "
        "respond with JSON for a function call."
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n",
        quick_task_join="\n\n",
        call_layout="single",
        name_key="name",
        arguments_key="parameters",
        call_in_text='{"name":',
    ),
    special_tokens=_SPECIAL_TOKENS,
    quick_tasks=TEXT_QUICK_TASKS,
)
