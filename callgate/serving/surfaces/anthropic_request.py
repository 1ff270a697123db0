"""An Anthropic Messages body -> the internal `ChatRequest`, through the chat-completions
request checks (every limit and rule applies alike), or a 400 / 413.

Knows: how Anthropic's shapes map onto OpenAI-style messages: `system` -> a system message;
a user message's `tool_result` blocks -> tool messages (before its text, in order; `is_error`
results are marked `Error: ` so the model sees that the call failed); an assistant's
`thinking` -> reasoning_content, `tool_use` -> tool_calls; tool_choice any -> required,
tool -> the named function, disable_parallel_tool_use -> parallel_tool_calls false;
thinking enabled -> the format's reasoning switch; metadata.user_id -> user; and call ids:
output_config.effort -> reasoning_effort, output_config.format -> a json_schema
response_format; server tools (a `type` other than `custom`) are left out and named;
callgate's ids are shown as `toolu_...` and mapped back (`tool_use_id`s) to what the model
or the parser wrote (`toolu_id`, `call_id`). Does not know: HTTP, the served model, engines.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from callgate.errors import InvalidRequestError
from callgate.formats import get_format
from callgate.serving.settings import Limits
from callgate.serving.surfaces.anthropic_wire import (
    CountTokensWire,
    ImageBlockWire,
    MessageParamWire,
    MessagesWire,
    TextBlockWire,
    ThinkingBlockWire,
    ToolResultBlockWire,
    ToolUseBlockWire,
)
from callgate.serving.surfaces.protocol import ChatRequest, parse_chat_request
from callgate.serving.surfaces.protocol_wire import read_wire

TOOL_USE_PREFIX = "toolu_"
_CALL_PREFIX = "call_"


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A translated /v1/messages request: the chat request, and the names of the server
    tools (web_search, bash, ...) left out of it because callgate cannot run them."""

    chat: ChatRequest
    ignored_tools: tuple[str, ...]


def parse_messages_request(body: bytes, limits: Limits, fmt: str) -> MessagesRequest:
    """A /v1/messages body -> MessagesRequest. Raises InvalidRequestError (400) / PayloadTooLargeError (413)."""
    wire = read_wire(MessagesWire, body, limits.max_body_bytes)
    if wire.thinking and wire.thinking.type == "enabled":
        budget = wire.thinking.budget_tokens
        if budget is None or budget >= wire.max_tokens:
            raise InvalidRequestError("thinking.budget_tokens: required, and less than max_tokens", param="thinking")
    ext = wire.callgate.model_dump(exclude_none=True) if wire.callgate else None
    openai: dict[str, Any] = {
        **_conversation(wire, fmt),
        "max_tokens": wire.max_tokens,
        "stop": wire.stop_sequences,
        "temperature": wire.temperature,
        "top_p": wire.top_p,
        "top_k": wire.top_k,
        "user": wire.metadata.user_id if wire.metadata else None,
        "stream": wire.stream,
        "callgate": ext,
    }
    return MessagesRequest(_chat_request(openai, limits), _server_tools(wire))


def parse_count_tokens_request(body: bytes, limits: Limits, fmt: str) -> ChatRequest:
    """A /v1/messages/count_tokens body -> ChatRequest (no max_tokens: only the prompt counts)."""
    wire = read_wire(CountTokensWire, body, limits.max_body_bytes)
    return _chat_request(_conversation(wire, fmt), limits)


def tool_use_id(call_id: str) -> str:
    """The Anthropic id of a call callgate returns: `toolu_` + the id without OpenAI's prefix."""
    return TOOL_USE_PREFIX + call_id.removeprefix(_CALL_PREFIX)


def internal_call_id(use_id: str, fmt: str) -> str:
    """The inverse of `tool_use_id` for format `fmt`: the id the model wrote where the format
    has its own (mistral's 9 letters/digits), else `call_...`; a client's own ids are kept."""
    if not use_id.startswith(TOOL_USE_PREFIX):
        return use_id
    rest = use_id.removeprefix(TOOL_USE_PREFIX)
    ids = get_format(fmt).call_ids
    if ids is not None and re.fullmatch(ids.pattern, rest):
        return rest
    return _CALL_PREFIX + rest


def _chat_request(openai: dict[str, Any], limits: Limits) -> ChatRequest:
    body = json.dumps({k: v for k, v in openai.items() if v is not None}).encode()
    # The body was measured as sent; its OpenAI rewrite may be a little longer.
    return parse_chat_request(body, dataclasses.replace(limits, max_body_bytes=max(limits.max_body_bytes, len(body))))


def _conversation(wire: CountTokensWire, fmt: str) -> dict[str, Any]:
    """model, messages, tools, tool_choice, parallel_tool_calls and the thinking switch."""
    messages: list[dict[str, Any]] = []
    if wire.system:
        system = wire.system if isinstance(wire.system, str) else "\n\n".join(b.text for b in wire.system)
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(wire.messages):
        messages += _message(m, i, fmt)
    out: dict[str, Any] = {"model": wire.model, "messages": messages}
    tools = []
    for i, t in enumerate(wire.tools or ()):
        if t.type not in (None, "custom"):
            continue  # a server tool: see _server_tools
        if t.input_schema is None:
            raise InvalidRequestError(f"tools[{i}].input_schema: Field required", param=f"tools[{i}].input_schema")
        function = {"name": t.name, "description": t.description, "parameters": t.input_schema, "strict": t.strict}
        tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    if tools:
        out["tools"] = tools
    choice = wire.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequestError("tool_choice.name: required for type tool", param="tool_choice.name")
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    if wire.thinking is not None and wire.thinking.type in ("enabled", "disabled"):
        # adaptive / between_tools leave it to the model: the format's own default
        out["chat_template_kwargs"] = {"enable_thinking": wire.thinking.type == "enabled"}
    config = wire.output_config
    if config is not None and config.effort is not None:
        out["reasoning_effort"] = _EFFORT[config.effort]
    if config is not None and config.format is not None:
        schema = {"name": "output", "schema": config.format.schema_, "strict": True}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    return out


_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}


def _server_tools(wire: CountTokensWire) -> tuple[str, ...]:
    return tuple(t.name for t in wire.tools or () if t.type not in (None, "custom"))


def _message(m: MessageParamWire, index: int, fmt: str) -> list[dict[str, Any]]:
    where = f"messages[{index}]"
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(m.content):
        at = f"{where}.content[{j}]"
        if isinstance(block, TextBlockWire):
            texts.append(block.text)
        elif isinstance(block, ImageBlockWire):
            raise _unsupported(at, block.type)
        elif isinstance(block, ThinkingBlockWire):
            _only(m.role, "assistant", at, block.type)
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlockWire):
            _only(m.role, "assistant", at, block.type)
            call_id = internal_call_id(block.id, fmt)
            function = {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}
            calls.append({"id": call_id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlockWire):
            _only(m.role, "user", at, block.type)
            content = _result_text(block, at)
            results.append(
                {"role": "tool", "tool_call_id": internal_call_id(block.tool_use_id, fmt), "content": content}
            )
        # redacted_thinking: opaque to every model but the one that wrote it; left out
    text = "".join(texts)
    if m.role == "user":
        return [*results, {"role": "user", "content": text}] if texts or not results else results
    out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return [out]


def _result_text(block: ToolResultBlockWire, at: str) -> str:
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        parts: Sequence[Any] = block.content
        for k, part in enumerate(parts):
            if isinstance(part, ImageBlockWire):
                raise _unsupported(f"{at}.content[{k}]", part.type)
        text = "".join(p.text for p in parts)
    return f"Error: {text}" if block.is_error else text


def _only(role: str, allowed: str, at: str, kind: str) -> None:
    if role != allowed:
        raise InvalidRequestError(f"{at}: a {kind} block belongs in a {allowed} message", param=at)


def _unsupported(at: str, kind: str) -> InvalidRequestError:
    return InvalidRequestError(f"{at}: {kind} blocks are not supported by callgate", param=at)
