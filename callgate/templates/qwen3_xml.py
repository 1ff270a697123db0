"""Messages + tools -> a Qwen3-Coder prompt (the qwen3-xml format), byte for byte as the
official template (August 2025 revision) writes it; see golden/qwen3-xml/FORMAT.md.

Knows: ChatML framing, the tools block, the XML call layout and how the template writes
values (Python `str()` for scalars -- `True`, `None`, `19.0` -- and JSON for objects and
arrays). Does not know: parsing, engines, HTTP.

Deliberate differences from the reference, each for structure or safety:
* Untrusted text cannot create structure. In tool results, user/system/developer content,
  plain assistant content and client-written tool descriptions, every `<|` (the start of
  every Qwen control token) and every call / result / reasoning tag (`<tool_call>`,
  `</tool_response>`, `<function=`, `</parameter>`, `<think>`, ...) gets a zero-width
  joiner (U+200D) after its `<`. The text reads the same, but it no longer spells a
  token or a tag, so a tool result cannot close its `<tool_response>`, end the turn or
  forge a call. The reference inserts such text verbatim.
* A call that the format cannot write unambiguously is refused with TemplateError: a name
  that is empty or holds whitespace, `<`, `>`, `=`, quotes or `/`; a value whose text
  holds `\\n</parameter>`, `\\n<parameter=`, `</function>`, `<tool_call>`,
  `</tool_call>` or a control token; arguments that are not a JSON object.
* `developer` is written as `system`; a run of tool results always opens its user turn
  (the reference omits the header when a tool message comes first); roles other than
  system, developer, user, assistant and tool are refused.
* The template has no reasoning: `reasoning_content` is ignored (as the reference does),
  `reasoning_effort` is ignored and `thinking=True` is refused.
* A `task` (quick-instruction head) on a user message appends the format's
  `quick_tasks` instruction to that user text, after a blank line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from callgate.errors import TemplateError
from callgate.formats import Qwen3XmlMarkers, ToolCallFormat
from callgate.templates.tool_arguments import decode_arguments

NEUTRALISER = "\u200d"  # zero-width joiner, written after the `<` of a would-be marker
DEFAULT_SYSTEM = "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
_TOOLS_HEADER = "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>"
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_BAD_NAME = re.compile(r"[\s<>=\"'/]")


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
    del drop_thinking, reasoning_effort, add_bos  # no reasoning, no BOS text in this framing
    if thinking:
        raise TemplateError("thinking: the qwen3-xml format has no reasoning mode", param="thinking")
    for i, message in enumerate(messages):
        _check_role(i, message)
    has_system = bool(messages) and messages[0].get("role") in ("system", "developer")
    parts = [_system_turn(fmt, _content(0, messages[0]) if has_system else None, tools or ())]
    first = 1 if has_system else 0
    for i in range(first, len(messages)):
        parts.append(_message(fmt, messages, i))
    if add_generation_prompt:
        parts.append(fmt.markers_as(Qwen3XmlMarkers).turn_open + "assistant\n")
    return "".join(parts)


def unrepresentable_in_values(fmt: ToolCallFormat) -> tuple[str, ...]:
    """Texts that no parameter value (as written, with its leading newline) may hold."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    sep = m.separator
    control = tuple(t for t in fmt.special_tokens if t.startswith("<|"))
    return (sep + m.parameter_close, sep + m.parameter_open, m.function_close, m.call_open,
            m.call_close, *control)  # fmt: skip


def neutralise(fmt: ToolCallFormat, text: str) -> str:
    """`text` with a zero-width joiner after the `<` of every marker it spells."""
    return _marker_pattern(fmt).sub(lambda m: m.group()[0] + NEUTRALISER + m.group()[1:], text)


_PATTERNS: dict[str, tuple[ToolCallFormat, re.Pattern[str]]] = {}


def _marker_pattern(fmt: ToolCallFormat) -> re.Pattern[str]:
    """The compiled marker alternation of `fmt`, built once per format object."""
    cached = _PATTERNS.get(fmt.name)
    if cached is None or cached[0] is not fmt:
        cached = _PATTERNS[fmt.name] = (fmt, _compile_markers(fmt))
    return cached[1]


def _compile_markers(fmt: ToolCallFormat) -> re.Pattern[str]:
    m = fmt.markers_as(Qwen3XmlMarkers)
    tags = [t for t in fmt.special_tokens if not t.startswith("<|")]
    tags += [m.function_open, m.function_close, m.parameter_open, m.parameter_close]
    alternatives = ["<|", *sorted(set(tags), key=len, reverse=True)]
    return re.compile("|".join(re.escape(a) for a in alternatives))


# ---- system turn and tools ----------------------------------------------------------------


def _system_turn(fmt: ToolCallFormat, system: str | None, tools: Sequence[Mapping[str, Any]]) -> str:
    if system is None and not tools:
        return ""
    m = fmt.markers_as(Qwen3XmlMarkers)
    text = neutralise(fmt, system) if system is not None else DEFAULT_SYSTEM
    if tools:
        blocks = "".join(_tool_block(fmt, i, tool) for i, tool in enumerate(tools))
        text += _TOOLS_HEADER + blocks + _instructions(fmt)
    return m.turn_open + "system\n" + text + m.turn_close + "\n"


def _instructions(fmt: ToolCallFormat) -> str:
    """The fixed text after the tools: closing tag, an example call, the reminder."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    example = _call_text(
        fmt,
        "example_function_name",
        [
            ("example_parameter_1", "value_1"),
            ("example_parameter_2", "This is the value for the second parameter\nthat can span\nmultiple lines"),
        ],
    )
    wrapper = f"an inner {m.function_open}...>{m.function_close} block must be nested within " + (
        f"{m.call_open}{m.call_close} XML tags"
    )
    return (
        "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
        + example
        + "\n\n<IMPORTANT>\nReminder:\n"
        + f"- Function calls MUST follow the specified format: {wrapper}\n"
        + "- Required parameters MUST be specified\n"
        + "- You may provide optional reasoning for your function call in natural language BEFORE the function"
        + " call, but NOT after\n"
        + "- If there is no function call available, answer the question like normal with your current"
        + " knowledge and do not tell the user about function calls\n</IMPORTANT>"
    )


def _tool_block(fmt: ToolCallFormat, i: int, tool: Mapping[str, Any]) -> str:
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping):
        raise TemplateError(f"tools[{i}].function: expected an object", param=f"tools[{i}]")
    name = _checked_name(fn.get("name"), f"tools[{i}].function.name")
    out = "\n<function>\n<name>" + name + "</name>"
    if "description" in fn:
        out += "\n<description>" + neutralise(fmt, str(fn["description"]).strip()) + "</description>"
    out += "\n<parameters>"
    params = fn.get("parameters")
    props = params.get("properties") if isinstance(params, Mapping) else None
    for pname, fields in props.items() if isinstance(props, Mapping) else ():
        out += _property_block(fmt, str(pname), fields)
    out += _extra_keys(fmt, params, ("type", "properties")) + "\n</parameters>"
    return out + _extra_keys(fmt, fn, ("type", "name", "description", "parameters")) + "\n</function>"


def _property_block(fmt: ToolCallFormat, name: str, fields: Any) -> str:
    out = "\n<parameter>\n<name>" + neutralise(fmt, name) + "</name>"
    if isinstance(fields, Mapping):
        if "type" in fields:
            out += "\n<type>" + str(fields["type"]) + "</type>"
        if "description" in fields:
            out += "\n<description>" + neutralise(fmt, str(fields["description"]).strip()) + "</description>"
        out += _extra_keys(fmt, fields, ("name", "type", "description"))
    return out + "\n</parameter>"


def _extra_keys(fmt: ToolCallFormat, d: Any, handled: Iterable[str]) -> str:
    """`\\n<KEY>VALUE</KEY>` for every other key: JSON for objects/arrays, str() otherwise."""
    if not isinstance(d, Mapping):
        return ""
    skip = frozenset(handled)
    return "".join(
        f"\n<{key}>{neutralise(fmt, _jinja_text(value))}</{key}>" for key, value in d.items() if key not in skip
    )


def _jinja_text(value: Any) -> str:
    """What the template prints: `tojson` for objects and arrays, Python str() for the rest."""
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# ---- messages -----------------------------------------------------------------------------


def _check_role(i: int, message: Mapping[str, Any]) -> None:
    role = message.get("role")
    if role not in _ROLES:
        known = ", ".join(sorted(_ROLES))
        raise TemplateError(f"messages[{i}].role: {role!r} is not one of {known}", param=f"messages[{i}].role")
    if role != "user" and message.get("task") is not None:
        raise TemplateError(f"messages[{i}].task: {message['task']!r} on a {role} message; only user messages take one")


def _message(fmt: ToolCallFormat, messages: Sequence[Mapping[str, Any]], i: int) -> str:
    message, m = messages[i], fmt.markers_as(Qwen3XmlMarkers)
    role = message["role"]
    if role == "tool":
        return _tool_result(fmt, messages, i)
    if role == "assistant" and message.get("tool_calls"):
        return _call_turn(fmt, i, message)
    if role == "assistant":
        text = neutralise(fmt, _content(i, message, allow_none=True))
    else:
        text = neutralise(fmt, _content(i, message)) + _task(fmt, i, message)
    header = "system" if role == "developer" else role
    return m.turn_open + header + "\n" + text + m.turn_close + "\n"


def _tool_result(fmt: ToolCallFormat, messages: Sequence[Mapping[str, Any]], i: int) -> str:
    m = fmt.markers_as(Qwen3XmlMarkers)
    opens = i == 0 or messages[i - 1].get("role") != "tool"
    closes = i == len(messages) - 1 or messages[i + 1].get("role") != "tool"
    body = m.result_open + "\n" + neutralise(fmt, _content(i, messages[i])) + "\n" + m.result_close + "\n"
    head = m.turn_open + "user\n" if opens else ""
    return head + body + (m.turn_close + "\n" if closes else "")


def _task(fmt: ToolCallFormat, i: int, message: Mapping[str, Any]) -> str:
    task = message.get("task")
    if task is None:
        return ""
    if task not in fmt.quick_tasks:
        known = ", ".join(fmt.quick_tasks)
        raise TemplateError(f"messages[{i}].task: {task!r} is not a quick task ({known})", param=f"messages[{i}].task")
    return "\n\n" + fmt.quick_tasks[task]


def _content(i: int, message: Mapping[str, Any], *, allow_none: bool = False) -> str:
    """A message's text: a string, or OpenAI text parts joined; None only where allowed."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and allow_none:
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise TemplateError(f"messages[{i}].content[{j}]: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise TemplateError(f"messages[{i}].content: expected a string or text parts, got {type(content).__name__}")


def _call_turn(fmt: ToolCallFormat, i: int, message: Mapping[str, Any]) -> str:
    m = fmt.markers_as(Qwen3XmlMarkers)
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        raise TemplateError(f"messages[{i}].tool_calls: expected a list")
    content = message.get("content")
    text = _content(i, message).strip() if isinstance(content, (str, list)) else ""
    out = m.turn_open + "assistant" + ("\n" + neutralise(fmt, text) + "\n" if text else "")
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise TemplateError(f"{where}.function: expected an object")
        name = _checked_name(fn.get("name"), where + ".function.name")
        arguments = decode_arguments(fn.get("arguments"), where + ".function.arguments")
        field = where + ".function.arguments"
        params = [(_checked_name(k, f"{field}.{k}"), _value(fmt, v, f"{field}.{k}")) for k, v in arguments.items()]
        out += "\n" + _call_text(fmt, name, params)
    return out + m.turn_close + "\n"


def _call_text(fmt: ToolCallFormat, name: str, params: Sequence[tuple[str, str]]) -> str:
    """One `<tool_call>` block, as the model writes it."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    sep = m.separator
    end = m.tag_end
    body = "".join(m.parameter_open + key + end + sep + text + sep + m.parameter_close + sep for key, text in params)
    head = m.call_open + sep + m.function_open + name + end + sep
    return head + body + m.function_close + sep + m.call_close


def _checked_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name or _BAD_NAME.search(name):
        raise TemplateError(
            f"{where}: {name!r} is not a name the format can write (non-empty; no whitespace, <, >, =, quotes, /)"
        )
    return name


def _value(fmt: ToolCallFormat, value: Any, where: str) -> str:
    """The value as the template prints it, refused where the parser could not read it back."""
    text = value if isinstance(value, str) else _jinja_text(value)
    written = fmt.markers_as(Qwen3XmlMarkers).separator + text
    for marker in unrepresentable_in_values(fmt):
        if marker in written:
            raise TemplateError(f"{where}: the value holds {marker!r}, which the qwen3-xml format cannot write")
    return text
