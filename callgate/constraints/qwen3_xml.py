"""Grammars of qwen3-xml (Qwen3-Coder) call blocks.

Knows: the call layout of golden/qwen3-xml/FORMAT.md section 4, spelled with the markers of
callgate.formats, and how the parser types a value by the parameter's declared `type`
(section 6.6): strings are raw text, integers/numbers JSON numbers, booleans
true/false/True/False, null null/None, objects and arrays strict JSON. Does not know:
tool_choice or vocabularies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from callgate.constraints.dsml import object_properties
from callgate.constraints.json_schema import (
    INTEGER,
    NUMBER,
    Context,
    at,
    ordered_members,
    tool_param,
    value_regex,
)
from callgate.constraints.request import ToolSpec
from callgate.constraints.text import alternation, literal, text_without
from callgate.constraints.values import check_whole, raw_string, resolve, split_string
from callgate.errors import SchemaTooComplexError
from callgate.formats import ToolCallFormat

_SCALARS = {"integer": INTEGER, "number": NUMBER, "boolean": "(?:true|false|True|False)", "null": "(?:null|None)"}


def _value_markers(fmt: ToolCallFormat) -> list[str]:
    """What ends or breaks a raw value for the parser (section 6.4). Control-token text is
    fine inside a value, and every extra marker costs the compiled Index a state in which
    most of the vocabulary is allowed."""
    m = fmt.markers
    return [m["parameter_close"], m["parameter_open"], m["function_close"], m["call_open"], m["call_close"]]


def content_markers(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger): control
    tokens and stray call tags."""
    m = fmt.markers
    return [*fmt.special_tokens, m["function_open"], m["function_close"], m["parameter_open"], m["parameter_close"]]


def content(fmt: ToolCallFormat) -> str:
    """Text before the first call (at least one character): no control token and no stray
    call tag."""
    return text_without(content_markers(fmt), nonempty=True)


def reasoning(fmt: ToolCallFormat) -> str:
    raise AssertionError("qwen3-xml has no reasoning block")


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    call = alternation(_call(fmt, t) for t in tools)
    sep = literal(fmt.markers["separator"])
    return f"{call}(?:{sep}{call})*" if parallel else call


def _call(fmt: ToolCallFormat, tool: ToolSpec) -> str:
    m = fmt.markers
    head = literal(m["call_open"] + "\n" + m["function_open"] + tool.name + m["tag_end"] + "\n")
    tail = literal(m["function_close"] + "\n" + m["call_close"])
    path = tool_param(tool.index)
    props, required = object_properties(tool.parameters, path)
    members = []
    for key, schema in props.items():
        value = _value(fmt, schema, tool.parameters, at(path, "properties", key))
        param = literal(m["parameter_open"] + key + m["tag_end"] + "\n") + value
        members.append((param + literal("\n" + m["parameter_close"] + "\n"), key in required))
    return head + ordered_members(members, "") + tail


def _value(fmt: ToolCallFormat, schema: Any, root: Mapping[str, Any], path: str) -> str:
    check_whole(schema, root, path)
    schema = resolve(schema, root, path)
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    if declared is None:
        strings, others = split_string(schema)
        generic = schema is True or (isinstance(schema, Mapping) and "anyOf" not in schema and "oneOf" not in schema)
        if strings is None or (others is not None and not generic):
            raise SchemaTooComplexError(
                f"parameter at {path} has no declared 'type', which qwen3-xml needs to type its value", param=path
            )
        return raw_string(strings, _value_markers(fmt), "", path)
    types = [declared] if isinstance(declared, str) else list(declared)
    alts = [rx for t in types if (rx := _typed(fmt, schema, t, root, path)) is not None]
    if not alts:
        raise SchemaTooComplexError(f"parameter at {path} admits no value", param=path)
    return alternation(alts)


def _typed(fmt: ToolCallFormat, schema: Mapping[str, Any], kind: str, root: Mapping[str, Any], path: str) -> str | None:
    """The values of one declared type (None: the rest of the schema admits none of it)."""
    one = {**schema, "type": kind}
    if kind == "string":
        strings, _ = split_string(one)
        return None if strings is None else raw_string(strings, _value_markers(fmt), "", path)
    if kind in _SCALARS and not schema.keys() & {"enum", "const", "anyOf", "oneOf", "allOf"}:
        return _SCALARS[kind]
    return value_regex(one, Context(root=root), path)
