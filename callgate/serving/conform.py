"""A validated request made to fit the served format, before anything is rendered,
compiled or parsed.

Knows: how the client's reasoning switch (`chat_template_kwargs.enable_thinking`, or its
alias `thinking`) maps onto the render options of each format — on opens the format's
reasoning block (refused, 400, where the format has none); off is Qwen3's
`enable_thinking=False` for the Qwen3 ChatML framing (`reasoning_effort="none"`: an empty,
closed think block) and the plain non-reasoning prompt elsewhere; and which tools the
parser and grammar are told about (the tools the prompt shows, `()` when none: "no tools"
is not "tools unknown", which would let llama3-json read a JSON answer as a call).
Does not know: HTTP, pydantic, templates' text, engines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from callgate.errors import InvalidRequestError
from callgate.formats import get_format
from callgate.serving.protocol import ChatRequest, QuickRequest, ThinkingSwitch
from callgate.templates.chatml import QWEN3  # its renderer reads reasoning_effort "none" as thinking off


def conform_chat(fmt: str, req: ChatRequest) -> ChatRequest:
    """`req` with render options and call ids fit for format `fmt`; 400 for a reasoning
    switch the format cannot honour."""
    thinking, effort = reasoning_options(fmt, req.thinking_switch, req.reasoning_effort)
    return dataclasses.replace(req, thinking=thinking, reasoning_effort=effort)


def conform_quick(fmt: str, req: QuickRequest) -> QuickRequest:
    """The /v1/quick counterpart of `conform_chat`."""
    thinking, effort = reasoning_options(fmt, req.thinking_switch, req.reasoning_effort)
    return dataclasses.replace(req, thinking=thinking, reasoning_effort=effort)


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
    if spec.framing == QWEN3:
        return False, "none"
    return False, effort


def parser_tools(req: ChatRequest) -> tuple[Mapping[str, Any], ...]:
    """The tools the prompt shows: none under tool_choice `none`, `()` when none were given."""
    return () if req.tool_choice == "none" else tuple(req.tools or ())
