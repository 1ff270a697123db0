"""Messages + tools -> prompt text, in each model's native format. Pure Python.

Knows: which family renderer writes a format (`_RENDERERS`), and the render options
(`RenderOptions`, built once per render). Does not know: parsers, engines or HTTP.
Imports no torch, vllm, fastapi or pydantic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from callgate.formats import ToolCallFormat, get_format
from callgate.templates import chatml, dsml, llama3, mistral, qwen3_xml
from callgate.templates.render_options import RenderOptions

__all__ = ["RenderOptions", "render", "render_with"]

Renderer = Callable[
    [ToolCallFormat, Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None, RenderOptions], str
]

# format name -> the family renderer that writes it
_RENDERERS: Mapping[str, Renderer] = {
    "dsml-v3.2": dsml.render,
    "dsml-v4": dsml.render,
    "qwen3-xml": qwen3_xml.render,
    "hermes": chatml.render,
    "hermes-qwen2.5": chatml.render,
    "llama3-json": llama3.render,
    "mistral": mistral.render,
}


def render_with(
    format: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    options: RenderOptions,
) -> str:
    """Render a conversation under `options`. Raises callgate.errors.TemplateError on input
    the format cannot represent (the message names the message index and field)."""
    fmt = get_format(format)
    return _RENDERERS[fmt.name](fmt, messages, tools, options)


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
    """`render_with` with the options given as keywords (see RenderOptions for each)."""
    options = RenderOptions(thinking, drop_thinking, reasoning_effort, add_bos, add_generation_prompt)
    return render_with(format, messages, tools, options)
