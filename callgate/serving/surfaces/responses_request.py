"""A `POST /v1/responses` body -> a frozen `ResponsesRequest`, and that (with the
conversation of the response it continues) -> the internal `ChatRequest`.

Knows: OpenAI's Responses request fields and how each maps onto chat's: `instructions` a
system message first (not carried over from a previous response, as OpenAI documents);
flat `function` tools to chat's nested ones (checked by the same rules as chat's tools);
tool types callgate cannot run (web_search, file_search, mcp, custom, ...) left out and
named in `ignored_tools`, and a `tool_choice` that names one a 400; `allowed_tools`
narrowing the tools the prompt shows; `text.format` to `response_format`;
`max_output_tokens` to `max_tokens`; `reasoning.effort` to `reasoning_effort`; `user` /
`safety_identifier` to `user`. Errors are 400s in OpenAI's shape naming the Responses
field (`tools[3].parameters`, `text.format`). Does not know: HTTP, the store, the turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from callgate.errors import InvalidRequestError
from callgate.serving.settings import Limits
from callgate.serving.surfaces.protocol_checks import ToolChoice, check_response_format, check_tool_choice, check_tools
from callgate.serving.surfaces.protocol_request import ChatRequest, ThinkingSwitch, call_plan, thinking_switch
from callgate.serving.surfaces.protocol_wire import (
    CallgateExtensionWire,
    FunctionWire,
    NamedFunctionWire,
    NamedToolChoiceWire,
    ResponseFormatWire,
    ToolWire,
    read_wire,
    wire_error,
)
from callgate.serving.surfaces.responses_input import Item, read_items, to_messages
from callgate.serving.surfaces.responses_wire import (
    AllowedToolsChoiceWire,
    FunctionToolWire,
    NamedChoiceWire,
    ResponsesWire,
    TextFormatWire,
)


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated Responses request; `echo` holds the fields the response object repeats."""

    model: str | None
    input_items: tuple[Item, ...]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    tools: tuple[Mapping[str, Any], ...] | None  # chat-style, the runnable ones only
    ignored_tools: tuple[Mapping[str, Any], ...]  # {"index", "type"[, "name"]} of each left out
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    max_output_tokens: int | None
    temperature: float
    top_p: float
    response_format: Mapping[str, Any] | None
    reasoning_effort: str | None
    user: str | None
    thinking_switch: ThinkingSwitch | None
    max_repairs: int | None
    quick: tuple[str, ...]
    recover_calls: bool | None
    echo: Mapping[str, Any]

    def chat_request(self, history: Sequence[Item], limits: Limits) -> ChatRequest:
        """The internal request for this request's input after `history` (the conversation
        of the response it continues; empty when it continues none)."""
        messages = to_messages([*history, *self.input_items], len(history), self.instructions)
        if not any(m["role"] != "system" for m in messages):
            raise InvalidRequestError("input: the conversation has no message to answer", param="input")
        if len(messages) > limits.max_messages:
            raise InvalidRequestError(
                f"input: the conversation has {len(messages)} messages; the limit is {limits.max_messages}",
                param="input",
            )
        return ChatRequest(
            model=self.model,
            messages=tuple(messages),
            tools=self.tools,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            max_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=None,
            stop=(),
            stream=self.stream,
            include_usage=True,
            response_format=self.response_format,
            user=self.user,
            max_repairs=self.max_repairs,
            quick=self.quick,
            recover_calls=self.recover_calls,
            reasoning_effort=self.reasoning_effort,
            thinking=bool(self.thinking_switch and self.thinking_switch.on),
            plan=call_plan(self.tools, self.tool_choice, self.parallel_tool_calls, self.response_format),
            thinking_switch=self.thinking_switch,
        )


def parse_responses_request(body: bytes, limits: Limits) -> ResponsesRequest:
    """Raw body -> ResponsesRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    wire = read_wire(ResponsesWire, body, limits.max_body_bytes)
    if wire.top_logprobs:
        raise InvalidRequestError(
            "top_logprobs: log probabilities are not returned by callgate",
            param="top_logprobs",
            code="unsupported_parameter",
        )
    if wire.max_output_tokens is not None and wire.max_output_tokens > limits.max_tokens:
        raise InvalidRequestError(
            f"max_output_tokens: {wire.max_output_tokens} exceeds the limit {limits.max_tokens}",
            param="max_output_tokens",
        )
    if isinstance(wire.input, list) and len(wire.input) > limits.max_messages:
        raise InvalidRequestError(
            f"input: {len(wire.input)} items exceed the limit {limits.max_messages}", param="input"
        )
    tools, ignored = _read_tools(wire.tools or [], limits)
    tool_choice, tools = _read_tool_choice(wire.tool_choice, tools, ignored)
    ext = wire.callgate or CallgateExtensionWire()
    if len(ext.quick) > limits.max_quick_tasks:
        raise InvalidRequestError(f"callgate.quick: at most {limits.max_quick_tasks} tasks", param="callgate.quick")
    fmt = wire.text.format if wire.text else None
    return ResponsesRequest(
        model=wire.model,
        input_items=read_items(wire.input),
        instructions=wire.instructions,
        previous_response_id=wire.previous_response_id,
        store=wire.store,
        stream=wire.stream,
        tools=tools,
        ignored_tools=tuple(ignored),
        tool_choice=tool_choice,
        parallel_tool_calls=True if wire.parallel_tool_calls is None else wire.parallel_tool_calls,
        max_output_tokens=wire.max_output_tokens,
        temperature=1.0 if wire.temperature is None else wire.temperature,
        top_p=1.0 if wire.top_p is None else wire.top_p,
        response_format=_response_format(fmt, limits),
        reasoning_effort=wire.reasoning.effort if wire.reasoning else None,
        user=wire.safety_identifier or wire.user,
        thinking_switch=thinking_switch(wire.chat_template_kwargs),
        max_repairs=ext.max_repairs,
        quick=tuple(ext.quick),
        recover_calls=ext.recover_calls,
        echo=_echo(wire),
    )


def _validate(model: type[BaseModel], raw: Mapping[str, Any], where: str) -> BaseModel:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = wire_error(exc)
        param = f"{where}.{err.param}" if err.param else where
        raise InvalidRequestError(
            f"{param}: {err.message.removeprefix(f'{err.param}: ')}", param=param, code=err.code
        ) from None


def _renamed(err: InvalidRequestError, old: str, new: str) -> InvalidRequestError:
    """`err` with the chat field name `old` (a prefix of its param and message) read as `new`."""
    param = new + err.param.removeprefix(old) if err.param and err.param.startswith(old) else err.param
    message = new + err.message.removeprefix(old) if err.message.startswith(old) else err.message
    return type(err)(message, param=param, code=err.code)


def _read_tools(
    raw: Sequence[Mapping[str, Any]], limits: Limits
) -> tuple[tuple[Mapping[str, Any], ...] | None, list[Mapping[str, Any]]]:
    """(the function tools as chat tools, None when there are none; the tools left out)."""
    out: list[Mapping[str, Any]] = []
    ignored: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(raw):
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise InvalidRequestError(f"tools[{i}].type: every tool needs a type", param=f"tools[{i}].type")
        if kind != "function":
            name = tool.get("name", tool.get("server_label"))
            ignored.append({"index": i, "type": kind, **({"name": name} if isinstance(name, str) else {})})
            continue
        wire = _validate(FunctionToolWire, tool, f"tools[{i}]")
        assert isinstance(wire, FunctionToolWire)
        if wire.name in seen:
            raise InvalidRequestError(f"tools[{i}].name: duplicate tool name {wire.name!r}", param=f"tools[{i}].name")
        seen.add(wire.name)
        fn = FunctionWire(name=wire.name, description=wire.description, parameters=wire.parameters, strict=wire.strict)
        try:
            [checked] = check_tools([ToolWire(type="function", function=fn)], limits) or ()
        except InvalidRequestError as exc:
            raise _renamed(exc, "tools[0].function", f"tools[{i}]") from None
        out.append(checked)
    if len(out) > limits.max_tools:
        raise InvalidRequestError(
            f"tools: {len(out)} function tools exceed the limit {limits.max_tools}", param="tools"
        )
    return (tuple(out) or None), ignored


def _read_tool_choice(
    raw: str | Mapping[str, Any] | None,
    tools: tuple[Mapping[str, Any], ...] | None,
    ignored: Sequence[Mapping[str, Any]],
) -> tuple[ToolChoice, tuple[Mapping[str, Any], ...] | None]:
    """(the tool choice, the tools the prompt shows under it)."""
    if raw is None or isinstance(raw, str):
        try:
            return check_tool_choice(raw, tools), tools  # type: ignore[arg-type]  # the wire's Literal
        except InvalidRequestError as exc:
            raise _renamed(exc, "tool_choice", "tool_choice") from None
    kind = raw.get("type")
    if kind == "function":
        wire = _validate(NamedChoiceWire, raw, "tool_choice")
        assert isinstance(wire, NamedChoiceWire)
        if any(t.get("name") == wire.name for t in ignored):
            raise _not_runnable(f"tool_choice.name: {wire.name!r} is not a function tool", "tool_choice.name")
        named = NamedToolChoiceWire(type="function", function=NamedFunctionWire(name=wire.name))
        try:
            return check_tool_choice(named, tools), tools
        except InvalidRequestError:
            raise InvalidRequestError(
                f"tool_choice.name: names undeclared tool {wire.name!r}", param="tool_choice.name"
            ) from None
    if kind == "allowed_tools":
        allowed = _validate(AllowedToolsChoiceWire, raw, "tool_choice")
        assert isinstance(allowed, AllowedToolsChoiceWire)
        names = {t.name for t in allowed.tools if t.type == "function"}
        kept = tuple(t for t in tools or () if t["function"]["name"] in names) or None
        if allowed.mode == "required" and kept is None:
            raise _not_runnable(
                "tool_choice.tools: 'required' allows no function tool callgate can run", "tool_choice.tools"
            )
        return ("auto" if kept else "none") if allowed.mode == "auto" else "required", kept
    raise _not_runnable(
        f"tool_choice.type: {str(kind)[:64]!r} tools are not run by callgate (only function tools are)",
        "tool_choice.type",
    )


def _not_runnable(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="unsupported_tool_choice")


def _response_format(fmt: TextFormatWire | None, limits: Limits) -> Mapping[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return check_response_format(ResponseFormatWire(type="json_object"), limits)
    if fmt.schema_ is None:
        raise InvalidRequestError("text.format.schema: a json_schema format needs a schema", param="text.format.schema")
    spec: dict[str, Any] = {"name": fmt.name or "response", "schema": fmt.schema_}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    try:
        return check_response_format(ResponseFormatWire(type="json_schema", json_schema=spec), limits)
    except InvalidRequestError as exc:
        err = _renamed(exc, "response_format.json_schema.schema", "text.format.schema")
        raise _renamed(err, "response_format", "text.format.schema") from None


def _echo(wire: ResponsesWire) -> dict[str, Any]:
    """The request fields the response object repeats, as OpenAI's does."""
    fmt = wire.text.format if wire.text and wire.text.format else None
    text: dict[str, Any] = {
        "format": {"type": "text"} if fmt is None else fmt.model_dump(exclude_none=True, by_alias=True)
    }
    return {
        "instructions": wire.instructions,
        "max_output_tokens": wire.max_output_tokens,
        "metadata": wire.metadata or {},
        "parallel_tool_calls": True if wire.parallel_tool_calls is None else wire.parallel_tool_calls,
        "previous_response_id": wire.previous_response_id,
        "reasoning": {"effort": wire.reasoning.effort if wire.reasoning else None, "summary": None},
        "safety_identifier": wire.safety_identifier,
        "store": wire.store,
        "temperature": 1.0 if wire.temperature is None else wire.temperature,
        "text": text,
        "tool_choice": wire.tool_choice if wire.tool_choice is not None else "auto",
        "tools": list(wire.tools or []),
        "top_p": 1.0 if wire.top_p is None else wire.top_p,
        "truncation": "disabled",
        "user": wire.user,
    }
