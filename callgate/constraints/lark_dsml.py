"""Lark grammars of the DSML family: DeepSeek V3.2 (`dsml-v3.2`) and V4 (`dsml-v4`).

Knows: the calls block of golden/dsml/FORMAT.md section 5, spelled with the markers of
callgate.formats (U+FF5C bars, multi-byte in UTF-8), and how the parser types a value by
its `string` flag: `string="true"` is raw text up to `</｜DSML｜parameter>` (a lazy rule
over one terminal: the string part of the parameter's schema, lark_raw.py),
`string="false"` one JSON value of the non-string part of the schema (`%json`, so
llguidance's JSON compiler enforces it). A parameter schema that admits both gets both
flags. A root union (`anyOf`/`oneOf` of object branches, beside shared `properties`) is
served as alternative parameter sets (lark_params.py). Does not know: tool_choice or
vocabularies. Family interface: see lark_json.py.

Raw text (content, reasoning, string values) never holds U+FF5C, the bar of every DSML
marker: that keeps BOS, EOS, `｜DSML｜` and the parameter close out of it (stricter than
the parser, which only ends a value at `/｜DSML｜parameter`). The call trigger is the whole
block opening with the blank line the model writes before it (`\\n\\n<｜DSML｜tool_calls>`):
the parser reads a block only after a blank line.

Parameters are written in the schema's order (the order the template renders an
arguments object built from it), each optional one may be left out.

Known gaps (the parser reports them, the validator never sees a bad call): a JSON string
nested in a `string="false"` value may hold `</｜DSML｜parameter>` or the EOS text, which
end the value for the parser (llguidance's `%json` has no way to keep a text out of its
strings); a marker is written as a special token only where the whole marker is one
(Builder.marker), so a vocabulary with `｜DSML｜` alone as a special token gets it spelled
in ordinary tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from callgate.constraints import text_markers
from callgate.constraints.lark_json import Calls
from callgate.constraints.lark_params import Member, parameter_sets
from callgate.constraints.lark_raw import ANY, kinds, raw_string
from callgate.constraints.lark_schema import prepare, rebase
from callgate.constraints.lark_text import Builder, lit
from callgate.constraints.param_path import at, tool_param
from callgate.constraints.request import ToolSpec
from callgate.errors import SchemaTooComplexError
from callgate.formats import DsmlMarkers, ToolCallFormat

BAR = text_markers.DSML_BAR
content_markers = text_markers.dsml_content
# text a name or key cannot hold: the parser ends one at '"' and fails on the others
_NAME_STOP = frozenset('"\n<>')
_NON_STRING = ["null", "boolean", "object", "array", "number", "integer"]
_ROOT = "#/$defs/parameters"


def reasoning_markers(fmt: ToolCallFormat) -> list[str]:
    """What reasoning may not hold: think tags and the bar of every DSML marker."""
    return content_markers(fmt)


def leading_reasoning(fmt: ToolCallFormat) -> bool:
    """Never: the DSML prompt always ends with `<think>` or `</think>` (GrammarRequest.thinking)."""
    return False


def lazy_ok(fmt: ToolCallFormat) -> bool:
    return True


def content(fmt: ToolCallFormat, b: Builder) -> str:
    """Text up to the end of turn or the block: no think tag, no DSML bar."""
    return b.text("content", content_markers(fmt))


def reasoning(fmt: ToolCallFormat, b: Builder) -> str:
    """The rest of the block the prompt opened: text up to `</think>`, content follows."""
    assert fmt.reasoning_close is not None
    return b.text_until("reasoning", reasoning_markers(fmt), fmt.reasoning_close)


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool, b: Builder) -> Calls:
    """The calls block after its trigger: one invoke (parallel=False) or more, one per line,
    then the closing tag. Raises SchemaTooComplexError naming every keyword the grammar
    cannot enforce."""
    m = fmt.markers_as(DsmlMarkers)
    bad: list[str] = []
    prepared = [prepare(t.parameters, tool_param(t.index), object_only=True) for t in tools]
    invokes = [_invoke(fmt, t, p, b, bad) for t, p in zip(tools, prepared, strict=True)]
    if bad:
        raise SchemaTooComplexError(
            "schema keywords the DSML grammar cannot enforce: " + ", ".join(bad), param=bad[0].rsplit(".", 1)[0]
        )
    dead = [tool_param(t.index) for t, i in zip(tools, invokes, strict=True) if i is None]
    if dead or not tools:
        where = ", ".join(dead) or "tools"
        raise SchemaTooComplexError(
            f"no call fits the schema at {where}: the tool cannot be called", param=dead[0] if dead else "tools"
        )
    invoke = b.rule("invoke", " | ".join(i for i in invokes if i is not None))
    nl = lit("\n")
    more = f" ({nl} {invoke})*" if parallel else ""
    assert fmt.call_trigger == m.call_prefix + m.block_open
    return Calls(fmt.call_trigger, b.rule("calls_rest", f"{nl} {invoke}{more} {nl} {b.marker(m.block_close)}"))


def _invoke(fmt: ToolCallFormat, tool: ToolSpec, prepared: Mapping[str, Any], b: Builder, bad: list[str]) -> str | None:
    """One invoke of `tool`, or None when no call of it can be written."""
    m = fmt.markers_as(DsmlMarkers)
    path = tool_param(tool.index)
    if _NAME_STOP & set(tool.name) or BAR in tool.name or not tool.name:
        bad.append(f"tools[{tool.index}].function.name")
        return None
    defs = {"$defs": {"parameters": rebase(prepared, _ROOT)}}
    sets = []
    for members in parameter_sets(tool.parameters, path, bad):
        params = [
            (_param(fmt, mem, tool.parameters, defs, at(path, "properties", mem.key), b, bad), mem) for mem in members
        ]
        if any(p is None and mem.required for p, mem in params):
            continue  # a required parameter admits no value: this set writes no call
        sets.append(_members(b, [(p, mem.required) for p, mem in params if p is not None]))
    if not sets:
        return None
    head = lit(m.invoke_open + tool.name + m.tag_end + "\n")
    return b.rule("invoke", f"{head} ({' | '.join(sets)}) {lit(chr(10))} {b.marker(m.invoke_close)}")


def _members(b: Builder, params: Sequence[tuple[str, bool]]) -> str:
    """Parameters in order, one per line, each optional one may be left out; the empty
    list is the empty line the template writes for a call without arguments. Built from
    the last parameter back: `rest` is what may follow once one was written, `first` what
    may stand first (a rule is added only where a parameter refers to it)."""
    nl = lit("\n")
    rest = first = '""'
    # what stands first is never past the first required parameter
    last_first = next((i for i, (_, required) in enumerate(params) if required), len(params))
    for i in range(len(params) - 1, -1, -1):
        param, required = params[i]
        after = _named(b, "params_rest", rest) if i < len(params) - 1 else rest
        tail, head = f"{nl} {param} {after}", f"{param} {after}"
        rest = tail if required else f"{tail} | {after}"
        if i <= last_first:
            first = head if required else f"{head} | {_named(b, 'params', first)}"
    return _named(b, "params", first)


def _named(b: Builder, stem: str, body: str) -> str:
    return body if body == '""' else b.rule(stem, body)


def _param(
    fmt: ToolCallFormat,
    mem: Member,
    root: Mapping[str, Any],
    defs: Mapping[str, Any],
    path: str,
    b: Builder,
    bad: list[str],
) -> str | None:
    """One parameter tag, string="true" and/or string="false" as its schemas allow; None
    when no value fits (or the key cannot be written)."""
    m = fmt.markers_as(DsmlMarkers)
    if _NAME_STOP & set(mem.key) or BAR in mem.key:
        if mem.required:
            bad.append(path)
        return None
    alts: list[str] = []
    raw = _raw(mem.schemas, root, path, bad)
    close = lit(m.param_close)
    if raw is not None:
        body = b.terminal("raw", _no_bar() if raw == ANY else f"({_no_bar()}) & ({raw})")
        # one terminal, not a lazy rule: the raw text holds no bar, so its match ends at the
        # closer's end anyway, and llguidance's slicer skips lazy lexemes (~330 us a mask)
        value = b.terminal("raw_value", f"{body} {close}")
        alts.append(f"{lit('true' + m.tag_end)} {value}")
    doc = _json_part(mem.schemas, root, path, defs)
    if doc is not None:
        alts.append(f"{lit('false' + m.tag_end)} {b.json(doc)} {close}")
    if not alts:
        return None
    return b.rule("param", f"{lit(m.param_open + mem.key + m.string_attr)} ({' | '.join(alts)})")


def _no_bar() -> str:
    return f"/[^{BAR}]*/"


def _raw(schemas: Sequence[Any], root: Mapping[str, Any], path: str, bad: list[str]) -> str | None:
    parts = []
    for schema in schemas:
        part = raw_string(schema, root, path, bad)
        if part is None:
            return None
        if part != ANY:
            parts.append(part)
    if not parts:
        return ANY
    return parts[0] if len(parts) == 1 else " & ".join(f"({p})" for p in parts)


def _json_part(
    schemas: Sequence[Any], root: Mapping[str, Any], path: str, defs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The `%json` schema of the parameter's non-string values; None when it has none.
    Its `$ref`s point into the tool's whole (prepared) parameter schema, kept under
    `$defs`."""
    found = frozenset.intersection(*(kinds(s, root) for s in schemas)) if schemas else frozenset()
    if not found - {"string"}:
        return None
    parts = [rebase(prepare(s, path), _ROOT) if isinstance(s, Mapping) else s for s in schemas]
    if "string" in found:
        parts.append({"type": _NON_STRING})
    doc: dict[str, Any] = parts[0] if len(parts) == 1 and isinstance(parts[0], dict) else {"allOf": parts}
    if '"$ref"' in json.dumps(doc):
        doc = {**doc, **defs}
    return doc
