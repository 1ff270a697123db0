"""Lark grammars of the JSON-call family: hermes, llama3-json, mistral.

Knows: how each JSON-call format frames a call (golden/{hermes,llama3-json,mistral}/
FORMAT.md), spelled with the markers of callgate.formats; a call object is one `%json`
schema (`name` const, then the arguments, mistral's optional `id`), so llguidance's JSON
compiler enforces the arguments. Does not know: tool_choice (callers pick the tools and the
number of calls) or vocabularies.

Family interface (read by lark_grammar.py; the qwen3-xml and dsml families have the same):
    calls(fmt, tools, *, parallel, b) -> Calls       the call block(s), trigger first
    content(fmt, b) -> str                           free text the parser reads as content
    content_markers(fmt), reasoning_markers(fmt)     what such text may not hold
    reasoning(fmt, b) -> str                         the rest of an opened reasoning block
    leading_reasoning(fmt) -> bool                   may the model open a block itself?
    lazy_ok(fmt) -> bool                             may content precede a call?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from callgate.constraints import json_calls
from callgate.constraints.json_schema import tool_param
from callgate.constraints.lark_schema import prepare, rebase
from callgate.constraints.lark_text import Builder, lit
from callgate.constraints.request import ToolSpec
from callgate.formats import HermesMarkers, MistralMarkers, ToolCallFormat, call_id_pattern, json_markers

content_markers = json_calls.content_markers
reasoning_markers = json_calls.reasoning_markers
lazy_ok = json_calls.lazy_ok


@dataclass(frozen=True, slots=True)
class Calls:
    """The call block(s) as `trigger rest`: `trigger` is the text that opens the first call
    (the lazy `auto` grammar ends free text at it), `rest` the expression after it."""

    trigger: str
    rest: str


def leading_reasoning(fmt: ToolCallFormat) -> bool:
    return bool(json_calls.leading_reasoning(fmt))


def call_schema(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, with_id: bool = False) -> dict[str, Any]:
    """One JSON schema for a call object to any of `tools`: an `anyOf` of `{name: const,
    arguments: parameters}` objects (keys in the format's order), each tool's parameters
    placed under `$defs` with their `$ref`s re-rooted there."""
    m = json_markers(fmt)
    defs: dict[str, Any] = {}
    branches: list[dict[str, Any]] = []
    for tool in tools:
        slot = f"args_{len(defs)}"
        args = prepare(tool.parameters, tool_param(tool.index), object_only=True)
        defs[slot] = rebase(args, f"#/$defs/{slot}")
        props: dict[str, Any] = {m.name_key: {"const": tool.name}, m.arguments_key: {"$ref": f"#/$defs/{slot}"}}
        if with_id:
            props[fmt.markers_as(MistralMarkers).id_key] = {"type": "string", "pattern": f"^{call_id_pattern(fmt)}$"}
        required = [m.name_key, m.arguments_key]
        branches.append({"type": "object", "properties": props, "required": required, "additionalProperties": False})
    doc: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    return {**doc, "$defs": defs}


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool, b: Builder) -> Calls:
    """One call (parallel=False) or one or more, starting with the format's call trigger."""
    layout = json_markers(fmt).call_layout
    if layout == "single":
        # The template writes no <|python_tag|> (the parser accepts one); one call only.
        body = b.json(call_schema(fmt, tools))
        return Calls("", body)  # no trigger: the call is the whole output (lark_grammar.py)
    if layout == "list":
        return _list_calls(fmt, tools, parallel, b)
    return _object_calls(fmt, tools, parallel, b)


def _object_calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], parallel: bool, b: Builder) -> Calls:
    m = fmt.markers_as(HermesMarkers)
    body = b.json(call_schema(fmt, tools))
    inner = f"{lit(chr(10))} {body} {lit(chr(10))} {b.marker(m.block_close)}"
    block = b.rule("call_block", f"{b.marker(m.block_open)} {inner}")
    more = f" ({lit(m.call_separator)} {block})*" if parallel else ""
    return Calls(m.block_open, b.rule("calls_rest", inner + more))


def _list_calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], parallel: bool, b: Builder) -> Calls:
    m = fmt.markers_as(MistralMarkers)
    obj = b.json(call_schema(fmt, tools, with_id=True))
    items = f"{obj} ({lit(', ')} {obj})*" if parallel else obj
    return Calls(m.calls, b.rule("calls_rest", f'"[" {items} "]"'))


def reasoning(fmt: ToolCallFormat, b: Builder) -> str:
    """The rest of a reasoning block (the prompt or the model opened it): text holding no
    control token up to its close, then at most a blank line."""
    assert fmt.reasoning_close is not None
    body = b.text_until("reasoning", reasoning_markers(fmt), fmt.reasoning_close)
    return f"{body} {lit(chr(10))}{{0,2}}"


def content(fmt: ToolCallFormat, b: Builder) -> str:
    """Free text the parser reads as content: no control token; in the single layout
    (llama3-json) nothing that starts like a call (`{`, `[`, `<|python_tag|>`)."""
    markers = content_markers(fmt)
    if json_markers(fmt).call_layout == "single":
        return b.terminal("content", f"/[^{{\\[<]/ ({b.text('content_rest', markers)})")
    return b.text("content", markers)
