"""Llama 3.1 / 3.2 prompts with JSON tool calls (format `llama3-json`). Pure Python.

Knows: Meta's chat template of Llama-3.1-8B-Instruct (primary) and Llama-3.2-3B-Instruct as the
golden vectors pin it (golden/llama3-json): the system turn that is always written (ipython
environment line when tools are given, knowledge and today dates, then the system message), the
tool list as indent-4 JSON in the first user message (or, as a spec option, in the system turn),
one call per assistant turn written `{"name": NAME, "parameters": ARGS}`, tool results as
`ipython` turns holding the result as a JSON string literal, and contents trimmed. Every literal
comes from the format spec (callgate.formats, llama3-json section). Two variants differ only in
the date: Llama 3.1 defaults to 26 Jul 2024, Llama 3.2 prints today's date; `llama3_variant`
builds a spec with another date or tool position.
The message-reading helpers it shares with the mistral renderer live in templates/json_messages.py.
Does not know: built-in tools (`<|python_tag|>NAME.call(...)` and `<|eom_id|>`), which are not
JSON calls and not part of `llama3-json`; parsing; tokenisation.

Untrusted text. The reference pastes text verbatim, so a tool result or user message containing
`<|eot_id|>` or `<|start_header_id|>` would turn into a control token once the prompt is tokenised
with special tokens. Here every occurrence of a control-token text of the format is neutralised:
* in raw text (system, user and assistant contents) a zero-width joiner U+200D goes after its
  first character (`<` U+200D `|eot_id|>`);
* in JSON text (tool results, call arguments, the tool list) its first character is written as a
  JSON escape (`\\u003c|eot_id|>`), which decodes to exactly the same value, so nothing is lost.
Without such text the output is byte-identical to the reference.

Refused (TemplateError, naming the message index and field) where the reference would write a
prompt the model cannot read back: arguments that are not a JSON object, a call name that cannot be
written raw between quotes, tools given but the first message after the system message is not a
user message, reasoning to keep (the format has none), unknown roles and content parts. Also
refused as the reference does: anything but exactly one call in a tool-call turn, tools without a
first user message.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.formats import Llama3Markers, ToolCallFormat, ToolsPosition
from callgate.templates.json_messages import (
    CHAT_ROLES,
    ZERO_WIDTH_JOINER,
    check_options,
    check_reasoning,
    content_text,
    dump_json,
    message_role,
    neutralise_json,
    neutralise_text,
    quick_task,
    template_error,
)
from callgate.templates.tool_arguments import decode_arguments

__all__ = [
    "CHAT_ROLES",
    "ZERO_WIDTH_JOINER",
    "check_options",
    "check_reasoning",
    "content_text",
    "decode_arguments",
    "dump_json",
    "llama3_variant",
    "message_role",
    "neutralise_json",
    "neutralise_text",
    "quick_task",
    "render",
    "template_error",
]

_LLAMA3_ROLES = {**CHAT_ROLES, "ipython": "tool"}


# ---- llama3-json ------------------------------------------------------------------------------


_TOOLS_POSITIONS: dict[str, ToolsPosition] = {"user": "user", "system": "system"}


def llama3_variant(
    fmt: ToolCallFormat,
    *,
    framing: str | None = None,
    today_date: str | None = None,
    tools_position: str | None = None,
) -> ToolCallFormat:
    """A copy of the llama3-json spec with another framing name ("llama3.2"), date (the template's
    `date_string`) or tool position ("system": the template's `tools_in_user_message=false`)."""
    markers = fmt.markers_as(Llama3Markers)
    if today_date is not None:
        markers = dataclasses.replace(markers, today_date=today_date)
    if tools_position is not None:
        if tools_position not in _TOOLS_POSITIONS:
            raise ValueError(f"tools_position must be 'user' or 'system', got {tools_position!r}")
        markers = dataclasses.replace(markers, tools_position=_TOOLS_POSITIONS[tools_position])
    return dataclasses.replace(fmt, framing=framing or fmt.framing, markers=markers)


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Message:
    where: str
    role: str  # system | user | assistant | tool
    sent_role: str  # the role as the client sent it (`developer` reads as system)
    text: str  # joined content, not yet trimmed or neutralised
    instruction: str | None  # quick-instruction text to append
    call: _Call | None  # set for a tool-call turn (its content is dropped, as the template does)


def _read_call(message: Mapping[str, Any], where: str, fmt: ToolCallFormat) -> _Call:
    calls = message["tool_calls"]
    if not isinstance(calls, list) or len(calls) != 1:
        count = len(calls) if isinstance(calls, list) else type(calls).__name__
        raise template_error(
            f"{where}.tool_calls", f"This model only supports single tool-calls at once! (got {count})"
        )
    call_where = f"{where}.tool_calls[0].function"
    function = calls[0].get("function") if isinstance(calls[0], Mapping) else None
    if not isinstance(function, Mapping):
        raise template_error(call_where, "missing")
    name = function.get("name")
    if not isinstance(name, str) or not name or json.dumps(name, ensure_ascii=False)[1:-1] != name:
        raise template_error(f"{call_where}.name", f"{name!r} cannot be written raw inside the call's quotes")
    if neutralise_text(name, fmt) != name:
        raise template_error(f"{call_where}.name", f"{name!r} contains a control token")
    return _Call(name, decode_arguments(function.get("arguments"), f"{call_where}.arguments"))


def _read_message(index: int, message: object, fmt: ToolCallFormat, drop_thinking: bool) -> _Message:
    where = f"messages[{index}]"
    role = message_role(message, where, _LLAMA3_ROLES)
    assert isinstance(message, Mapping)
    check_reasoning(message, where, fmt, drop_thinking)
    instruction = quick_task(message, where, role, fmt)
    sent = str(message["role"])
    if role == "assistant" and message.get("tool_calls") is not None:
        return _Message(where, role, sent, "", None, _read_call(message, where, fmt))
    text = "".join(content_text(message.get("content"), f"{where}.content"))
    return _Message(where, role, sent, text, instruction, None)


def _turn(fmt: ToolCallFormat, role: str, body: str) -> str:
    m = fmt.markers_as(Llama3Markers)
    return m.header_open + role + m.header_close + body + m.end_of_turn


def _plain_body(fmt: ToolCallFormat, msg: _Message) -> str:
    """Trimmed, neutralised content plus the quick-instruction text, if any."""
    body = neutralise_text(msg.text.strip(), fmt)
    if msg.instruction is None:
        return body
    return fmt.markers_as(Llama3Markers).quick_task_join.join(p for p in (body, msg.instruction) if p)


def _tool_list(fmt: ToolCallFormat, tools: Sequence[Mapping[str, Any]]) -> str:
    m = fmt.markers_as(Llama3Markers)
    indent, sep = m.tools_indent, m.tool_separator
    return "".join(neutralise_json(dump_json(t, f"tools[{i}]", indent=indent), fmt) + sep for i, t in enumerate(tools))


def _system_turn(fmt: ToolCallFormat, system: _Message | None, tools: Sequence[Mapping[str, Any]] | None) -> str:
    m = fmt.markers_as(Llama3Markers)
    head = m.environment_line if tools is not None else ""
    head += m.knowledge_line + m.date_prefix + m.today_date + m.date_suffix
    if tools is not None and m.tools_position == "system":
        head += m.tools_in_system_prefix + _tool_list(fmt, tools)
    return _turn(fmt, "system", head + (_plain_body(fmt, system) if system else ""))


def _message_turn(fmt: ToolCallFormat, msg: _Message) -> str:
    m = fmt.markers_as(Llama3Markers)
    if msg.call is not None:
        args = neutralise_json(dump_json(msg.call.arguments, f"{msg.where}.tool_calls[0].function.arguments"), fmt)
        return _turn(fmt, "assistant", m.call_open + msg.call.name + m.call_parameters + args + m.call_close)
    if msg.role == "tool":
        return _turn(fmt, m.tool_role, neutralise_json(dump_json(msg.text, f"{msg.where}.content"), fmt))
    return _turn(fmt, msg.role, _plain_body(fmt, msg))


def _first_user_turn(fmt: ToolCallFormat, msgs: Sequence[_Message], tools: Sequence[Mapping[str, Any]]) -> str:
    if not msgs:
        raise template_error(
            "messages", "Cannot put tools in the first user message when there's no first user message!"
        )
    first = msgs[0]
    if first.role != "user" or first.call is not None:
        # The reference would print this message as the user's question (it takes the first
        # message after the system message whatever its role), and it has one system turn.
        raise template_error(
            f"{first.where}.role",
            "the tool list goes into the first user message, which must come right after the system"
            f" message; got {first.sent_role} (write the system and developer instructions as one message)",
        )
    prefix = fmt.markers_as(Llama3Markers).tools_in_user_prefix
    return _turn(fmt, "user", prefix + _tool_list(fmt, tools) + _plain_body(fmt, first))


def _render_turns(
    fmt: ToolCallFormat, msgs: list[_Message], tools: Sequence[Mapping[str, Any]] | None
) -> Iterable[str]:
    system = msgs.pop(0) if msgs and msgs[0].role == "system" else None
    yield _system_turn(fmt, system, tools)
    if tools is not None and fmt.markers_as(Llama3Markers).tools_position == "user":
        yield _first_user_turn(fmt, msgs, tools)
        msgs = msgs[1:]
    for msg in msgs:
        yield _message_turn(fmt, msg)


def render(
    fmt: ToolCallFormat,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    thinking: bool,
    drop_thinking: bool,
    reasoning_effort: str | None,
    add_bos: bool,
    add_generation_prompt: bool,
) -> str:
    """The llama3-json prompt for `messages` (see the module docstring); TemplateError on input
    the format cannot represent. `tools=[]` counts as tools given, as in the reference."""
    check_options(fmt, thinking=thinking, reasoning_effort=reasoning_effort)
    msgs = [_read_message(i, m, fmt, drop_thinking) for i, m in enumerate(messages)]
    if tools is not None and not isinstance(tools, Sequence):
        raise template_error("tools", f"expected a list, got {type(tools).__name__}")
    parts = [fmt.bos if add_bos else "", *_render_turns(fmt, msgs, tools)]
    if add_generation_prompt:
        m = fmt.markers_as(Llama3Markers)
        parts.append(m.header_open + "assistant" + m.header_close)
    return "".join(parts)
