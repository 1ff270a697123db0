"""The Lark rule of one qwen3-xml parameter value, typed as the parser reads it.

Knows: how the qwen3-xml parser reads a value (callgate.parsers.qwen3_xml_values: the
declared types in order, the first whose syntax fits the text wins, and the text itself once
a `string` or untyped branch is reached) and the value's end marker. Does not know: calls,
tool_choice or vocabularies.

    value(fmt, prop, types, root, path, b) -> str | None   # the value and "\\n</parameter>"

Per type tried before `string`:
* boolean / null: the spellings the parser reads (`true`/`True`, `null`/`None`) whose value
  the schema accepts;
* integer / number: every value, bounded (callgate.constraints.json_schema INTEGER/NUMBER:
  no number past a double's range, which the parser refuses); a finite set (enum/const) as
  its values' texts; otherwise llguidance's `%json` of the typed sub-schema (bounds,
  multipleOf);
* object / array: `%json` of the typed sub-schema (objects and arrays are JSON), each
  `type: string` in it narrowed to strings holding no value marker (`marker_free`).
The raw string (when a string reading follows) is free text up to the end marker holding
none of the parser's value markers, narrowed by its string schema (enum/const, minLength/
maxLength, pattern, the formats date, time, date-time and uuid; other formats are annotations,
as the validator reads them), and holding no text an earlier type reads: exactly (`~`) where
that type is a lexeme here, by its first character where it is `%json` (llguidance lexes
a `%json` value and a free-text lexeme at the same place only when their first bytes differ).
Every lexeme includes the end marker: a value is one lexeme, so the alternatives need no
lookahead between them.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from callgate.constraints.json_schema import FORMATS, INTEGER, NUMBER
from callgate.constraints.lark_schema import prepare, rebase
from callgate.constraints.lark_text import ANY, Builder, lit, regex_literal
from callgate.constraints.qwen3_xml import _takes_all
from callgate.constraints.values import resolve
from callgate.errors import SchemaTooComplexError
from callgate.formats import Qwen3XmlMarkers, ToolCallFormat
from callgate.parsers.qwen3_xml_values import FIRST_CHARS, RAW, SPELLINGS, decode
from callgate.schema_ref import RefError, follow_refs

# The texts each scalar type's syntax takes, as the parser matches them (qwen3_xml_values).
SYNTAX = {
    "integer": r"-?(?:0|[1-9][0-9]*)",
    "number": r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?",
    "boolean": "true|false|True|False",
    "null": "null|None",
}
_BOUNDED = {"integer": INTEGER, "number": NUMBER}
_CONTAINERS = ("object", "array")
# The guard on JSON strings (`marker_free`), defined once per `%json` document and left off
# literals (a pattern beside an `enum` costs llguidance's JSON compiler most): the matcher of
# the 12 agent tools (3 JSON-valued parameters) takes ~5 ms with it, ~3 ms without (byte
# vocabulary, best of 40).
_MAX_REFS = 8  # a string schema's `$ref`s followed at most this deep (a cycle adds nothing)


def end_marker(fmt: ToolCallFormat) -> str:
    m = fmt.markers_as(Qwen3XmlMarkers)
    return m.separator + m.parameter_close


def value_markers(fmt: ToolCallFormat) -> list[str]:
    """What ends or breaks a raw value for the parser (qwen3_xml_syntax: its value scanner)
    beside the end marker."""
    m = fmt.markers_as(Qwen3XmlMarkers)
    sep = m.separator
    return [sep + m.parameter_open, m.function_close, m.call_open, m.call_close, fmt.eos]


def value(
    fmt: ToolCallFormat, prop: Any, types: tuple[str, ...], root: Mapping[str, Any], path: str, b: Builder
) -> str | None:
    """The rule of the texts (each with the end marker) the parser reads, by `types` (its
    `declared_types`), into values `prop` accepts; None when there are none. `root`: the
    tool's prepared parameter schema, which `prop`'s `$ref`s point into."""
    schema = resolve(prop, root, path)
    if isinstance(prop, Mapping) and "$ref" in prop and isinstance(schema, Mapping):
        # a $ref applies with its siblings (strict tools close an object beside its $ref)
        schema = {**schema, **{k: v for k, v in prop.items() if k != "$ref"}}
    tried = list(itertools.takewhile(lambda t: t not in ("string", RAW), types))
    numeric = [k for k in tried if k in _BOUNDED]
    finite = {k: _finite(schema, k, root) for k in numeric}
    numeric_json = any(not _takes_all(schema, k, root, frozenset()) and finite[k] is None for k in numeric)
    checker = _Checker(root, schema)
    lexemes: list[str] = []  # terminals of the typed texts
    exact: list[str] = []  # what a raw string may not be
    firsts = ""  # what a raw string may not start with
    json_kinds: list[str] = []
    for kind in tried:
        if kind in SPELLINGS:
            spelled = [s for s in SPELLINGS[kind] if checker.valid(decode(s, (kind,)).value)]
            lexemes += [b.terminal(kind, " | ".join(lit(s) for s in spelled))] if spelled else []
            exact.append(SYNTAX[kind])
        elif kind in _CONTAINERS or numeric_json:
            json_kinds.append(kind)
            firsts += FIRST_CHARS[kind]
        elif finite[kind] is not None:
            texts = [json.dumps(v) for v in finite[kind] or () if checker.valid(v)]
            lexemes += [b.terminal(kind, " | ".join(lit(t) for t in texts))] if texts else []
            exact.append(SYNTAX[kind])
        else:
            lexemes.append(b.terminal(kind, f"/{_BOUNDED[kind]}/"))
            exact.append(SYNTAX[kind])
    if len(tried) < len(types) or not types:
        raw = _raw_string(fmt, schema, root, path, exact, firsts, b)
        lexemes += [raw] if raw is not None else []
    end = lit(end_marker(fmt))
    alts = [f"{b.json(_json_doc(fmt, schema, json_kinds, root, path))} {end}"] if json_kinds else []
    if lexemes:
        alts.append(b.terminal("value", f"({' | '.join(lexemes)}) {end}"))
    return b.rule("value", " | ".join(alts)) if alts else None


class _Checker:
    """Whether a value is valid under a parameter's schema (its `$ref`s read in `root`)."""

    def __init__(self, root: Mapping[str, Any], schema: Any) -> None:
        self._root, self._schema = root, schema
        self._validator: Any = None

    def valid(self, value: Any) -> bool:
        """False also where the validator cannot decide (a `$ref` cycle it recurses into)."""
        if self._validator is None:
            self._validator = Draft202012Validator(dict(self._root)).evolve(schema=self._schema)
        try:
            return bool(self._validator.is_valid(value))
        except RecursionError:
            return False


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "number" if isinstance(value, float) else "other"


def _finite(schema: Any, kind: str, root: Mapping[str, Any], depth: int = _MAX_REFS) -> list[Any] | None:
    """The values of `kind` (integer, number) `schema` can hold when they are finitely many
    (its enum/const, through anyOf/oneOf/allOf branches), a superset that callers check; None
    when there may be more."""
    try:
        schema = follow_refs(schema, root)
    except RefError:
        return None
    if not isinstance(schema, Mapping) or depth <= 0:
        return None if schema is not False else []
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        return [v for v in values if _kind(v) == kind]
    declared = schema.get("type")
    kinds = [declared] if isinstance(declared, str) else declared
    if isinstance(kinds, list) and kind not in kinds and not (kind == "integer" and "number" in kinds):
        return []
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            parts = [_finite(branch, kind, root, depth - 1) for branch in schema[key]]
            return None if any(p is None for p in parts) else [v for p in parts for v in p or ()]
    for branch in schema.get("allOf") or ():
        found = _finite(branch, kind, root, depth - 1)
        if found is not None:
            return found
    return None


def _json_doc(fmt: ToolCallFormat, schema: Any, kinds: list[str], root: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The `%json` schema of the values of `kinds` (JSON texts) that `schema` accepts; its
    `$ref`s keep pointing at `root`'s definitions (the whole of `root` is carried, re-rooted,
    only where a `$ref` points elsewhere). Every `type: string` in it holds none of the value
    markers (the parser finds them in the JSON text too)."""
    typed: dict[str, Any] = {"allOf": [schema], "type": kinds} if isinstance(schema, Mapping) else {"type": kinds}
    doc = prepare(typed, path)
    defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root.get(k), Mapping)}
    if all(r.startswith(("#/$defs/", "#/definitions/")) for r in _refs([doc, defs])):
        whole = {**doc, **defs}
    else:
        slot = "#/$defs/qwen3_xml_root"
        whole = {**rebase(doc, slot), "$defs": {"qwen3_xml_root": rebase(root, slot)}}
    guard = marker_free(fmt)
    if guard is None:
        return whole
    out = _guarded(whole, guard)
    out["$defs"] = {**(out.get("$defs") or {}), _TEXT_DEF: {"type": "string", "pattern": guard}}
    return dict(out)


def marker_free(fmt: ToolCallFormat) -> str | None:
    """A JSON-Schema `pattern` (no lookaround) of the strings that hold none of the value
    markers a JSON text can hold (those without a newline, which JSON escapes), or None
    where they do not all start with the one `<` they hold: the text between two `<` must
    not start with a marker's rest."""
    markers = [m for m in value_markers(fmt) if "\n" not in m]
    if not markers or any(m[0] != "<" or "<" in m[1:] for m in markers):
        return None
    trie: dict[str, Any] = {}
    for m in markers:
        node = trie
        for ch in m[1:]:
            node = node.setdefault(ch, {})
        node[""] = {}  # a whole marker ends here

    def unstarted(node: dict[str, Any]) -> str:
        """Text without `<` that does not start with a rest below `node`."""
        nexts = sorted(c for c in node if c)
        alts = ["", f"[^<{''.join(re.escape(c) for c in nexts)}][^<]*"]
        alts += [re.escape(c) + unstarted(node[c]) for c in nexts if "" not in node[c]]
        return "(?:" + "|".join(alts) + ")"

    return f"^[^<]*(?:<{unstarted(trie)})*$"


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_TEXT_DEF = "qwen3_xml_text"  # the guarded plain string, defined once per document
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _guarded(node: Any, pattern: str | None) -> Any:
    """`node` with `pattern` on every schema of `type` string in it."""
    if pattern is None or not isinstance(node, Mapping):
        return node
    out = {k: v for k, v in node.items()}
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _guarded(v, pattern) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_guarded(v, pattern) for v in out[key]]
    for key in ("items", "additionalProperties"):
        out[key] = _guarded(out[key], pattern) if key in out else None
        if out[key] is None:
            del out[key]
    kind = out.get("type")
    if out == {"type": "string"}:
        return {"$ref": f"#/$defs/{_TEXT_DEF}"}
    values = [out["const"]] if "const" in out else out.get("enum")
    if isinstance(values, list) and not any(isinstance(v, str) and "<" in v for v in values):
        return out  # literals holding no marker
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        if "pattern" in out:
            out["allOf"] = [*out.get("allOf", []), {"pattern": pattern}]
        else:
            out["pattern"] = pattern
    return out


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    if not isinstance(node, Mapping):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [r for k, v in node.items() if k not in ("enum", "const") for r in _refs(v)]


def _raw_string(
    fmt: ToolCallFormat, schema: Any, root: Mapping[str, Any], path: str, exact: list[str], firsts: str, b: Builder
) -> str | None:
    """The terminal of the raw strings (without the end marker), or None when none is valid."""
    bad: list[str] = []
    markers = [*value_markers(fmt), end_marker(fmt)]
    rx = _string(schema, root, (path, markers, bad), b, _MAX_REFS)
    if bad:
        raise SchemaTooComplexError("qwen3-xml cannot write these values as raw text: " + "; ".join(bad), param=path)
    if rx is None:
        return None
    parts = [b.text("value_text", markers)]
    parts += [] if rx == ANY else [rx]
    parts += [f"~/{'|'.join(exact)}/"] if exact else []
    parts += [f"~/[{regex_literal(firsts)}](?s:.*)/"] if firsts else []
    return b.terminal("string", " & ".join(parts))


_Where = tuple[str, list[str], list[str]]  # (path, the value markers, the values found that hold one)


def _string(schema: Any, root: Mapping[str, Any], where: _Where, b: Builder, depth: int) -> str | None:
    """The terminal of the strings `schema` accepts (ANY for every string), None for none."""
    if schema is True:
        return ANY
    try:
        schema = follow_refs(schema, root)
    except RefError:
        return None
    if not isinstance(schema, Mapping) or depth <= 0:
        return None
    declared = schema.get("type")
    if declared is not None and "string" not in ([declared] if isinstance(declared, str) else declared):
        return None
    parts: list[str] = []
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        strings = [v for v in values if isinstance(v, str)]
        if not strings:
            return None
        path, markers, bad = where
        bad += [f"{path} holds {v!r}" for v in strings if any(m in v for m in markers)]
        parts.append(b.terminal("literal", " | ".join(lit(v) for v in strings)))
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        return None
    if lo is not None or hi is not None:
        parts.append(f"/(?s:.{{{lo or 0},{'' if hi is None else hi}}})/")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        parts.append(b.terminal("pattern", _pattern(pattern)))
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        parts.append(f"/{FORMATS[fmt]}/")
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            alts = [rx for x in schema[key] if (rx := _string(x, root, where, b, depth - 1)) is not None]
            if not alts:
                return None
            parts.append(ANY if ANY in alts else b.terminal("strings", " | ".join(alts)))
    for branch in schema.get("allOf") or ():
        rx = _string(branch, root, where, b, depth - 1)
        if rx is None:
            return None
        parts.append(rx)
    kept = [p for p in parts if p != ANY]
    return b.terminal("strings", " & ".join(kept)) if kept else ANY


def _pattern(pattern: str) -> str:
    """A JSON-Schema `pattern` (unanchored: it may match anywhere) as a whole-text regex."""
    body, start, end = pattern, "(?s:.*)", "(?s:.*)"
    if body.startswith("^"):
        body, start = body[1:], ""
    if body.endswith("$") and not body.endswith("\\$"):
        body, end = body[:-1], ""
    body = body.replace("\\/", "/").replace("/", "\\/").replace("\n", "\\n").replace("\r", "\\r")
    return f"/{start}(?:{body}){end}/"
