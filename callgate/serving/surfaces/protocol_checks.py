"""Checks of a parsed wire request beyond its shape: the request limits (tools, schema size,
depth and `$ref`s, messages, stop sequences) and OpenAI's rules (tool_choice names a declared
tool, tool messages answer a preceding call, schemas are valid Draft 2020-12 objects).

Knows: `Limits` and the wire models. Each check returns the field in the form the validated
request keeps (plain dicts, tuples) or raises `InvalidRequestError` naming the field.
Does not know: HTTP, templates, engines, parsers or validators.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from callgate import strict_json
from callgate.errors import InvalidRequestError
from callgate.serving.settings import Limits
from callgate.serving.surfaces.protocol_wire import MessageWire, NamedToolChoiceWire, ResponseFormatWire, ToolWire

ToolChoice = Literal["none", "auto", "required"] | Mapping[str, Any]


def check_tools(tools: list[ToolWire] | None, limits: Limits) -> tuple[Mapping[str, Any], ...] | None:
    """The tools as OpenAI dicts (None when none were sent): within the limits, unique names,
    parameters a valid object schema."""
    if tools is None:
        return None
    if len(tools) > limits.max_tools:
        raise InvalidRequestError(f"tools: {len(tools)} tools exceed the limit {limits.max_tools}", param="tools")
    seen: set[str] = set()
    out: list[Mapping[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.function
        param = f"tools[{i}].function"
        if fn.name in seen:
            raise InvalidRequestError(f"{param}.name: duplicate tool name {fn.name!r}", param=f"{param}.name")
        seen.add(fn.name)
        if fn.parameters is not None:
            _check_schema(fn.parameters, f"{param}.parameters", limits)
        out.append({"type": "function", "function": fn.model_dump(exclude_none=True)})
    return tuple(out)


def _check_schema(schema: dict[str, Any], param: str, limits: Limits) -> None:
    canonical = _check_schema_bounds(schema, param, limits)
    problem = _metaschema_problem(canonical)
    if problem is not None:
        raise InvalidRequestError(f"{param}: {problem}", param=param)
    if schema.get("type", "object") != "object":
        raise InvalidRequestError(f"{param}: the top-level type must be 'object'", param=param)


def _check_schema_bounds(schema: dict[str, Any], param: str, limits: Limits) -> str:
    """Size, nesting depth and `$ref` count of one schema against the limits; its canonical JSON."""
    canonical = json.dumps(schema, sort_keys=True)
    size = len(canonical.encode())
    if size > limits.max_schema_bytes:
        raise InvalidRequestError(
            f"{param}: schema is {size} bytes; the limit is {limits.max_schema_bytes}", param=param
        )
    depth = _depth(schema)
    if depth > limits.max_schema_depth:
        raise InvalidRequestError(
            f"{param}: schema nests {depth} deep; the limit is {limits.max_schema_depth}", param=param
        )
    refs = _count_refs(schema)
    if refs > limits.max_schema_refs:
        raise InvalidRequestError(
            f"{param}: schema has {refs} '$ref's; the limit is {limits.max_schema_refs}", param=param
        )
    return canonical


@functools.lru_cache(maxsize=1024)
def _metaschema_problem(canonical: str) -> str | None:
    """Why a schema (canonical JSON) is not valid Draft 2020-12, or None. Cached: checking
    against the metaschema costs ~10 ms and clients send the same tools again and again."""
    try:
        Draft202012Validator.check_schema(json.loads(canonical))
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"not a valid JSON Schema (Draft 2020-12) at '/{where}': {exc.message}"
    return None


def _count_refs(value: Any) -> int:
    if isinstance(value, dict):
        return int(isinstance(value.get("$ref"), str)) + sum(_count_refs(v) for v in value.values())
    if isinstance(value, list):
        return sum(_count_refs(v) for v in value)
    return 0


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def check_tool_choice(
    choice: Literal["none", "auto", "required"] | NamedToolChoiceWire | None,
    tools: tuple[Mapping[str, Any], ...] | None,
) -> ToolChoice:
    """The tool_choice to keep: `auto` with tools and `none` without when unset; a named
    choice must name a declared tool, `required` needs one."""
    names = {t["function"]["name"] for t in tools or ()}
    if choice is None:
        return "auto" if names else "none"
    if isinstance(choice, NamedToolChoiceWire):
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice: names undeclared tool {choice.function.name!r}", param="tool_choice.function.name"
            )
        return {"type": "function", "function": {"name": choice.function.name}}
    if choice == "required" and not names:
        raise InvalidRequestError("tool_choice: 'required' needs at least one tool in 'tools'", param="tool_choice")
    return choice


def check_messages(messages: list[MessageWire], limits: Limits) -> tuple[Mapping[str, Any], ...]:
    """The messages as dicts with string contents: within the limits, each with what its role
    needs, every tool message answering a call of the preceding assistant message."""
    if len(messages) > limits.max_messages:
        raise InvalidRequestError(
            f"messages: {len(messages)} messages exceed the limit {limits.max_messages}", param="messages"
        )
    open_calls: set[str] = set()
    out: list[Mapping[str, Any]] = []
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if msg.role == "assistant":
            open_calls = _assistant_calls(msg, param)
        elif msg.role == "tool":
            _answer_call(msg, param, open_calls)
        elif msg.content is None:
            raise InvalidRequestError(f"{param}.content: a {msg.role} message needs content", param=f"{param}.content")
        out.append(_message_dict(msg))
    return tuple(out)


def _assistant_calls(msg: MessageWire, param: str) -> set[str]:
    if msg.content is None and not msg.tool_calls:
        raise InvalidRequestError(
            f"{param}: an assistant message needs content or tool_calls", param=f"{param}.content"
        )
    ids: set[str] = set()
    for j, call in enumerate(msg.tool_calls or ()):
        where = f"{param}.tool_calls[{j}].function.arguments"
        try:
            args = strict_json.loads(call.function.arguments)
        except strict_json.StrictJsonError as err:  # the one rule the templates read it by
            raise InvalidRequestError(
                f"{where}: must be a JSON object encoded as a string (not valid JSON: {err})", param=where
            ) from None
        if not isinstance(args, dict):
            raise InvalidRequestError(f"{where}: must be a JSON object encoded as a string", param=where)
        ids.add(call.id)
    return ids


def _answer_call(msg: MessageWire, param: str, open_calls: set[str]) -> None:
    if msg.tool_call_id is None:
        raise InvalidRequestError(
            f"{param}.tool_call_id: a tool message needs tool_call_id", param=f"{param}.tool_call_id"
        )
    if msg.tool_call_id not in open_calls:
        raise InvalidRequestError(
            f"{param}.tool_call_id: {msg.tool_call_id!r} answers no tool call of the preceding assistant message",
            param=f"{param}.tool_call_id",
        )
    open_calls.discard(msg.tool_call_id)


def _message_dict(msg: MessageWire) -> dict[str, Any]:
    out = msg.model_dump(exclude_none=True)
    if isinstance(msg.content, list):
        out["content"] = "".join(part.text for part in msg.content)
    elif msg.content is None:
        out["content"] = None
    return out


def check_stop(stop: str | list[str] | None, limits: Limits) -> tuple[str, ...]:
    """The stop sequences as a tuple, each non-empty and within the limits."""
    seqs = [stop] if isinstance(stop, str) else list(stop or ())
    if len(seqs) > limits.max_stop_sequences:
        raise InvalidRequestError(f"stop: at most {limits.max_stop_sequences} sequences", param="stop")
    for seq in seqs:
        if not seq or len(seq) > limits.max_stop_chars:
            raise InvalidRequestError(f"stop: each sequence needs 1..{limits.max_stop_chars} characters", param="stop")
    return tuple(seqs)


def check_response_format(fmt: ResponseFormatWire | None, limits: Limits) -> Mapping[str, Any] | None:
    """The response_format to keep (None for text); a json_schema one needs a valid schema
    within the limits."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema":
        schema = (fmt.json_schema or {}).get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequestError("response_format.json_schema.schema: must be an object", param="response_format")
        _check_schema_bounds(schema, "response_format", limits)
        problem = _metaschema_problem(json.dumps(schema, sort_keys=True))
        if problem is not None:
            raise InvalidRequestError(f"response_format.json_schema.schema: {problem}", param="response_format")
    return fmt.model_dump(exclude_none=True)
