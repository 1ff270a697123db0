"""A validated request made to fit the served format, before anything is rendered,
compiled or parsed.

Knows: how the client's reasoning switch (`chat_template_kwargs.enable_thinking`, or its
alias `thinking`) maps onto the render options of each format — on opens the format's
reasoning block (refused, 400, where the format has none); off is Qwen3's
`enable_thinking=False` for the Qwen3 ChatML framing (`reasoning_effort="none"`: an empty,
closed think block) and the plain non-reasoning prompt elsewhere, and what that prompt
did with the block for the grammar (opened, closed, neither: `grammar_thinking`, kept in the
request's call plan); where
stop strings are applied (`stops_outside_markup`); and which tools the
parser is told about (the call plan's shown tools, `()` when none: "no tools"
is not "tools unknown", which would let llama3-json read a JSON answer as a call); and call ids for formats whose
spec fixes their form (`call_ids`: mistral's 9 letters/digits): fresh ids in that
form for calls the model wrote without one, and the client's history ids (OpenAI's
`call_abc123`) mapped onto it, deterministically and consistently between an assistant's
`tool_calls` and the tool messages answering them.
Does not know: HTTP, pydantic, templates' text, engines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from callgate.errors import InvalidRequestError
from callgate.formats import QWEN3_FRAMING, CallIdForm, get_format
from callgate.parsers.base import CallIdFactory, random_call_id
from callgate.serving.protocol import ChatRequest, QuickRequest, ThinkingSwitch

Messages = tuple[Mapping[str, Any], ...]


def conform_chat(fmt: str, req: ChatRequest, *, reasons: bool = True) -> ChatRequest:
    """`req` with render options and call ids fit for format `fmt`, and its call plan's
    `thinking` set (`grammar_thinking`); 400 for a reasoning switch the format cannot
    honour. `reasons`: whether the served model writes reasoning blocks at all
    (Settings.reasoning); one that does not may open none."""
    thinking, effort = reasoning_options(fmt, req.thinking_switch, req.reasoning_effort)
    messages = conform_call_ids(fmt, req.messages)
    fitted = dataclasses.replace(req, thinking=thinking, reasoning_effort=effort, messages=messages)
    opened = grammar_thinking(fmt, fitted)
    plan = dataclasses.replace(req.plan, thinking=False if opened is None and not reasons else opened)
    return dataclasses.replace(fitted, plan=plan)


def conform_quick(fmt: str, req: QuickRequest) -> QuickRequest:
    """The /v1/quick counterpart of `conform_chat`."""
    thinking, effort = reasoning_options(fmt, req.thinking_switch, req.reasoning_effort)
    messages = conform_call_ids(fmt, req.messages)
    return dataclasses.replace(req, thinking=thinking, reasoning_effort=effort, messages=messages)


def reasoning_options(fmt: str, switch: ThinkingSwitch | None, effort: str | None) -> tuple[bool, str | None]:
    """(thinking, reasoning_effort) for templates.render; `thinking` is also the parser's
    flag: True exactly when the prompt opened a reasoning block."""
    if switch is None:
        return False, effort
    spec = get_format(fmt)
    if switch.on:
        if spec.reasoning_open is None:
            param = f"chat_template_kwargs.{switch.key}"
            raise InvalidRequestError(
                f"{param}: the {fmt} format has no reasoning mode; only false is accepted", param=param
            )
        return True, effort
    if spec.framing == QWEN3_FRAMING:  # its renderer reads reasoning_effort "none" as thinking off
        return False, "none"
    return False, effort


def grammar_thinking(fmt: str, req: ChatRequest) -> bool | None:
    """What the prompt of a conformed `req` did with the format's reasoning block, for the
    grammar (constraints.request `Thinking`): True opened it; False closed an empty one —
    the Qwen3 framing's `reasoning_effort="none"` (the switch off), after which the model
    may open no other; None otherwise (no switch: the model may open one itself where the
    format reads one). Other formats' prompts open no block to close when the switch is
    off (dsml closes one with or without it), so their grammars stay as without a switch."""
    if req.thinking:
        return True
    if req.reasoning_effort == "none" and get_format(fmt).framing == QWEN3_FRAMING:
        return False
    return None


def parser_tools(req: ChatRequest) -> tuple[Mapping[str, Any], ...]:
    """The tools the prompt shows (the call plan's): none under tool_choice `none`, `()`
    when none were given."""
    return req.plan.shown_tools()


def stops_outside_markup(fmt: str, req: ChatRequest) -> bool:
    """Whether callgate applies the request's stop strings itself, to the text between the
    format's markup (serving/stop_filter.py), rather than the engine to all the output: when
    the output may hold a call (the prompt shows tools) or a reasoning block (the format
    reads one; Qwen3 opens its own unasked). An engine stop string matching inside reasoning
    would leave the block unterminated; the filter ends the turn with the reasoning so far."""
    calls = bool(parser_tools(req))
    return bool(req.stop) and (calls or get_format(fmt).reasoning_open is not None)


# ---- call ids -----------------------------------------------------------------------------


def call_id_factory(fmt: str) -> CallIdFactory:
    """Ids for calls the model wrote without one: OpenAI's form, or the format's own."""
    form = get_format(fmt).call_ids
    if form is None:
        return random_call_id

    def own_call_id(index: int) -> str:
        """A random id in the format's own form (index unused)."""
        del index
        return "".join(secrets.choice(form.alphabet) for _ in range(form.length))

    return own_call_id


def conform_call_ids(fmt: str, messages: Sequence[Mapping[str, Any]]) -> Messages:
    """`messages` with every call id the format cannot write replaced by one it can; ids
    already in form are kept. The mapping depends only on the conversation, so equal
    conversations render equally (prefix cache) and a call and its result keep matching."""
    form = get_format(fmt).call_ids
    if form is None:
        return tuple(messages)
    pattern = re.compile(form.pattern)
    ids = list(dict.fromkeys(_ids(messages)))
    taken = {i for i in ids if pattern.fullmatch(i)}
    mapping: dict[str, str] = {}
    for old in ids:
        if old not in taken:
            mapping[old] = _derived_id(old, taken, form)
            taken.add(mapping[old])
    if not mapping:
        return tuple(messages)
    return tuple(_renamed(m, mapping) for m in messages)


def _ids(messages: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    for m in messages:
        for call in m.get("tool_calls") or ():
            if isinstance(call.get("id"), str):
                yield call["id"]
        if isinstance(m.get("tool_call_id"), str):
            yield m["tool_call_id"]


def _derived_id(old: str, taken: set[str], form: CallIdForm) -> str:
    """An id in `form` from a hash of `old`; salted again on the (rare) clash."""
    salt = 0
    while True:
        digest = int.from_bytes(hashlib.sha256(f"{salt}:{old}".encode()).digest(), "big")
        chars = []
        for _ in range(form.length):
            digest, k = divmod(digest, len(form.alphabet))
            chars.append(form.alphabet[k])
        candidate = "".join(chars)
        if candidate not in taken:
            return candidate
        salt += 1


def _renamed(message: Mapping[str, Any], mapping: Mapping[str, str]) -> Mapping[str, Any]:
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [{**c, "id": _mapped(c.get("id"), mapping)} for c in out["tool_calls"]]
    if "tool_call_id" in out:
        out["tool_call_id"] = _mapped(out["tool_call_id"], mapping)
    return out


def _mapped(call_id: Any, mapping: Mapping[str, str]) -> Any:
    return mapping.get(call_id, call_id) if isinstance(call_id, str) else call_id
