"""Messages + tools -> prompt text, in each model's native format. Pure Python.

Knows: how to pick the family renderer for a format name. Does not know: parsers,
engines or HTTP. Imports no torch, vllm, fastapi or pydantic.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from callgate.formats import get_format

__all__ = ["render"]

# format name -> module that defines
# `render(fmt, messages, tools, *, thinking, drop_thinking, reasoning_effort, add_bos, add_generation_prompt) -> str`
_FORMAT_MODULES = {
    "dsml-v3.2": "callgate.templates.dsml",
    "dsml-v4": "callgate.templates.dsml",
    "qwen3-xml": "callgate.templates.qwen3_xml",
    "hermes": "callgate.templates.chatml",
    "hermes-qwen2.5": "callgate.templates.chatml",
    "llama3-json": "callgate.templates.llama3",
    "mistral": "callgate.templates.mistral",
}


def render(
    format: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool = False,
    drop_thinking: bool = True,
    reasoning_effort: str | None = None,
    add_bos: bool = True,
    add_generation_prompt: bool = True,
) -> str:
    """Render a conversation. Raises callgate.errors.TemplateError on input the format
    cannot represent (the message names the message index and field)."""
    fmt = get_format(format)
    module = importlib.import_module(_FORMAT_MODULES[fmt.name])
    prompt: str = module.render(
        fmt,
        messages,
        tools,
        thinking=thinking,
        drop_thinking=drop_thinking,
        reasoning_effort=reasoning_effort,
        add_bos=add_bos,
        add_generation_prompt=add_generation_prompt,
    )
    return prompt
