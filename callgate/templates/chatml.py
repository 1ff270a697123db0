"""Messages + tools -> a ChatML prompt in the `hermes` format (JSON calls in <tool_call>),
byte for byte as the Qwen3 chat template writes it (framing "chatml-qwen3", primary) or
the Qwen2.5-Instruct template (framing "chatml-qwen2.5": the format `hermes-qwen2.5`);
golden/hermes/FORMAT.md describes both.

Knows: ChatML turns, the tools block, the call layout, tool results as <tool_response> in a
user turn, and Qwen3's reasoning rules (reasoning of turns after the last user query is
kept as <think>...</think>, earlier reasoning is dropped, the final assistant turn always
carries a -- possibly empty -- think block). Every literal comes from the format spec.
Does not know: parsing, engines, HTTP.

Parameters:
* `thinking=True` opens the reasoning block in the generation prompt (`<think>\\n`); parse
  the output with thinking=True. `thinking=False` is the template's default: no block, the
  model may open one itself.
* `reasoning_effort="none"` is Qwen3's `enable_thinking=False`: an empty, closed think
  block after the generation prompt. Other OpenAI levels are accepted and change nothing.
* `drop_thinking=False` keeps the reasoning of every assistant turn, not only the turns
  after the last user query. `add_bos` changes nothing (ChatML has no BOS text).
* A `task` (quick-instruction head) on the last message appends the spec's `quick_tasks`
  instruction: after a blank line inside that user message, or as one more user turn
  after any other role.

Deliberate differences from the reference, for structure and safety:
* Untrusted text cannot create structure. In system, user and tool-result text and in
  assistant content and reasoning, every `<|` (the start of every Qwen control token) and
  every tag of the format (`<tool_call>`, `</tool_response>`, `<think>`, `</tools>`, ...)
  gets a zero-width joiner (U+200D) after its `<`: the text reads the same but spells no
  token or tag, so a tool result cannot close its <tool_response>, end the turn or forge a
  call. Inside JSON (tool schemas, call arguments) the same `<` is written as the JSON
  escape `\\u003c` instead, which decodes to the identical value. The reference inserts
  such text verbatim (golden `hermes_vis_tool_result_injection` pins that).
* Call arguments are re-serialised canonically (`json.dumps(..., ensure_ascii=False)`),
  so the prompt shows them exactly as the parser reads them; the reference pastes an
  arguments string verbatim (golden `hermes_vis_raw_arguments_string`). Arguments that
  are not a JSON object, and names the format cannot write, raise TemplateError.
* `developer` is written as `system`; other unknown roles raise TemplateError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from callgate.errors import TemplateError
from callgate.formats import HermesMarkers, ToolCallFormat
from callgate.templates.tool_arguments import decode_arguments

NEUTRALISER = "\u200d"  # zero-width joiner, written after the `<` of a would-be marker
JSON_LT = "\\u003c"  # `<` inside a JSON string, same value
QWEN3, QWEN25 = "chatml-qwen3", "chatml-qwen2.5"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high"})


@dataclass(frozen=True, slots=True)
class _Message:
    role: str  # system | user | assistant | tool
    text: str
    reasoning: str | None  # reasoning_content when it is a string
    calls: tuple[tuple[str, str], ...]  # (name, canonical arguments JSON)
    task: str | None


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
    """The prompt text. Raises TemplateError naming the message index and field."""
    del add_bos  # ChatML writes no BOS text
    qwen3 = _is_qwen3(fmt, thinking, reasoning_effort)
    msgs = [_message(fmt, i, m, last=i == len(messages) - 1) for i, m in enumerate(messages)]
    parts = [_system_turn(fmt, msgs, _tools_json(fmt, tools), qwen3)]
    last_query = _last_query(fmt, msgs) if qwen3 else len(msgs)
    for i in range(1 if msgs and msgs[0].role == "system" else 0, len(msgs)):
        parts.append(_turn(fmt, msgs, i, qwen3=qwen3, last_query=last_query, drop_thinking=drop_thinking))
    if msgs and msgs[-1].task is not None and msgs[-1].role != "user":
        parts.append(_plain_turn(fmt, "user", fmt.quick_tasks[msgs[-1].task]))
    if add_generation_prompt:
        parts.append(_generation_prompt(fmt, thinking, reasoning_effort))
    return "".join(parts)


def _is_qwen3(fmt: ToolCallFormat, thinking: bool, reasoning_effort: str | None) -> bool:
    if fmt.framing not in (QWEN3, QWEN25):
        raise TemplateError(f"framing {fmt.framing!r} is not a ChatML framing this renderer knows")
    if reasoning_effort is not None and reasoning_effort not in _EFFORTS:
        raise TemplateError(
            f"reasoning_effort: {reasoning_effort!r} is not one of {', '.join(sorted(_EFFORTS))}",
            param="reasoning_effort",
        )
    qwen3 = fmt.framing == QWEN3
    if thinking and (not qwen3 or reasoning_effort == "none"):
        why = "the Qwen2.5 framing has no reasoning" if not qwen3 else "reasoning_effort 'none' disables reasoning"
        raise TemplateError(f"thinking: {why}", param="thinking")
    return qwen3


# ---- neutralisation -----------------------------------------------------------------------


def _marker_pattern(fmt: ToolCallFormat) -> re.Pattern[str]:
    m = fmt.markers_as(HermesMarkers)
    return _compile_markers((*fmt.special_tokens, m.tools_open, m.tools_close))


@cache
def _compile_markers(markers: tuple[str, ...]) -> re.Pattern[str]:
    tags = [t for t in markers if not t.startswith("<|")]
    alternatives = ["<|", *sorted(set(tags), key=len, reverse=True)]
    return re.compile("|".join(re.escape(a) for a in alternatives))


def neutralise(fmt: ToolCallFormat, text: str) -> str:
    """`text` with a zero-width joiner after the `<` of every marker it spells."""
    return _marker_pattern(fmt).sub(lambda m: m.group()[0] + NEUTRALISER + m.group()[1:], text)


def neutralise_json(fmt: ToolCallFormat, text: str) -> str:
    """JSON text (as json.dumps writes it) with the `<` of every marker escaped as \\u003c.
    Outside strings JSON has no `<`, so the decoded value is unchanged."""
    return _marker_pattern(fmt).sub(lambda m: JSON_LT + m.group()[1:], text)


# ---- input --------------------------------------------------------------------------------


def _message(fmt: ToolCallFormat, i: int, message: Mapping[str, Any], *, last: bool) -> _Message:
    if not isinstance(message, Mapping):
        raise TemplateError(f"messages[{i}]: expected an object", param=f"messages[{i}]")
    given = message.get("role")
    role = _ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise TemplateError(
            f"messages[{i}].role: {message.get('role')!r} is not one of {', '.join(_ROLES)}",
            param=f"messages[{i}].role",
        )
    reasoning = message.get("reasoning_content")
    calls = _calls(fmt, i, message.get("tool_calls")) if role == "assistant" else ()
    return _Message(role, _content(i, message), reasoning if isinstance(reasoning, str) else None, calls,
                    _task(fmt, i, message, last))  # fmt: skip


def _content(i: int, message: Mapping[str, Any]) -> str:
    """A message's text: a string, OpenAI text parts joined, or "" for null."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise TemplateError(f"messages[{i}].content[{j}]: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise TemplateError(f"messages[{i}].content: expected a string or text parts, got {type(content).__name__}")


def _task(fmt: ToolCallFormat, i: int, message: Mapping[str, Any], last: bool) -> str | None:
    task = message.get("task")
    if task is None:
        return None
    if not last or task not in fmt.quick_tasks:
        known = ", ".join(fmt.quick_tasks)
        raise TemplateError(
            f"messages[{i}].task: {task!r} is not a quick task on the last message (known: {known})",
            param=f"messages[{i}].task",
        )
    return str(task)


def _calls(fmt: ToolCallFormat, i: int, calls: Any) -> tuple[tuple[str, str], ...]:
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise TemplateError(f"messages[{i}].tool_calls: expected a list", param=f"messages[{i}].tool_calls")
    out = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise TemplateError(f"{where}.function: expected an object", param=where)
        out.append((_name(fmt, fn.get("name"), where), _arguments(fmt, fn.get("arguments"), where)))
    return tuple(out)


def _name(fmt: ToolCallFormat, name: Any, where: str) -> str:
    # The template pastes the name between quotes; only names that need no JSON escaping
    # and spell no marker come back out of the parser unchanged.
    if not isinstance(name, str) or not name or json.dumps(name, ensure_ascii=False)[1:-1] != name:
        raise TemplateError(f"{where}.function.name: {name!r} is not a name the format can write", param=where)
    if _marker_pattern(fmt).search(name):
        raise TemplateError(f"{where}.function.name: {name!r} spells a control token or tag", param=where)
    return name


def _arguments(fmt: ToolCallFormat, arguments: Any, where: str) -> str:
    value = decode_arguments(arguments, where + ".function.arguments")
    return neutralise_json(fmt, json.dumps(value, ensure_ascii=False))


def _tools_json(fmt: ToolCallFormat, tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
    out = []
    for j, tool in enumerate(tools or ()):
        if not isinstance(tool, Mapping):
            raise TemplateError(f"tools[{j}]: expected an object", param=f"tools[{j}]")
        try:
            out.append(neutralise_json(fmt, json.dumps(tool, ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError) as e:
            raise TemplateError(f"tools[{j}]: not representable as JSON ({e})", param=f"tools[{j}]") from None
    return out


# ---- output -------------------------------------------------------------------------------


def _plain_turn(fmt: ToolCallFormat, role: str, text: str) -> str:
    m = fmt.markers_as(HermesMarkers)
    return m.turn_open + role + "\n" + text + m.turn_close + "\n"


def _system_turn(fmt: ToolCallFormat, msgs: list[_Message], tools: list[str], qwen3: bool) -> str:
    m = fmt.markers_as(HermesMarkers)
    system = neutralise(fmt, msgs[0].text) if msgs and msgs[0].role == "system" else None
    if not qwen3 and system is None:
        system = m.qwen25_default_system
    if not tools:
        return "" if system is None else _plain_turn(fmt, "system", system)
    head = "" if system is None else system + "\n\n"
    listing = "".join("\n" + t for t in tools)
    return m.turn_open + "system\n" + head + m.tools_intro + listing + m.tools_outro + m.turn_close + "\n"


def _last_query(fmt: ToolCallFormat, msgs: list[_Message]) -> int:
    """Qwen3: the last user message that is not a bare tool response."""
    m = fmt.markers_as(HermesMarkers)
    for i in range(len(msgs) - 1, -1, -1):
        text = msgs[i].text
        if msgs[i].role == "user" and not (text.startswith(m.result_open) and text.endswith(m.result_close)):
            return i
    return len(msgs) - 1


def _turn(
    fmt: ToolCallFormat, msgs: list[_Message], i: int, *, qwen3: bool, last_query: int, drop_thinking: bool
) -> str:
    msg = msgs[i]
    if msg.role == "tool":
        return _tool_result(fmt, msgs, i)
    if msg.role == "assistant":
        keep_final = i > last_query and i == len(msgs) - 1
        return _assistant(fmt, msg, qwen3=qwen3, keep_final=keep_final, keep_any=i > last_query or not drop_thinking)
    text = neutralise(fmt, msg.text)
    if msg.task is not None:
        text += "\n\n" + fmt.quick_tasks[msg.task]
    return _plain_turn(fmt, msg.role, text)


def _split_reasoning(fmt: ToolCallFormat, msg: _Message) -> tuple[str, str]:
    """(reasoning, content) as Qwen3 reads them: reasoning_content, or a leading
    <think>...</think> written into the content."""
    if msg.reasoning is not None:
        return msg.reasoning, msg.text
    close, open_ = fmt.reasoning_close or "", fmt.reasoning_open or ""
    if not close or close not in msg.text:
        return "", msg.text
    parts = msg.text.split(close)
    reasoning = parts[0].rstrip("\n").split(open_)[-1].lstrip("\n")
    return reasoning, parts[-1].lstrip("\n")


def _assistant(fmt: ToolCallFormat, msg: _Message, *, qwen3: bool, keep_final: bool, keep_any: bool) -> str:
    m = fmt.markers_as(HermesMarkers)
    reasoning, content = _split_reasoning(fmt, msg) if qwen3 else ("", msg.text)
    head = m.turn_open + "assistant\n"
    if qwen3 and (keep_final or (keep_any and reasoning)):
        head += fmt.reasoning_open or ""
        head += "\n" + neutralise(fmt, reasoning.strip("\n")) + "\n" + (fmt.reasoning_close or "") + "\n\n"
        head += neutralise(fmt, content.lstrip("\n"))
    else:
        head += neutralise(fmt, content)
    sep = m.call_separator
    for j, (name, arguments) in enumerate(msg.calls):
        if j > 0 or content:
            head += sep
        head += _call_text(fmt, name, arguments)
    return head + m.turn_close + "\n"


def _call_text(fmt: ToolCallFormat, name: str, arguments: str) -> str:
    """One call block, exactly as the model writes it."""
    m = fmt.markers_as(HermesMarkers)
    body = "{" + json.dumps(m.name_key) + ': "' + name + '", ' + json.dumps(m.arguments_key) + ": "
    return m.block_open + "\n" + body + arguments + "}\n" + m.block_close


def _tool_result(fmt: ToolCallFormat, msgs: list[_Message], i: int) -> str:
    m = fmt.markers_as(HermesMarkers)
    opens = i == 0 or msgs[i - 1].role != "tool"
    closes = i == len(msgs) - 1 or msgs[i + 1].role != "tool"
    head = m.turn_open + "user" if opens else ""
    body = "\n" + m.result_open + "\n" + neutralise(fmt, msgs[i].text) + "\n" + m.result_close
    tail = m.turn_close + "\n" if closes else ""
    return head + body + tail


def _generation_prompt(fmt: ToolCallFormat, thinking: bool, reasoning_effort: str | None) -> str:
    m = fmt.markers_as(HermesMarkers)
    out = m.turn_open + "assistant\n"
    if thinking:
        out += (fmt.reasoning_open or "") + "\n"
    elif reasoning_effort == "none" and fmt.framing == QWEN3:
        out += (fmt.reasoning_open or "") + "\n\n" + (fmt.reasoning_close or "") + "\n\n"
    return out
