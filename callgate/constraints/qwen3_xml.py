"""Grammars of qwen3-xml (Qwen3-Coder) call blocks.

Knows: the call layout of golden/qwen3-xml/FORMAT.md section 4, spelled with the markers of
callgate.formats, and how the parser types a value (section 6.6, by the parser's own
`declared_types`: the `type`, else the types of the `const`/`enum` values with `string`
last, else the `anyOf`/`oneOf` branches in order, the first type whose syntax fits winning):
strings are raw text, integers/numbers JSON numbers, booleans true/false/True/False, null
null/None, objects and arrays strict JSON. Nothing after the first `string` is reachable
(`5` under `anyOf: [string, integer]` is a string). A raw string that a type tried before
`string` would read as an invalid value is not written (`"2"` under `enum: [1, "2"]`);
stricter than needed, such a string may not start with a character that type's values start
with (under `anyOf: [{$ref: Model}, string]` no string starts with `{` or `<`). Does not
know: tool_choice or vocabularies.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from callgate.constraints.dsml import object_properties
from callgate.constraints.json_schema import (
    ANNOTATIONS,
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
from callgate.constraints.values import (
    NOTHING_RESERVED,
    Reserved,
    check_whole,
    resolve,
    split_string,
    unreserved_string,
)
from callgate.errors import SchemaTooComplexError
from callgate.formats import Qwen3XmlMarkers, ToolCallFormat
from callgate.parsers.qwen3_xml_values import FIRST_CHARS, RAW, SPELLINGS, declared_types, decode
from callgate.schema_ref import RefError, follow_refs

_NUMBERS = {"integer": INTEGER, "number": NUMBER}


def _value_markers(fmt: ToolCallFormat) -> list[str]:
    """What ends or breaks a raw value for the parser (section 6.4). Control-token text is
    fine inside a value, and every extra marker costs the compiled Index a state in which
    most of the vocabulary is allowed."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    return [m.parameter_close, m.parameter_open, m.function_close, m.call_open, m.call_close]


def content_markers(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger): control
    tokens and stray call tags."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    return [*fmt.special_tokens, m.function_open, m.function_close, m.parameter_open, m.parameter_close]


def content(fmt: ToolCallFormat) -> str:
    """Text before the first call (at least one character): no control token and no stray
    call tag."""
    return text_without(content_markers(fmt), nonempty=True)


def reasoning(fmt: ToolCallFormat) -> str:
    raise AssertionError("qwen3-xml has no reasoning block")


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    call = alternation(_call(fmt, t) for t in tools)
    sep = literal(fmt.markers_as(Qwen3XmlMarkers).separator)
    return f"{call}(?:{sep}{call})*" if parallel else call


def _call(fmt: ToolCallFormat, tool: ToolSpec) -> str:
    m = fmt.markers_as(Qwen3XmlMarkers)
    head = literal(m.call_open + "\n" + m.function_open + tool.name + m.tag_end + "\n")
    tail = literal(m.function_close + "\n" + m.call_close)
    path = tool_param(tool.index)
    props, required = object_properties(tool.parameters, path)
    members = []
    for key, schema in props.items():
        value = _value(fmt, schema, tool.parameters, at(path, "properties", key))
        param = literal(m.parameter_open + key + m.tag_end + "\n") + value
        members.append((param + literal("\n" + m.parameter_close + "\n"), key in required))
    return head + ordered_members(members, "") + tail


def _value(fmt: ToolCallFormat, schema: Any, root: Mapping[str, Any], path: str) -> str:
    """The texts the parser reads (by `declared_types`, the parser's own rule) as values valid
    under `schema`: per non-string type it tries before any `string`, that type's values;
    then, when a string reading follows, the raw strings no earlier type takes from it."""
    check_whole(schema, root, path)
    schema = resolve(schema, root, path)
    types = declared_types(schema, root)
    tried = list(itertools.takewhile(lambda t: t not in ("string", RAW), types))
    alts, whole = [], set()
    for kind in tried:
        rx, takes_all = _typed(schema, kind, root, path)
        alts += [rx] if rx is not None else []
        whole |= {kind} if takes_all else set()
    if len(tried) < len(types) or not types:
        strings, _ = split_string(schema, root)
        if strings is None and not types:
            raise SchemaTooComplexError(
                f"parameter at {path} has no declared 'type' (nor const/enum values), "
                "which qwen3-xml needs to type its value",
                param=path,
            )
        reserved = _reserved(tried, whole)
        rx = None if strings is None else unreserved_string(strings, _value_markers(fmt), "", path, reserved)
        alts += [rx] if rx is not None else []
    if not alts:
        raise SchemaTooComplexError(f"parameter at {path} admits no value qwen3-xml can write", param=path)
    return alternation(alts)


def _typed(schema: Any, kind: str, root: Mapping[str, Any], path: str) -> tuple[str | None, bool]:
    """(the texts of the values of one non-string type, None when there are none; whether
    every value of that type is valid). Booleans and null in every spelling the parser reads
    (the template writes `True`, `None`); numbers and containers as JSON."""
    one = {**schema, "type": kind} if isinstance(schema, Mapping) else {"type": kind}
    rx = value_regex(one, Context(root=root), path)
    if rx is None:
        return None, False
    if kind in SPELLINGS:
        valid = [s for s in SPELLINGS[kind] if re.fullmatch(rx, json.dumps(decode(s, (kind,)).value))]
        return alternation(literal(s) for s in valid), len(valid) == len(SPELLINGS[kind])
    if kind in _NUMBERS and _takes_all(schema, kind, root, frozenset()):
        return _NUMBERS[kind], True
    return rx, kind == "array" and _takes_all(schema, kind, root, frozenset())


def _takes_all(schema: Any, kind: str, root: Mapping[str, Any], reading: frozenset[str]) -> bool:
    """Whether every value of `kind` (integer, number, array) is valid under `schema`; False
    when unsure. `reading`: the `$ref`s being read (a cycle takes nothing more)."""
    ref = schema.get("$ref") if isinstance(schema, Mapping) else None
    if isinstance(ref, str):
        if ref in reading:
            return False
        reading |= {ref}
    try:
        schema = follow_refs(schema, root)
    except RefError:
        return False
    if schema is True:
        return True
    if not isinstance(schema, Mapping):
        return False
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else declared
    if types is not None and kind not in types and not (kind == "integer" and "number" in types):
        return False
    rest = schema.keys() - ANNOTATIONS - {"type", "unevaluatedProperties"}
    for key in ("anyOf", "oneOf"):  # json_schema admits only oneOf branches of distinct types
        if rest == {key}:
            return any(_takes_all(b, kind, root, reading) for b in schema[key])
    return not rest


def _reserved(tried: Sequence[str], whole: set[str]) -> Reserved:
    """The raw texts that a type tried before `string` reads, where that type does not take
    every value: the parser would read them into invalid values."""
    partial = [k for k in tried if k not in whole]
    if not partial:
        return NOTHING_RESERVED

    def reads_invalid(text: str) -> bool:
        kind = next((k for k in tried if decode(text, (k,)).error is None), None)
        return kind is not None and kind not in whole

    return Reserved(first="".join(FIRST_CHARS[k] for k in partial), test=reads_invalid)
