"""Mistral prompts with `[TOOL_CALLS]` JSON lists (format `mistral`, tokenizer v3 tekken). Pure Python.

Knows: what mistral-common's `MistralTokenizer.v3(is_tekken=True).encode_chat_completion` writes
(golden/mistral), as text: its request checks, its normalisation (system messages joined and put in
front of the last user message; consecutive user or assistant messages merged with a blank line;
assistant text right-stripped of spaces; an empty user turn first when the conversation does not
start with one), the tool list before the last user message, calls as one JSON list
`[{"name", "arguments", "id"}]` after `[TOOL_CALLS]`, each tool result as
`[TOOL_RESULTS]{"content": C, "call_id": ID}[/TOOL_RESULTS]` with C parsed as JSON when it parses.
The Hugging Face template differs (FORMAT.md section 6); mistral-common is followed. Every literal
comes from the format spec (callgate.formats, mistral section).
Does not know: tokenisation, other tokenizer versions (SentencePiece v3, v7, v11+), parsing.

Untrusted text. mistral-common encodes message text as ordinary tokens, so text that looks like a
control token (`[TOOL_CALLS]`, `[INST]`, `</s>`, ...) never becomes one in its token ids; its text view
cannot show the difference. A text prompt has to carry it: every occurrence of a control-token
text of the format is neutralised, in raw text (user, system, assistant contents) with a zero-width
joiner U+200D after its first character, in JSON text (tool results, call arguments, the tool list)
by writing that character as a JSON escape (`\\u005bTOOL_CALLS]`), which decodes to the same value.
So the control tokens of a rendered prompt are exactly those of the reference's token ids.

`add_generation_prompt=False` additionally allows the conversation to end with an assistant
message (written complete, with `</s>`); mistral-common refuses that for serving. Refused beyond
the reference (TemplateError): arguments that are not a JSON object (the reference would embed
them as a JSON string), reasoning to keep, unknown content parts.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.errors import TemplateError
from callgate.formats import MistralMarkers, ToolCallFormat, call_id_pattern
from callgate.templates.json_messages import (
    CHAT_ROLES,
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

__all__ = ["render"]

# mistral-common's allowed role transitions (previous role -> roles that may follow).
_NEXT_ROLES = {
    "system": {"user", "assistant", "system"},
    "user": {"assistant", "system", "user"},
    "assistant": {"assistant", "user", "tool"},
    "tool": {"assistant", "tool", "user"},
}


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    arguments: dict[str, Any]
    call_id: str


@dataclass(frozen=True, slots=True)
class _Message:
    index: int
    role: str  # system | user | assistant | tool
    pieces: tuple[str, ...]  # non-empty text pieces (content parts and quick-instruction text)
    has_content: bool  # the content field is truthy (mistral-common's test)
    calls: tuple[_Call, ...] | None  # None: no tool_calls field (or null)
    call_id: str | None  # tool messages


@dataclass(frozen=True, slots=True)
class _Turn:
    """A normalised message: consecutive user / assistant messages merged."""

    role: str
    text: str
    calls: tuple[_Call, ...]
    call_id: str | None
    first_index: int


def _full(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


def _bad_name(where: str, name: object) -> TemplateError:
    return template_error(
        where,
        f"Function name was {name} but must be a-z, A-Z, 0-9, or contain underscores and dashes, "
        "with a maximum length of 64.",
    )


def _bad_id(where: str, call_id: object) -> TemplateError:
    return template_error(where, f"Tool call id was {call_id} but must be a-z, A-Z, 0-9, with a length of 9.")


def _read_call(raw: object, where: str, fmt: ToolCallFormat) -> _Call:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise template_error(where, "expected {id, type, function: {name, arguments}}")
    call_id = raw.get("id")
    if call_id is None:
        raise template_error(
            f"{where}.id", "Tool call id 'null' is only allowed for the last assistant message in finetuning mode."
        )
    if not isinstance(call_id, str) or not _full(call_id_pattern(fmt), call_id):
        raise _bad_id(f"{where}.id", call_id)
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _full(fmt.markers_as(MistralMarkers).name_pattern, name):
        raise _bad_name(f"{where}.function.name", name)
    # mistral-common reads "" as {} too; here "" is not JSON, refused as in every format
    return _Call(name, decode_arguments(function.get("arguments"), f"{where}.function.arguments"), call_id)


def _read_tool_fields(message: Mapping[str, Any], where: str, fmt: ToolCallFormat) -> str:
    call_id = message.get("tool_call_id")
    if call_id is None:
        raise template_error(f"{where}.tool_call_id", "Tool call id has to be defined.")
    if not isinstance(call_id, str) or not _full(call_id_pattern(fmt), call_id):
        raise _bad_id(f"{where}.tool_call_id", call_id)
    name = message.get("name")
    if name is not None and not (isinstance(name, str) and _full(fmt.markers_as(MistralMarkers).name_pattern, name)):
        raise _bad_name(f"{where}.name", name)
    return call_id


def _read_message(index: int, message: object, fmt: ToolCallFormat, drop_thinking: bool) -> _Message:
    where = f"messages[{index}]"
    role = message_role(message, where, CHAT_ROLES)
    assert isinstance(message, Mapping)
    check_reasoning(message, where, fmt, drop_thinking)
    content = message.get("content")
    if role == "system" and content is None:
        raise template_error(f"{where}.content", "System prompt must have content")
    pieces = [p for p in content_text(content, f"{where}.content") if p]
    instruction = quick_task(message, where, role, fmt)
    if instruction is not None:
        pieces.append(instruction)
    raw_calls = message.get("tool_calls") if role == "assistant" else None
    calls = None
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise template_error(f"{where}.tool_calls", "expected a list")
        calls = tuple(_read_call(c, f"{where}.tool_calls[{j}]", fmt) for j, c in enumerate(raw_calls))
    call_id = _read_tool_fields(message, where, fmt) if role == "tool" else None
    return _Message(index, role, tuple(pieces), bool(content) or instruction is not None, calls, call_id)


# ---- request checks (mistral-common's validator, "test" mode) ---------------------------------


def _check_assistant(msg: _Message) -> None:
    if msg.has_content == bool(msg.calls):
        raise template_error(
            f"messages[{msg.index}]", "Assistant message must have either content or tool_calls, but not both."
        )


def _check_structure(msgs: Sequence[_Message], add_generation_prompt: bool) -> None:
    if not msgs:
        raise template_error("messages", "Conversation must have at least one message")
    if len(msgs) == 1 and msgs[0].role not in ("user", "system"):
        raise template_error("messages[0].role", "Conversation must start with a user message or system message")
    if len(msgs) > 1 and msgs[-1].role == "assistant" and add_generation_prompt:
        raise template_error(
            f"messages[{msgs[-1].index}].role",
            "Expected last role User or Tool (or Assistant with prefix) for serving but got assistant",
        )
    for prev, msg in itertools.pairwise(msgs):
        if msg.role not in _NEXT_ROLES[prev.role]:
            raise template_error(
                f"messages[{msg.index}].role", f"Unexpected role '{msg.role}' after role '{prev.role}'"
            )
    pending = 0
    for msg in msgs[1:]:  # the reference skips the first message here
        if msg.role == "tool":
            pending -= 1
        elif msg.role == "assistant":
            if pending != 0:
                raise template_error(f"messages[{msg.index}]", "Not the same number of function calls and responses")
            pending = len(msg.calls) if msg.calls is not None else 0
    for msg in msgs:
        if msg.role == "assistant":
            _check_assistant(msg)


# ---- normalisation ------------------------------------------------------------------------------


def _merge(group: Sequence[_Message], join: str) -> _Turn:
    text = join.join(p for m in group for p in m.pieces)
    calls = tuple(c for m in group for c in (m.calls or ()))
    return _Turn(group[0].role, text, calls, None, group[0].index)


def _turns(msgs: Sequence[_Message], join: str) -> list[_Turn]:
    """Consecutive same-role groups: users and assistants merged, each tool message alone,
    system messages dropped (they go in front of the last user turn)."""
    turns: list[_Turn] = []
    group: list[_Message] = []
    for msg in [*msgs, None]:
        if group and (msg is None or msg.role != group[0].role):
            if group[0].role == "tool":
                turns.extend(_Turn("tool", join.join(m.pieces), (), m.call_id, m.index) for m in group)
            elif group[0].role != "system":
                turns.append(_merge(group, join))
            group = []
        if msg is not None:
            group.append(msg)
    if not turns or turns[0].role != "user":
        turns.insert(0, _Turn("user", "", (), None, -1))
    return turns


def _system_prompt(msgs: Sequence[_Message], join: str) -> str | None:
    texts = [join.join(m.pieces) for m in msgs if m.role == "system" and m.has_content]
    return join.join(texts) if texts else None


# ---- writing ------------------------------------------------------------------------------------


def _tool_list(fmt: ToolCallFormat, tools: Sequence[Mapping[str, Any]]) -> str:
    """mistral-common's Tool model: {"type": "function", "function": {name, description, parameters}}."""
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise template_error(where, 'expected {"type": "function", "function": {...}}')
        name = function.get("name")
        if not isinstance(name, str) or not _full(fmt.markers_as(MistralMarkers).name_pattern, name):
            raise _bad_name(f"{where}.function.name", name)
        description = function.get("description") or ""
        parameters = function.get("parameters")
        if parameters is None:
            # mistral-common's Function requires one; callgate reads an omitted one as any
            # object (README), and shows the model the schema ChatRequest.schema_of uses
            parameters = {"type": "object", "properties": {}}
        if not isinstance(description, str):
            raise template_error(f"{where}.function.description", "expected a string")
        if not isinstance(parameters, Mapping):
            raise template_error(f"{where}.function.parameters", "expected a JSON Schema object")
        out.append(
            {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
        )
    m = fmt.markers_as(MistralMarkers)
    return m.tools_open + neutralise_json(dump_json(out, "tools"), fmt) + m.tools_close


def _tool_result(fmt: ToolCallFormat, turn: _Turn) -> str:
    text = turn.text or "{}"  # mistral-common reads an empty result as {}
    try:
        content: Any = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, an integer past int()'s limit, too deep
        content = text
    # A result that reads as JSON with a non-finite number (`1e999`, `NaN`) is written the way
    # mistral-common writes it (`Infinity`, `NaN`): a tool's output is data, not a request error.
    body = json.dumps({"content": content, "call_id": turn.call_id}, ensure_ascii=False)
    m = fmt.markers_as(MistralMarkers)
    return m.results_open + neutralise_json(body, fmt) + m.results_close


def _assistant(fmt: ToolCallFormat, turn: _Turn) -> str:
    where = f"messages[{turn.first_index}]"
    if turn.calls and turn.text:
        raise template_error(where, "Cannot have tool calls and content defined in the same assistant message")
    if turn.calls:
        calls = [{"name": c.name, "arguments": c.arguments, "id": c.call_id} for c in turn.calls]
        listed = neutralise_json(dump_json(calls, f"{where}.tool_calls"), fmt)
        return fmt.markers_as(MistralMarkers).calls + listed + fmt.eos
    if not turn.text:
        raise template_error(f"{where}.content", "an assistant message needs content or tool_calls")
    return neutralise_text(turn.text.rstrip(" "), fmt) + fmt.eos


def _user(fmt: ToolCallFormat, turn: _Turn, system: str | None, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """`system`/`tools` are given for the last user turn only."""
    head = _tool_list(fmt, tools) if tools else ""
    m = fmt.markers_as(MistralMarkers)
    text = m.message_join.join((system, turn.text)) if system else turn.text
    return head + m.inst_open + neutralise_text(text, fmt) + m.inst_close


def _write(
    fmt: ToolCallFormat, turns: Sequence[_Turn], system: str | None, tools: Sequence[Mapping[str, Any]] | None
) -> Iterator[str]:
    last_user = max(k for k, t in enumerate(turns) if t.role == "user")
    for k, turn in enumerate(turns):
        if turn.role == "user":
            yield _user(fmt, turn, *((system, tools) if k == last_user else (None, None)))
        elif turn.role == "assistant":
            yield _assistant(fmt, turn)
        else:
            yield _tool_result(fmt, turn)


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
    """The mistral prompt for `messages` (see the module docstring); TemplateError on input the
    format cannot represent. There is no generation header: the model answers after `[/INST]`
    or `[/TOOL_RESULTS]`."""
    check_options(fmt, thinking=thinking, reasoning_effort=reasoning_effort)
    msgs = [_read_message(i, m, fmt, drop_thinking) for i, m in enumerate(messages)]
    _check_structure(msgs, add_generation_prompt)
    join = fmt.markers_as(MistralMarkers).message_join
    turns = _turns(msgs, join)
    body = "".join(_write(fmt, turns, _system_prompt(msgs, join), tools))
    return (fmt.bos if add_bos else "") + body
