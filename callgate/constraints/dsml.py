"""Grammars of DSML (DeepSeek V3.2 / V4) call blocks.

Knows: the block layout of golden/dsml/FORMAT.md section 5, spelled with the markers of
callgate.formats; string-valued parameters are raw text (`string="true"`), all other values
JSON (`string="false"`), both derived from the parameter's schema. Does not know:
tool_choice or vocabularies.

Raw text (content, reasoning, string values) never holds U+FF5C, the bar of every DSML
marker: that keeps BOS, EOS, `｜DSML｜` and the parameter close out of it with a one-state
exclusion (stricter than the parser, which only stops a value at `/｜DSML｜parameter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from callgate.constraints.json_schema import at, ordered_members, tool_param
from callgate.constraints.request import ToolSpec
from callgate.constraints.text import alternation, literal, text_without
from callgate.constraints.values import check_whole, json_values, raw_string, resolve, split_string
from callgate.errors import SchemaTooComplexError
from callgate.formats import DsmlMarkers, ToolCallFormat

BAR = "\uff5c"


def content_markers(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger, where the
    trigger's own bar is the one allowed): think tags, and the bar of every DSML marker."""
    return [*_think(fmt), BAR]


def content(fmt: ToolCallFormat) -> str:
    """Text up to EOS or the call block (at least one character): no think tags, no DSML
    marker."""
    return text_without(content_markers(fmt), nonempty=True)


def reasoning(fmt: ToolCallFormat) -> str:
    assert fmt.reasoning_close is not None
    return text_without(_think(fmt), banned=BAR) + literal(fmt.reasoning_close)


def _think(fmt: ToolCallFormat) -> list[str]:
    return [t for t in (fmt.reasoning_open, fmt.reasoning_close) if t]


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """The whole block, from the blank line that introduces it to its closing tag."""
    m = fmt.markers_as(DsmlMarkers)
    invoke = alternation(_invoke(fmt, t) for t in tools)
    invokes = f"{invoke}(?:\n{invoke})*" if parallel else invoke
    return literal(m.call_prefix + m.block_open + "\n") + invokes + literal("\n" + m.block_close)


def _invoke(fmt: ToolCallFormat, tool: ToolSpec) -> str:
    m = fmt.markers_as(DsmlMarkers)
    head = literal(m.invoke_open + tool.name + m.tag_end + "\n")
    return head + _params(fmt, tool) + literal("\n" + m.invoke_close)


def _params(fmt: ToolCallFormat, tool: ToolSpec) -> str:
    path = tool_param(tool.index)
    props, required = object_properties(tool.parameters, path)
    members = []
    for key, schema in props.items():
        rx = _param(fmt, key, schema, tool.parameters, at(path, "properties", key))
        if rx is None:
            if key in required:
                raise SchemaTooComplexError(f"required parameter {key!r} at {path} admits no value", param=path)
            continue
        members.append((rx, key in required))
    return ordered_members(members, "\n")


def _param(fmt: ToolCallFormat, key: str, schema: Any, root: Mapping[str, Any], path: str) -> str | None:
    m = fmt.markers_as(DsmlMarkers)
    check_whole(schema, root, path)
    strings, others = split_string(resolve(schema, root, path), root)
    open_ = literal(m.param_open + key + m.string_attr)
    close = literal(m.param_close)
    alts = []
    text = None if strings is None else raw_string(strings, (), BAR, path)
    if text is not None:
        alts.append(literal("true" + m.tag_end) + text)
    rest = json_values(others, root, path)
    if rest is not None:
        alts.append(literal("false" + m.tag_end) + rest)
    return open_ + alternation(alts) + close if alts else None


def object_properties(schema: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], frozenset[str]]:
    """The declared properties and required names of a tool's parameter object.

    An object without `properties` gets no parameters (stricter than a free-form object,
    whose keys a regex could not keep unique). Raises for a non-object parameter schema.
    """
    declared = schema.get("type", "object")
    if declared != "object" or schema.keys() & {"anyOf", "oneOf", "allOf", "$ref", "enum", "const"}:
        raise SchemaTooComplexError(f"tool parameters at {path} must be a plain object schema", param=path)
    props = schema.get("properties", {})
    required = schema.get("required", [])
    missing = [r for r in required if r not in props]
    if missing:
        raise SchemaTooComplexError(
            f"schema keyword 'required' at {path} names undeclared properties {missing!r}", param=path
        )
    return props, frozenset(required)
