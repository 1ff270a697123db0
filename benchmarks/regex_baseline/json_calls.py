"""Grammars of the JSON-call family: hermes, llama3-json, mistral.

Knows: how each JSON-call format frames a call (golden/{hermes,llama3-json,mistral}/
FORMAT.md), spelled with the markers of callgate.formats; arguments come from each tool's
parameter schema via json_schema, narrowed to objects (arguments are always one, also for
`parameters: {}`). Does not know: tool_choice (callers pick the tools and the number of
calls) or vocabularies.
"""

from __future__ import annotations

from collections.abc import Sequence

from callgate.constraints import text_markers
from callgate.constraints.param_path import tool_param
from callgate.constraints.request import ToolSpec
from callgate.formats import HermesMarkers, MistralMarkers, ToolCallFormat, call_id_pattern, json_markers

from .json_schema import Context, object_regex
from .json_text import WS, const_regex
from .text import alternation, literal, text_without

content_markers = text_markers.json_content
reasoning_markers = text_markers.json_reasoning
lazy_ok = text_markers.json_lazy_ok


def _arguments(tool: ToolSpec) -> str:
    schema = tool.parameters
    return object_regex(schema, Context(root=schema), tool_param(tool.index))


def _key(name: str) -> str:
    return f"{const_regex(name)}{WS}:{WS}"


def _call_object(tool: ToolSpec, fmt: ToolCallFormat, extra: str = "") -> str:
    m = json_markers(fmt)
    name = f"{_key(m.name_key)}{const_regex(tool.name)}"
    arguments = f"{_key(m.arguments_key)}{_arguments(tool)}"
    return rf"\{{{WS}{name}{WS},{WS}{arguments}{extra}{WS}\}}"


def content(fmt: ToolCallFormat) -> str:
    """Free text the parser reads as content (at least one character): no control token,
    no call syntax."""
    if json_markers(fmt).call_layout == "single":
        # Output starting with <|python_tag|>, { or [ is a call; a call object later on
        # is text_before_call.
        return rf"[^{{\[<]{text_without(content_markers(fmt))}"
    return text_without(content_markers(fmt), nonempty=True)


def reasoning(fmt: ToolCallFormat) -> str:
    """The rest of a reasoning block the prompt opened, its close and the blank line after."""
    assert fmt.reasoning_close is not None
    return text_without(reasoning_markers(fmt)) + literal(fmt.reasoning_close) + "\n{0,2}"


def leading_reasoning(fmt: ToolCallFormat) -> str:
    """A reasoning block the model may open itself (Qwen3 writes `<think>\n\n</think>\n\n`
    even when not thinking); "" where the format has none."""
    if fmt.reasoning_open is None or fmt.reasoning_close is None:
        return ""
    return f"(?:{literal(fmt.reasoning_open)}{reasoning(fmt)})?"


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """One call (parallel=False) or one or more, starting with the format's call trigger."""
    layout = json_markers(fmt).call_layout
    if layout == "single":
        # The template writes no <|python_tag|> (the parser accepts one); one call only.
        return alternation(_call_object(t, fmt) for t in tools)
    if layout == "list":
        return _list_calls(fmt, tools, parallel)
    return _object_calls(fmt, tools, parallel)


def _object_calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], parallel: bool) -> str:
    m = fmt.markers_as(HermesMarkers)
    body = alternation(_call_object(t, fmt) for t in tools)
    block = literal(m.block_open + "\n") + body + literal("\n" + m.block_close)
    return f"{block}(?:{literal(m.call_separator)}{block})*" if parallel else block


def _list_calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], parallel: bool) -> str:
    m = fmt.markers_as(MistralMarkers)
    call_id = f'(?:{WS},{WS}{_key(m.id_key)}"{call_id_pattern(fmt)}")?'
    obj = alternation(_call_object(t, fmt, call_id) for t in tools)
    items = f"{obj}(?:{WS},{WS}{obj})*" if parallel else obj
    return literal(m.calls) + rf"\[{WS}{items}{WS}\]"
