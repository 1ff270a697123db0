"""Raw (unquoted) string values as llguidance terminals, and the JSON kinds a schema admits.

Knows: which strings a JSON schema admits, for a format that writes a string value verbatim
(no quotes, no escapes) up to a closing marker: `type`, `const`, `enum`, `minLength`,
`maxLength`, `pattern`, `format` (the ones with a regex below), `anyOf`/`oneOf` (a union),
`allOf` (an intersection) and local `$ref`s, all written as ONE terminal expression (`|`,
`&` of regexes and literals) so a caller can end it with its marker in one lazy rule.
Does not know: any format's markers or banned characters (callers intersect the result
with their own exclusions), nor Lark rules.

    raw_string(schema, root, path, bad) -> str | None   # terminal body; None: no string
    kinds(schema, root) -> frozenset[str]               # JSON types it may admit

Where a keyword cannot be enforced on raw text (a `format` llguidance knows but no regex
here spells, a `pattern` llguidance's regexes cannot read, a bound that is not a
non-negative integer) its place is
appended to `bad`; the caller raises one SchemaTooComplexError naming them all.
Stricter than the schema, never weaker: a `$ref` chain deeper than REF_DEPTH admits no
string; a `pattern` anchored at one end is anchored for all its alternatives.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import llguidance

from callgate.constraints.json_lexemes import FORMATS as _JSON_FORMATS
from callgate.constraints.lark_schema import ANNOTATIONS
from callgate.constraints.lark_schema import FORMATS as ENGINE_FORMATS
from callgate.constraints.param_path import at
from callgate.schema_ref import RefError, follow_refs

ANY = "/(?s:.*)/"
REF_DEPTH = 8
KINDS = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})

_HOST_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# Raw-text regexes of the `format`s llguidance enforces in JSON (lark_schema.FORMATS); the
# date/time/uuid ones are json_lexemes.FORMATS (the regex baseline's too). Each is narrower than
# or equal to its RFC: a model gets a plain spelling, never a value the format forbids.
FORMAT_REGEX: Mapping[str, str] = {
    **_JSON_FORMATS,
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "hostname": rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*",
    "email": rf"[A-Za-z0-9!#$%&'*+=?^_`{{|}}~.-]+@{_HOST_LABEL}(?:\.{_HOST_LABEL})*",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*",
}


def raw_string(schema: Any, root: Mapping[str, Any], path: str, bad: list[str]) -> str | None:
    """The terminal body of every raw text of a string `schema` admits (`ANY`: every
    text); None when it admits no string."""
    return _raw(schema, root, path, bad, REF_DEPTH)


def _raw(node: Any, root: Mapping[str, Any], path: str, bad: list[str], depth: int) -> str | None:
    if node is True:
        return ANY
    if node is False or not isinstance(node, Mapping):
        return None
    parts: list[str] = []
    types = node.get("type")
    if types is not None and "string" not in (types if isinstance(types, list) else [types]):
        return None
    values = [node["const"]] if "const" in node else node.get("enum")
    if values is not None:
        strings = [v for v in values if isinstance(v, str)]
        if not strings:
            return None
        parts.append("(" + " | ".join(json.dumps(v, ensure_ascii=False) for v in strings) + ")")
    length = _length(node, path, bad)
    if length is None:
        return None
    parts += length
    pattern = node.get("pattern")
    if pattern is not None:
        regex = pattern_regex(pattern) if isinstance(pattern, str) else None
        if regex is not None and _compiles(regex):
            parts.append(regex)
        else:
            bad.append(at(path, "pattern"))
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_REGEX:
        parts.append(f"/{_slashed(FORMAT_REGEX[fmt])}/")
    elif isinstance(fmt, str) and fmt in ENGINE_FORMATS:
        bad.append(at(path, "format"))  # the JSON engine would enforce it: never drop it here
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            alts = [
                r for i, b in enumerate(node[key]) if (r := _raw(b, root, at(path, key, i), bad, depth)) is not None
            ]
            if not alts:
                return None
            parts.append("(" + " | ".join(f"({r})" for r in alts) + ")")
    for i, sub in enumerate(node.get("allOf") or []):
        r = _raw(sub, root, at(path, "allOf", i), bad, depth)
        if r is None:
            return None
        parts.append(r)
    if "$ref" in node:
        r = _ref(node, root, path, bad, depth)
        if r is None:
            return None
        parts.append(r)
    kept = [p for p in parts if p != ANY]
    if not kept:
        return ANY
    return kept[0] if len(kept) == 1 else " & ".join(f"({p})" for p in kept)


def _ref(node: Mapping[str, Any], root: Mapping[str, Any], path: str, bad: list[str], depth: int) -> str | None:
    if depth <= 0:
        return None
    try:
        target = follow_refs({"$ref": node["$ref"]}, root)
    except RefError:
        bad.append(at(path, "$ref"))
        return None
    return _raw(target, root, at(path, "$ref"), bad, depth - 1)


def _length(node: Mapping[str, Any], path: str, bad: list[str]) -> list[str] | None:
    """[the length regex] ([] unbounded); None when no length fits."""
    lo, hi = node.get("minLength"), node.get("maxLength")
    for key, value in (("minLength", lo), ("maxLength", hi)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            bad.append(at(path, key))
            return []
    if lo is None and hi is None:
        return []
    if lo is not None and hi is not None and lo > hi:
        return None
    return [f"/(?s:.{{{lo or 0},{'' if hi is None else hi}}})/"]


def pattern_regex(pattern: str) -> str:
    """A JSON Schema `pattern` (unanchored: it may match anywhere) as a whole-text regex
    (llguidance's are anchored, and know no `^`/`$`): an end anchored with `^`/`$` is
    stripped, any other end gets `(?s:.*)`."""
    body, head, tail = pattern, "(?s:.*)", "(?s:.*)"
    if body.startswith("^"):
        body, head = body[1:], ""
    if body.endswith("$") and not _escaped_end(body):
        body, tail = body[:-1], ""
    return f"/{_slashed(f'{head}(?:{body}){tail}')}/"


@functools.lru_cache(maxsize=1024)
def _compiles(regex: str) -> bool:
    """Does llguidance read `regex` (no lookaround, no backreference, ...)?"""
    return not llguidance.LLMatcher.validate_grammar(f"%llguidance {{}}\nstart: {regex}\n", None)


def _escaped_end(body: str) -> bool:
    """Is the last character of `body` escaped (preceded by an odd run of backslashes)?"""
    run = len(body[:-1]) - len(body[:-1].rstrip("\\"))
    return run % 2 == 1


def _slashed(rx: str) -> str:
    """`rx` with every unescaped `/` escaped, for use inside `/.../`."""
    out: list[str] = []
    i = 0
    while i < len(rx):
        ch = rx[i]
        if ch == "\\" and i + 1 < len(rx):
            out.append(rx[i : i + 2])
            i += 2
            continue
        out.append("\\/" if ch == "/" else ch)
        i += 1
    return "".join(out)


def kinds(schema: Any, root: Mapping[str, Any]) -> frozenset[str]:
    """The JSON types `schema` may admit (`integer` beside `number` where only whole
    numbers may); wider than the schema where a keyword narrows values, never narrower."""
    return _kinds(schema, root, REF_DEPTH)


def _kinds(node: Any, root: Mapping[str, Any], depth: int) -> frozenset[str]:
    if node is True or (isinstance(node, Mapping) and not node.keys() - ANNOTATIONS):
        return KINDS
    if not isinstance(node, Mapping):
        return frozenset()
    out = KINDS
    types = node.get("type")
    if types is not None:
        declared = set(types if isinstance(types, list) else [types])
        if "number" in declared:
            declared.add("integer")
        out &= declared
    values = [node["const"]] if "const" in node else node.get("enum")
    if isinstance(values, list):
        out &= frozenset(k for v in values for k in _kinds_of(v))
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            out &= frozenset().union(*(_kinds(b, root, depth) for b in node[key]))
    for sub in node.get("allOf") or []:
        out &= _kinds(sub, root, depth)
    if "$ref" in node and depth > 0:
        try:
            out &= _kinds(follow_refs({"$ref": node["$ref"]}, root), root, depth - 1)
        except RefError:
            return frozenset()
    return out


def _kinds_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, bool):
        return ("boolean",)
    if isinstance(value, int):
        return ("integer", "number")
    if isinstance(value, float):
        return ("integer", "number") if value.is_integer() else ("number",)
    if isinstance(value, str):
        return ("string",)
    if value is None:
        return ("null",)
    return ("array",) if isinstance(value, list) else ("object",)
