"""The OpenAI wire: request validation (pydantic, the only place it is used) and the
exact JSON shapes of responses, chunks and model lists.

Knows: OpenAI's chat-completions request/response shapes, callgate's request extension
(`callgate`: max_repairs, quick; `reasoning_effort`; `chat_template_kwargs`) and the
request limits. Turns a raw body into a frozen `ChatRequest` or raises
`InvalidRequestError` naming the offending field.
Does not know: templates, engines, parsers or validators.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from callgate.errors import InvalidRequestError, PayloadTooLargeError
from callgate.serving.settings import Limits
from callgate.types import Diagnostic, ToolCallCandidate

ToolChoice = Literal["none", "auto", "required"] | Mapping[str, Any]

# ---- wire models ------------------------------------------------------------------------


class _Wire(BaseModel):
    # strict: "5" is not an int. Unknown fields are ignored, as OpenAI-compatible servers do.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class FunctionCallWire(_Wire):
    name: str
    arguments: str


class ToolCallWire(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallWire


class TextPartWire(_Wire):
    type: Literal["text"]
    text: str


class MessageWire(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPartWire] | None = None
    name: str | None = None
    tool_calls: list[ToolCallWire] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionWire(_Wire):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolWire(_Wire):
    type: Literal["function"]
    function: FunctionWire


class NamedFunctionWire(_Wire):
    name: str


class NamedToolChoiceWire(_Wire):
    type: Literal["function"]
    function: NamedFunctionWire


class StreamOptionsWire(_Wire):
    include_usage: bool = False


class ResponseFormatWire(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class TemplateKwargsWire(_Wire):
    enable_thinking: bool | None = None
    thinking: bool | None = None


class CallgateExtensionWire(_Wire):
    max_repairs: int | None = Field(default=None, ge=0, le=8)
    quick: list[str] = Field(default_factory=list)


class ChatCompletionWire(_Wire):
    model: str | None = None
    messages: list[MessageWire] = Field(min_length=1)
    tools: list[ToolWire] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoiceWire | None = None
    parallel_tool_calls: bool = True
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptionsWire | None = None
    response_format: ResponseFormatWire | None = None
    user: str | None = None
    n: int = 1
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    chat_template_kwargs: TemplateKwargsWire | None = None
    callgate: CallgateExtensionWire | None = None


# ---- the validated request --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThinkingSwitch:
    """The client's reasoning switch as sent: `chat_template_kwargs.<key>` = `on`. What it
    means depends on the served format (serving/conform.py)."""

    key: str  # "enable_thinking" or its alias "thinking"
    on: bool


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat request. Messages and tools are OpenAI-style dicts (content as a
    string, tool_calls[].function.arguments as a JSON string), ready for templates.render."""

    model: str | None
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    response_format: Mapping[str, Any] | None
    user: str | None
    max_repairs: int | None
    quick: tuple[str, ...]
    reasoning_effort: str | None
    thinking: bool  # the prompt opens a reasoning block (set from the switch by conform.py)
    thinking_switch: ThinkingSwitch | None = None

    def function_of(self, name: str) -> Mapping[str, Any] | None:
        """The declared `function` object of tool `name`; None when no such tool is declared."""
        for tool in self.tools or ():
            fn: Mapping[str, Any] = tool["function"]
            if fn["name"] == name:
                return fn
        return None

    def schema_of(self, name: str) -> Mapping[str, Any] | None:
        """The declared `parameters` of tool `name`; None when no such tool is declared."""
        fn = self.function_of(name)
        if fn is None:
            return None
        params: Mapping[str, Any] = fn.get("parameters") or {"type": "object", "properties": {}}
        return params

    def is_strict(self, name: str) -> bool:
        """Whether tool `name` was declared with OpenAI's `strict: true`."""
        fn = self.function_of(name)
        return bool(fn and fn.get("strict"))


def parse_chat_request(body: bytes, limits: Limits) -> ChatRequest:
    """Raw body -> ChatRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    if len(body) > limits.max_body_bytes:
        raise PayloadTooLargeError(f"request body is {len(body)} bytes; the limit is {limits.max_body_bytes}")
    try:
        wire = ChatCompletionWire.model_validate_json(body)
    except ValidationError as exc:
        raise _from_validation_error(exc) from None
    return _to_request(wire, limits)


def _from_validation_error(exc: ValidationError) -> InvalidRequestError:
    err = exc.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return InvalidRequestError(f"body is not valid JSON: {err['msg']}", code="invalid_json")
    param = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p)) or None
    if err["type"] == "model_type" and not err["loc"]:
        return InvalidRequestError("body must be a JSON object", code="invalid_type")
    return InvalidRequestError(f"{param}: {err['msg']}", param=param, code="invalid_value")


def _is_union_tag(part: int | str) -> bool:
    """pydantic puts the union member it tried into `loc` (`str`, `literal[...]`, a model name)."""
    return isinstance(part, str) and (
        part in {"str", "int", "float", "bool", "list", "dict"} or "[" in part or part.endswith("Wire")
    )


def _to_request(wire: ChatCompletionWire, limits: Limits) -> ChatRequest:
    if wire.n != 1:
        raise InvalidRequestError("n: only n=1 is supported", param="n")
    tools = _check_tools(wire.tools, limits)
    tool_choice = _check_tool_choice(wire.tool_choice, tools)
    messages = _check_messages(wire.messages, limits)
    max_tokens = wire.max_completion_tokens or wire.max_tokens
    if max_tokens is not None and max_tokens > limits.max_tokens:
        field = "max_completion_tokens" if wire.max_completion_tokens else "max_tokens"
        raise InvalidRequestError(f"{field}: {max_tokens} exceeds the limit {limits.max_tokens}", param=field)
    ext = wire.callgate or CallgateExtensionWire()
    if len(ext.quick) > limits.max_quick_tasks:
        raise InvalidRequestError(f"callgate.quick: at most {limits.max_quick_tasks} tasks", param="callgate.quick")
    kwargs = wire.chat_template_kwargs or TemplateKwargsWire()
    return ChatRequest(
        model=wire.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=wire.parallel_tool_calls,
        max_tokens=max_tokens,
        temperature=1.0 if wire.temperature is None else wire.temperature,
        top_p=1.0 if wire.top_p is None else wire.top_p,
        seed=wire.seed,
        stop=_check_stop(wire.stop, limits),
        stream=wire.stream,
        include_usage=bool(wire.stream_options and wire.stream_options.include_usage),
        response_format=_check_response_format(wire.response_format, limits),
        user=wire.user,
        max_repairs=ext.max_repairs,
        quick=tuple(ext.quick),
        reasoning_effort=wire.reasoning_effort,
        thinking=bool(kwargs.enable_thinking or kwargs.thinking),
        thinking_switch=_thinking_switch(kwargs),
    )


def _thinking_switch(kwargs: TemplateKwargsWire) -> ThinkingSwitch | None:
    if kwargs.enable_thinking is not None and kwargs.thinking is not None and kwargs.enable_thinking != kwargs.thinking:
        raise InvalidRequestError(
            "chat_template_kwargs: enable_thinking and thinking disagree", param="chat_template_kwargs"
        )
    if kwargs.enable_thinking is not None:
        return ThinkingSwitch("enable_thinking", kwargs.enable_thinking)
    if kwargs.thinking is not None:
        return ThinkingSwitch("thinking", kwargs.thinking)
    return None


def _check_tools(tools: list[ToolWire] | None, limits: Limits) -> tuple[Mapping[str, Any], ...] | None:
    if tools is None:
        return None
    if len(tools) > limits.max_tools:
        raise InvalidRequestError(f"tools: {len(tools)} tools exceed the limit {limits.max_tools}", param="tools")
    seen: set[str] = set()
    out: list[Mapping[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.function
        param = f"tools.{i}.function"
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


def _check_tool_choice(
    choice: Literal["none", "auto", "required"] | NamedToolChoiceWire | None,
    tools: tuple[Mapping[str, Any], ...] | None,
) -> ToolChoice:
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


def _check_messages(messages: list[MessageWire], limits: Limits) -> tuple[Mapping[str, Any], ...]:
    if len(messages) > limits.max_messages:
        raise InvalidRequestError(
            f"messages: {len(messages)} messages exceed the limit {limits.max_messages}", param="messages"
        )
    open_calls: set[str] = set()
    out: list[Mapping[str, Any]] = []
    for i, msg in enumerate(messages):
        param = f"messages.{i}"
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
        try:
            args = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            where = f"{param}.tool_calls.{j}.function.arguments"
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


def _check_stop(stop: str | list[str] | None, limits: Limits) -> tuple[str, ...]:
    seqs = [stop] if isinstance(stop, str) else list(stop or ())
    if len(seqs) > limits.max_stop_sequences:
        raise InvalidRequestError(f"stop: at most {limits.max_stop_sequences} sequences", param="stop")
    for seq in seqs:
        if not seq or len(seq) > limits.max_stop_chars:
            raise InvalidRequestError(f"stop: each sequence needs 1..{limits.max_stop_chars} characters", param="stop")
    return tuple(seqs)


def _check_response_format(fmt: ResponseFormatWire | None, limits: Limits) -> Mapping[str, Any] | None:
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


# ---- POST /v1/quick (quick-instruction heads without a main generation) -------------------


class QuickWire(_Wire):
    model: str | None = None
    messages: list[MessageWire] = Field(min_length=1)
    tasks: list[str] = Field(min_length=1)
    tools: list[ToolWire] | None = None
    labels: dict[str, list[str]] | None = None  # label sets of authority / domain for this request
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    chat_template_kwargs: TemplateKwargsWire | None = None


@dataclass(frozen=True, slots=True)
class QuickRequest:
    """A validated /v1/quick request; task names are checked by the quick service."""

    model: str | None
    messages: tuple[Mapping[str, Any], ...]
    tasks: tuple[str, ...]
    tools: tuple[Mapping[str, Any], ...] | None
    labels: Mapping[str, tuple[str, ...]]
    reasoning_effort: str | None
    thinking: bool
    thinking_switch: ThinkingSwitch | None = None


_LABEL_TASKS = ("authority", "domain")


def parse_quick_request(body: bytes, limits: Limits) -> QuickRequest:
    """Raw body -> QuickRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    if len(body) > limits.max_body_bytes:
        raise PayloadTooLargeError(f"request body is {len(body)} bytes; the limit is {limits.max_body_bytes}")
    try:
        wire = QuickWire.model_validate_json(body)
    except ValidationError as exc:
        raise _from_validation_error(exc) from None
    if len(wire.tasks) > limits.max_quick_tasks:
        raise InvalidRequestError(f"tasks: at most {limits.max_quick_tasks} tasks", param="tasks")
    labels: dict[str, tuple[str, ...]] = {}
    for task, words in (wire.labels or {}).items():
        if task not in _LABEL_TASKS or not words or not all(w.strip() for w in words):
            raise InvalidRequestError(
                f"labels.{task}: label sets are non-empty lists of words for {' / '.join(_LABEL_TASKS)}",
                param=f"labels.{task}",
            )
        labels[task] = tuple(dict.fromkeys(words))
    kwargs = wire.chat_template_kwargs or TemplateKwargsWire()
    return QuickRequest(
        model=wire.model,
        messages=_check_messages(wire.messages, limits),
        tasks=tuple(wire.tasks),
        tools=_check_tools(wire.tools, limits),
        labels=labels,
        reasoning_effort=wire.reasoning_effort,
        thinking=bool(kwargs.enable_thinking or kwargs.thinking),
        thinking_switch=_thinking_switch(kwargs),
    )


# ---- the OpenAPI document ----------------------------------------------------------------


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """An operation's `requestBody` for FastAPI's `openapi_extra`: the wire model's JSON
    Schema with its definitions inlined (the routes read raw bodies, so FastAPI cannot
    infer one; the document serves clients and API fuzzers)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline(schema, defs)}}}}


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


# ---- response shapes ---------------------------------------------------------------------


def tool_call_dict(call_id: str, name: str, arguments_json: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json}}


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def candidate_dict(c: ToolCallCandidate) -> dict[str, Any]:
    return {
        "call_id": c.call_id,
        "name": c.name,
        "arguments": c.arguments,
        "raw": c.raw,
        "span": list(c.span),
        "format": c.format,
    }


def diagnostic_dict(d: Diagnostic) -> dict[str, Any]:
    return {"code": d.code, "message": d.message, "span": list(d.span)}


def completion_dict(
    *,
    completion_id: str,
    created: int,
    model: str,
    message: Mapping[str, Any],
    finish_reason: str,
    usage: Mapping[str, Any],
    callgate: Mapping[str, Any],
) -> dict[str, Any]:
    """A non-streaming `chat.completion` object."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": dict(message), "logprobs": None, "finish_reason": finish_reason}],
        "usage": dict(usage),
        "callgate": dict(callgate),
    }


def chunk_dict(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: Mapping[str, Any] | None,
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    callgate: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `chat.completion.chunk`; delta None gives the usage-only chunk (empty choices)."""
    choices = (
        [] if delta is None else [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}]
    )
    out: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = dict(usage)
    if callgate is not None:
        out["callgate"] = dict(callgate)
    return out


def models_dict(model: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "callgate", "max_model_len": max_model_len}
        ],
    }


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> frozenset[str]:
    return frozenset(t["function"]["name"] for t in tools or ())
