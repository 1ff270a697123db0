"""Lark grammars of the qwen3-xml family (Qwen3-Coder XML calls).

Knows: the call layout of golden/qwen3-xml/FORMAT.md section 4, spelled with the markers of
callgate.formats:

    <tool_call>\\n<function=NAME>\\n (<parameter=P>\\nVALUE\\n</parameter>\\n)* </function>\\n</tool_call>

joined by `\\n` when parallel; which parameters a call may hold (its parameter sets); values
come from lark_qwen3_values.py, typed by the parser's own `declared_types`. Does not know:
tool_choice (callers pick the tools and the number of calls) or vocabularies. The family
interface is lark_json.py's.

Parameters:
* in any order, each at most once, every required one present (the parser accepts any
  order and refuses a repeated name): an llguidance parametric rule whose 64-bit value
  holds the parameters written, so a tool of k parameters costs k alternatives, not k!;
  `minProperties` / `maxProperties` are counts of those bits. A tool of more than 64
  parameters is written in schema order (each optional one may be left out);
* only declared ones (`properties`; an undeclared name cannot be kept unique);
* a root union (`anyOf` / `oneOf` of object branches, `$ref`s followed, pydantic / zod
  discriminated unions) is one parameter set per branch: the root's `properties` and
  `required` merged with the branch's (a name declared in both takes both schemas), `allOf`
  branches and a root `$ref` merged into every set. The parser types a value by the root's
  `properties` only (qwen3_xml_values): a name a branch alone declares is read as raw text,
  so such a parameter is written only as a string its schema accepts;
* a parameter whose value cannot be written is left out, a set needing one is dropped, and
  a tool with no set left (or whose name the parser cannot read) is a SchemaTooComplexError.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from callgate.constraints import qwen3_xml
from callgate.constraints.json_schema import tool_param
from callgate.constraints.lark_json import Calls
from callgate.constraints.lark_qwen3_values import value
from callgate.constraints.lark_schema import prepare
from callgate.constraints.lark_text import Builder, lit
from callgate.constraints.request import ToolSpec
from callgate.errors import SchemaTooComplexError
from callgate.formats import Qwen3XmlMarkers, ToolCallFormat
from callgate.parsers.qwen3_xml_values import declared_types
from callgate.schema_ref import RefError, follow_refs

content_markers = qwen3_xml.content_markers
_NAME = re.compile(r"[^\s<>=\"'/]+")  # a function or parameter name the parser reads
MAX_BITS = 64  # parameters a parametric rule can track


def reasoning_markers(fmt: ToolCallFormat) -> list[str]:
    return []


def leading_reasoning(fmt: ToolCallFormat) -> bool:
    return False  # no reasoning block (formats.QWEN3_XML)


def lazy_ok(fmt: ToolCallFormat) -> bool:
    return True  # content may precede the first call


def reasoning(fmt: ToolCallFormat, b: Builder) -> str:
    raise AssertionError("qwen3-xml has no reasoning block")


def content(fmt: ToolCallFormat, b: Builder) -> str:
    """Free text the parser reads as content: no control token and no stray call tag."""
    return b.text("content", content_markers(fmt))


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool, b: Builder) -> Calls:
    """One call (parallel=False) or one or more, after the `<tool_call>` trigger."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    call = b.rule("any_call", " | ".join(_call(fmt, tool, b) for tool in tools))
    more = f" ({lit(m.separator)} {b.marker(m.call_open)} {call})*" if parallel else ""
    return Calls(m.call_open, b.rule("calls_rest", call + more))


def _call(fmt: ToolCallFormat, tool: ToolSpec, b: Builder) -> str:
    m = fmt.markers_as(Qwen3XmlMarkers)
    sep = m.separator
    path = tool_param(tool.index)
    if not _NAME.fullmatch(tool.name):
        raise SchemaTooComplexError(
            f"qwen3-xml cannot write a call to {tool.name!r}: its names hold no whitespace, <, >, =, quotes or /",
            param=f"tools[{tool.index}].function.name",
        )
    sets = [a for s in parameter_sets(tool.parameters, path) if (a := _arguments(fmt, s, path, b)) is not None]
    if not sets:
        raise SchemaTooComplexError(f"the parameters at {path} admit no arguments qwen3-xml can write", param=path)
    head = lit(sep + m.function_open + tool.name + m.tag_end + sep)
    tail = f"{lit(m.function_close + sep)} {b.marker(m.call_close)}"
    return b.rule("call", f"{head} ({' | '.join(sets)}) {tail}")


@dataclass(slots=True)
class ParameterSet:
    """The parameters one call may hold: per name, the schemas its value must satisfy
    (all of them) and the types the parser reads it by; which are required; the counts."""

    root: Mapping[str, Any]  # the prepared parameter schema ($refs point into it)
    schemas: dict[str, list[Any]] = field(default_factory=dict)
    types: dict[str, tuple[str, ...]] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)
    closed: bool = False  # additionalProperties: false (no name beyond `schemas`)
    min_count: int = 0
    max_count: int | None = None


def parameter_sets(parameters: Mapping[str, Any], path: str) -> list[ParameterSet]:
    """The parameter sets of a tool (one, or one per root-union branch). Raises
    SchemaTooComplexError naming every keyword the grammar cannot enforce."""
    root = prepare(parameters, path, object_only=True)
    declared = parameters.get("properties")
    declared = declared if isinstance(declared, Mapping) else {}
    base = ParameterSet(root)
    base.types = {k: declared_types(v, parameters) for k, v in declared.items()}
    _merge(base, root, root, path)
    # the declared `additionalProperties: false` (not the `unevaluatedProperties: false` that
    # prepare() reads as one: that one sees the branches' names too)
    base.closed = parameters.get("additionalProperties") is False
    for part in [{"$ref": root["$ref"]}] if isinstance(root.get("$ref"), str) else []:
        _merge(base, _follow(part, root, path), root, path)
    for part in root.get("allOf") or ():
        _merge(base, _follow(part, root, path), root, path)
    branches = next((root[k] for k in ("anyOf", "oneOf") if isinstance(root.get(k), list)), None)
    if branches is None:
        return [base]
    out = []
    for branch in branches:
        one = ParameterSet(root, {k: list(v) for k, v in base.schemas.items()}, dict(base.types), set(base.required))
        one.closed, one.min_count, one.max_count = base.closed, base.min_count, base.max_count
        if _merge(one, _follow(branch, root, path), root, path):
            out.append(one)
    return out


def _follow(schema: Any, root: Mapping[str, Any], path: str) -> Any:
    try:
        return follow_refs(schema, root)
    except RefError as exc:
        raise SchemaTooComplexError(f"schema keyword '$ref' at {path} {exc}", param=path) from None


def _merge(into: ParameterSet, part: Any, root: Mapping[str, Any], path: str) -> bool:
    """Apply an object schema's properties, required names and counts to `into`; False when
    `part` admits no object (a branch of another type)."""
    if part is True or part == {}:
        return True
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        return False
    props = part.get("properties")
    props = props if isinstance(props, Mapping) else {}
    if part is not root and part.get("additionalProperties") is False:
        into.schemas = {k: v for k, v in into.schemas.items() if k in props}
    for key, schema in props.items():
        if into.closed and key not in into.schemas:
            continue  # the root allows no name it does not declare
        into.schemas.setdefault(key, []).append(schema)
    for pattern, schema in (part.get("patternProperties") or {}).items():
        for key in into.schemas:
            if re.search(pattern, key):
                into.schemas[key].append(schema)
    into.required |= {r for r in part.get("required") or () if isinstance(r, str)}
    into.min_count = max(into.min_count, int(part.get("minProperties", 0)))
    if isinstance(part.get("maxProperties"), int):
        top = int(part["maxProperties"])
        into.max_count = top if into.max_count is None else min(into.max_count, top)
    return into.required <= into.schemas.keys()


def _arguments(fmt: ToolCallFormat, params: ParameterSet, path: str, b: Builder) -> str | None:
    """The rule of the parameters of one set, or None when a required one cannot be written."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    sep = m.separator
    members: list[tuple[str, bool]] = []  # (rule, required), required first
    for key, schemas in params.schemas.items():
        where = f"{path}.properties.{key}"
        prop = schemas[0] if len(schemas) == 1 else {"allOf": schemas}
        rule = value(fmt, prop, params.types.get(key, ()), params.root, where, b) if _NAME.fullmatch(key) else None
        if rule is None:
            if key in params.required:
                return None
            continue
        tag = lit(m.parameter_open + key + m.tag_end + sep)
        members.append((b.rule("param", f"{tag} {rule} {lit(sep)}"), key in params.required))
    required = sum(req for _, req in members)
    if params.min_count > len(members) or (params.max_count is not None and params.max_count < required):
        return None
    if len(members) > MAX_BITS:
        return _in_order(members, params, path, b)
    return _any_order(sorted(members, key=lambda member: not member[1]), params, b)


def _any_order(members: list[tuple[str, bool]], params: ParameterSet, b: Builder) -> str:
    """Each member at most once in any order, the required ones (first in `members`) all."""
    k = len(members)
    required = sum(req for _, req in members)
    done = [f"is_ones([0:{required}])"] if required else []
    done += [f"bit_count_ge([0:{k}], {params.min_count})"] if params.min_count else []
    more = [f"bit_count_lt([0:{k}], {params.max_count})"] if params.max_count is not None else []
    if not members:
        return lit("")

    def body(name: str) -> str:
        alts = [f'"" %if {_all(done)}']
        for i, (rule, _) in enumerate(members):
            alts.append(f"{rule} {name}::set_bit({i}) %if {_all([f'bit_clear({i})', *more])}")
        return " | ".join(alts)

    return f"{b.parametric('arguments', body)}::0x0"


def _all(conds: list[str]) -> str:
    if not conds:
        return "true"
    out = conds[0]
    for c in conds[1:]:
        out = f"and({out}, {c})"
    return out


def _in_order(members: list[tuple[str, bool]], params: ParameterSet, path: str, b: Builder) -> str:
    if params.min_count or params.max_count is not None:
        raise SchemaTooComplexError(
            f"schema keywords minProperties/maxProperties at {path} are enforced for at most {MAX_BITS} parameters",
            param=path,
        )
    return b.rule("arguments", " ".join(rule if req else f"{rule}?" for rule, req in members))
