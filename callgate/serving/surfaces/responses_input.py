"""Responses input items: read from the wire one by one, kept in one normal form, and turned
into the OpenAI-style chat messages the internal turn runs on.

Knows: the item types callgate reads (`message` with roles user / assistant / system /
developer and a string or `input_text` / `output_text` / `refusal` parts, `function_call`,
`function_call_output`, `reasoning`), their normal form (every item with an `id` and a
`status`, a message's content as parts, a tool output as a string: what the store keeps and
`input_items` lists), and how a conversation of items maps onto messages: consecutive
assistant text and function calls form one assistant message, a reasoning item becomes the
`reasoning_content` of the assistant message after it, each function_call_output a `tool`
message. Errors are 400s naming the item (`input[2].call_id`); an item that came from a
stored response is named by `previous_response_id`.
Does not know: HTTP, the store, tools, limits other than those it is given.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from callgate import strict_json
from callgate.errors import InvalidRequestError
from callgate.serving.surfaces.protocol_wire import wire_error
from callgate.serving.surfaces.responses_wire import (
    FunctionCallItemWire,
    FunctionCallOutputItemWire,
    MessageItemWire,
    ReasoningItemWire,
    RefusalPartWire,
    TextPartWire,
)

Item = Mapping[str, Any]

_ITEM_MODELS: Mapping[str, type[BaseModel]] = {
    "message": MessageItemWire,
    "function_call": FunctionCallItemWire,
    "function_call_output": FunctionCallOutputItemWire,
    "reasoning": ReasoningItemWire,
}


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def read_items(raw: str | Sequence[Mapping[str, Any]]) -> tuple[Item, ...]:
    """The request's `input` in normal form; a string is one user message."""
    if isinstance(raw, str):
        return (_message("user", [{"type": "input_text", "text": raw}], None),)
    return tuple(_read_item(item, f"input[{i}]") for i, item in enumerate(raw))


def _read_item(raw: Mapping[str, Any], where: str) -> Item:
    kind = raw.get("type", "message")  # an EasyInputMessage has no type
    model = _ITEM_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise InvalidRequestError(
            f"{where}.type: input items of type {str(kind)[:64]!r} are not supported "
            f"(supported: {', '.join(_ITEM_MODELS)})",
            param=f"{where}.type",
            code="invalid_value",
        )
    wire = _validate(model, raw, where)
    if isinstance(wire, MessageItemWire):
        return _message(wire.role, _parts(wire, where), wire.id)
    if isinstance(wire, FunctionCallItemWire):
        _check_arguments(wire.arguments, f"{where}.arguments")
        return {
            "id": wire.id or new_id("fc_"),
            "type": "function_call",
            "call_id": wire.call_id,
            "name": wire.name,
            "arguments": wire.arguments,
            "status": "completed",
        }
    if isinstance(wire, FunctionCallOutputItemWire):
        return {
            "id": wire.id or new_id("fco_"),
            "type": "function_call_output",
            "call_id": wire.call_id,
            "output": _output_text(wire.output, f"{where}.output"),
            "status": "completed",
        }
    assert isinstance(wire, ReasoningItemWire)
    item: dict[str, Any] = {
        "id": wire.id or new_id("rs_"),
        "type": "reasoning",
        "summary": [p.model_dump() for p in wire.summary],
        "status": "completed",
    }
    if wire.content is not None:
        item["content"] = [p.model_dump() for p in wire.content]
    if wire.encrypted_content is not None:
        item["encrypted_content"] = wire.encrypted_content
    return item


def _validate(model: type[BaseModel], raw: Mapping[str, Any], where: str) -> BaseModel:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise _within(wire_error(exc), where) from None


def _within(err: InvalidRequestError, where: str) -> InvalidRequestError:
    """`err` (naming a field of one item) as naming it inside `where`."""
    if not err.param:
        return InvalidRequestError(f"{where}: {err.message}", param=where, code=err.code)
    param = f"{where}.{err.param}" if not err.param.startswith("[") else where + err.param
    return InvalidRequestError(f"{param}: {err.message.removeprefix(err.param + ': ')}", param=param, code=err.code)


def _message(role: str, parts: list[dict[str, Any]], item_id: str | None) -> Item:
    return {"id": item_id or new_id("msg_"), "type": "message", "role": role, "status": "completed", "content": parts}


def _parts(wire: MessageItemWire, where: str) -> list[dict[str, Any]]:
    text_type = "output_text" if wire.role == "assistant" else "input_text"
    if isinstance(wire.content, str):
        return [_text_part(text_type, wire.content)]
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(wire.content):
        at = f"{where}.content[{j}]"
        if raw.get("type") == "refusal" and wire.role == "assistant":
            parts.append(_validate(RefusalPartWire, raw, at).model_dump())
        elif raw.get("type") in ("input_text", "output_text", "text"):
            part = _validate(TextPartWire, raw, at)
            assert isinstance(part, TextPartWire)
            parts.append(_text_part(text_type, part.text))
        else:
            raise _unsupported_part(raw, at)
    return parts


def _text_part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text, **({"annotations": []} if kind == "output_text" else {})}


def _unsupported_part(raw: Mapping[str, Any], at: str) -> InvalidRequestError:
    kind = str(raw.get("type"))[:64]
    return InvalidRequestError(
        f"{at}.type: content parts of type {kind!r} are not supported (callgate reads text parts only)",
        param=f"{at}.type",
        code="invalid_value",
    )


def _output_text(output: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(output, str):
        return output
    texts: list[str] = []
    for j, raw in enumerate(output):
        at = f"{where}[{j}]"
        if raw.get("type") not in ("input_text", "output_text", "text"):
            raise _unsupported_part(raw, at)
        part = _validate(TextPartWire, raw, at)
        assert isinstance(part, TextPartWire)
        texts.append(part.text)
    return "".join(texts)


def _check_arguments(arguments: str, where: str) -> None:
    try:
        value = strict_json.loads(arguments)  # the one rule the templates read it by
    except strict_json.StrictJsonError as err:
        raise InvalidRequestError(
            f"{where}: must be a JSON object encoded as a string (not valid JSON: {err})", param=where
        ) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where}: must be a JSON object encoded as a string", param=where)


# ---- items -> messages -----------------------------------------------------------------------


def item_text(item: Item) -> str:
    """The text of a normal-form message or reasoning item."""
    if item["type"] == "reasoning":
        parts = item.get("content") or item.get("summary") or ()
        return "".join(p["text"] for p in parts)
    return "".join(p.get("text", p.get("refusal", "")) for p in item["content"])


def to_messages(items: Sequence[Item], first_new: int, instructions: str | None) -> list[dict[str, Any]]:
    """Chat messages for a conversation of normal-form items; items before `first_new` came
    from a stored response. 400 for a tool output that answers no call, or a call left
    without an output (OpenAI's rule: each function_call needs its output before the model
    is asked again)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions is not None else []
    reasoning: list[str] = []
    calls: dict[str, int] = {}  # call_id -> item index, until answered
    answered: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i - first_new}]" if i >= first_new else "previous_response_id"
        kind = item["type"]
        if kind == "reasoning":
            reasoning.append(item_text(item))
            continue
        if kind == "function_call_output":
            _answer(item, where, calls, answered)
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
            continue
        if kind == "function_call":
            if item["call_id"] in calls or item["call_id"] in answered:
                raise InvalidRequestError(
                    f"{where}.call_id: duplicate call_id {item['call_id']!r}", param=f"{where}.call_id"
                )
            calls[item["call_id"]] = i
        if kind == "function_call" or _is_assistant(item):
            _assistant_turn(out, item, reasoning)
        else:  # reasoning belongs to the assistant turn after it, not across a user message
            out.append({"role": item["role"], "content": item_text(item)})
        reasoning = []
    for call_id, i in calls.items():
        where = f"input[{i - first_new}]" if i >= first_new else "previous_response_id"
        raise InvalidRequestError(f"{where}: no function_call_output found for call_id {call_id!r}", param=where)
    return out


def _is_assistant(item: Item) -> bool:
    return bool(item["type"] == "message" and item["role"] == "assistant")


def _assistant_turn(out: list[dict[str, Any]], item: Item, reasoning: list[str]) -> None:
    """Fold an assistant message or function_call into the assistant message it continues
    (one under way: the last message, with no tool output since), or start one."""
    last = out[-1] if out and out[-1]["role"] == "assistant" else None
    if item["type"] == "function_call":
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        if last is None:
            last = {"role": "assistant", "content": None}
            out.append(last)
        last.setdefault("tool_calls", []).append(call)
    elif last is not None and not last.get("tool_calls"):
        last["content"] = (last["content"] or "") + item_text(item)
    else:
        last = {"role": "assistant", "content": item_text(item)}
        out.append(last)
    if reasoning:
        last["reasoning_content"] = (last.get("reasoning_content") or "") + "".join(reasoning)


def _answer(item: Item, where: str, calls: dict[str, int], answered: set[str]) -> None:
    call_id = item["call_id"]
    if call_id not in calls:
        why = "was already answered" if call_id in answered else "answers no function_call before it"
        raise InvalidRequestError(f"{where}.call_id: {call_id!r} {why}", param=f"{where}.call_id")
    del calls[call_id]
    answered.add(call_id)
