"""OpenAI-style messages -> validated DSML turns (`Msg`), before any layout.

Knows: which fields callgate reads from a message (role, content, reasoning_content,
tool_calls, tool_call_id, response_format, task), how content-part lists are joined, how
tool-call arguments are decoded, and where the request's tools are attached (the first
system message; else the first developer message; else a new empty system message at the
start). Does not know: the prompt layout of either DeepSeek version.

Raises callgate.errors.TemplateError naming the message index and field for input that
cannot be represented. Unknown extra fields are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from callgate.errors import TemplateError
from callgate.templates.tool_arguments import decode_arguments

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "latest_reminder"})
PART_SEPARATOR = "\n\n"  # how text parts of a list-valued content are joined (V4 reference, tool results)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: Mapping[str, Any]  # decoded arguments object, in input key order


@dataclass(frozen=True, slots=True)
class Msg:
    """One message after validation. `where` is its path in the request, for errors."""

    where: str
    role: str
    content: str | None
    reasoning: str | None = None
    calls: tuple[Call, ...] = ()
    call_ids: tuple[str, ...] = ()
    tool_call_id: str = ""
    tools: tuple[Mapping[str, Any], ...] = ()  # function objects, as written in the tools block
    response_format: Any = None
    task: str | None = None


def normalize(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    roles: frozenset[str],
) -> list[Msg]:
    """Validate every message, then attach `tools`. Arguments are read by the one strict
    rule (templates/tool_arguments.py) in both versions: the V4 reference's fallback, which
    passes arguments that are not JSON on as one string parameter named "arguments", is
    not followed (a refusal, as in every other format)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str):
        raise TemplateError("messages: expected a list of message objects", param="messages")
    out = [_message(i, m, roles) for i, m in enumerate(messages)]
    functions = _functions(tools)
    return _attach_tools(out, functions) if functions else out


def _message(i: int, raw: Any, roles: frozenset[str]) -> Msg:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise TemplateError(f"{where}: expected an object", param=where)
    role = raw.get("role")
    if role not in roles:
        raise TemplateError(f"{where}.role: unknown role {role!r} (expected one of {sorted(roles)})", param=where)
    content = _content(f"{where}.content", raw.get("content"), tool=role == "tool")
    if role == "user" and content is None:
        raise TemplateError(f"{where}.content: a user message needs text content", param=f"{where}.content")
    if role == "developer" and not content:
        raise TemplateError(f"{where}.content: a developer message needs non-empty content", param=f"{where}.content")
    reasoning = raw.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise TemplateError(f"{where}.reasoning_content: expected a string", param=f"{where}.reasoning_content")
    task = raw.get("task")
    if task is not None and not isinstance(task, str):
        raise TemplateError(f"{where}.task: expected a string", param=f"{where}.task")
    raw_calls = raw.get("tool_calls") or []
    if role != "assistant" and raw_calls:
        raise TemplateError(f"{where}.tool_calls: only assistant messages carry tool calls", param=where)
    if not isinstance(raw_calls, Sequence) or isinstance(raw_calls, str):
        raise TemplateError(f"{where}.tool_calls: expected a list", param=f"{where}.tool_calls")
    calls = tuple(_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(raw_calls))
    ids = tuple(str(c.get("id") or "") if isinstance(c, Mapping) else "" for c in raw_calls)
    return Msg(
        where=where,
        role=role,
        content=content,
        reasoning=reasoning,
        calls=calls,
        call_ids=ids,
        tool_call_id=str(raw.get("tool_call_id") or ""),
        response_format=raw.get("response_format"),
        task=task,
    )


def _content(where: str, value: Any, *, tool: bool) -> str | None:
    """A string, None, or a list of content parts joined by a blank line. Non-text parts
    are written `[Unsupported TYPE]` in tool results (V4 reference) and refused elsewhere."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, Sequence):
        raise TemplateError(f"{where}: expected a string or a list of text parts", param=where)
    texts: list[str] = []
    for k, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif tool and isinstance(part, Mapping):
            texts.append(f"[Unsupported {kind}]")
        else:
            raise TemplateError(f"{where}[{k}]: unsupported content part {kind!r} (only text parts)", param=where)
    return PART_SEPARATOR.join(texts)


def _call(where: str, raw: Any) -> Call:
    fn = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(fn, Mapping):
        raise TemplateError(f"{where}.function: expected an object with name and arguments", param=where)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise TemplateError(f"{where}.function.name: expected a non-empty string", param=f"{where}.function.name")
    return Call(name=name, arguments=decode_arguments(fn.get("arguments"), f"{where}.function.arguments"))


def _functions(tools: Sequence[Mapping[str, Any]] | None) -> tuple[Mapping[str, Any], ...]:
    if tools is None:
        return ()
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        raise TemplateError("tools: expected a list of tool objects", param="tools")
    out: list[Mapping[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise TemplateError(f"tools[{i}].function: expected an object with a name", param=f"tools[{i}]")
        out.append(fn)
    return tuple(out)


def _attach_tools(msgs: list[Msg], functions: tuple[Mapping[str, Any], ...]) -> list[Msg]:
    for role in ("system", "developer"):
        for i, m in enumerate(msgs):
            if m.role == role:
                return [*msgs[:i], replace(m, tools=functions), *msgs[i + 1 :]]
    return [Msg(where="tools", role="system", content="", tools=functions), *msgs]


def last_user_index(msgs: Sequence[Msg]) -> int:
    """Position of the last user or developer message; -1 when there is none."""
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role in ("user", "developer"):
            return i
    return -1
