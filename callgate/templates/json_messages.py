"""Message reading shared by the JSON-call renderers (llama3-json, mistral). Pure Python.

Knows: OpenAI message fields (roles, content parts, reasoning, the quick-instruction
`task`; tool-call arguments are read by templates/tool_arguments.py), the neutralisation
of control-token text (a zero-width joiner after its first character in raw text, a JSON
escape of that character in JSON text; see templates/llama3.py), and TemplateErrors that
name the message index and field.
Does not know: any prompt layout.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from callgate.errors import TemplateError
from callgate.formats import ToolCallFormat
from callgate.templates.render_options import RenderOptions

ZERO_WIDTH_JOINER = "\u200d"

# OpenAI roles -> the roles the renderers know ("developer" is the newer name of "system").
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def template_error(where: str, what: str) -> TemplateError:
    """A TemplateError whose message and `param` name the offending field."""
    return TemplateError(f"{where}: {what}", param=where)


@functools.lru_cache(maxsize=16)
def _token_pattern(tokens: tuple[str, ...]) -> re.Pattern[str]:
    ordered = sorted(set(tokens), key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in ordered))


def neutralise_text(text: str, fmt: ToolCallFormat) -> str:
    """Break every control-token text of `fmt` in raw text with U+200D after its first character."""
    if not fmt.special_tokens:
        return text
    return _token_pattern(fmt.special_tokens).sub(lambda m: m[0][0] + ZERO_WIDTH_JOINER + m[0][1:], text)


def neutralise_json(json_text: str, fmt: ToolCallFormat) -> str:
    """Escape the first character of every control-token text in JSON output as `\\uXXXX`.

    Control-token texts contain no quote, so in JSON they only occur inside string literals,
    where the escape decodes to the same character: the value is unchanged.
    """
    if not fmt.special_tokens:
        return json_text
    return _token_pattern(fmt.special_tokens).sub(lambda m: f"\\u{ord(m[0][0]):04x}" + m[0][1:], json_text)


def dump_json(value: Any, where: str, *, indent: int | None = None) -> str:
    """json.dumps as the references write it (non-ASCII raw); TemplateError if not JSON."""
    try:
        return json.dumps(value, ensure_ascii=False, indent=indent, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise template_error(where, f"not JSON-serialisable ({exc})") from None


def content_text(content: object, where: str) -> list[str]:
    """The text pieces of an OpenAI content: None -> [], a string, or a list of text parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise template_error(where, f"expected a string or a list of text parts, got {type(content).__name__}")
    pieces: list[str] = []
    for j, part in enumerate(content):
        if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise template_error(f"{where}[{j}]", "only text parts are supported")
        pieces.append(part["text"])
    return pieces


def check_options(fmt: ToolCallFormat, options: RenderOptions) -> None:
    """Reasoning switches a format without a reasoning block cannot honour."""
    if options.thinking and fmt.reasoning_open is None:
        raise template_error("thinking", f"{fmt.name} has no reasoning block")
    if options.reasoning_effort is not None:
        raise template_error("reasoning_effort", f"not supported by {fmt.name}")


def check_reasoning(message: Mapping[str, Any], where: str, fmt: ToolCallFormat, drop_thinking: bool) -> None:
    """Earlier reasoning is dropped; keeping it is impossible without a reasoning block."""
    if message.get("reasoning_content") and not drop_thinking:
        raise template_error(f"{where}.reasoning_content", f"{fmt.name} has no reasoning block to keep it in")


def quick_task(message: Mapping[str, Any], where: str, role: str, fmt: ToolCallFormat) -> str | None:
    """The instruction text of the message's `task`, or None."""
    task = message.get("task")
    if task is None:
        return None
    if role != "user":
        raise template_error(f"{where}.task", "only a user message can carry a quick-instruction head")
    if not isinstance(task, str) or task not in fmt.quick_tasks:
        raise template_error(f"{where}.task", f"unknown task {task!r}; known: {', '.join(fmt.quick_tasks)}")
    return fmt.quick_tasks[task]


def message_role(message: object, where: str, roles: Mapping[str, str]) -> str:
    if not isinstance(message, Mapping):
        raise template_error(where, f"expected an object, got {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or role not in roles:
        raise template_error(f"{where}.role", f"unsupported role {role!r}")
    return roles[role]
