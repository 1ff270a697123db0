"""A request's JSON Schema, made ready for llguidance's JSON compiler.

Knows: which JSON-Schema keywords llguidance 1.7 enforces (measured one by one: the others
fail its compile with "Unimplemented keys", naming only the first schema that has one), the
`format` values it knows, and how a sub-schema is moved into a bigger document without
breaking its `$ref`s. Does not know: formats or Lark.

    prepare(schema, param, *, object_only=False) -> dict   # raises SchemaTooComplexError

* Every keyword llguidance cannot enforce is named in one SchemaTooComplexError (400,
  `schema_too_complex`), with its place as an OpenAI-style param (`tools[0].function.
  parameters.properties.x.not`), rather than decoded under a weaker grammar.
* `unevaluatedProperties` (which strict tools' closing writes, callgate.strict_tools) is
  read as `additionalProperties` of the same value, after the names its `$ref` and
  combinator branches declare are added to the object's own `properties` (llguidance closes
  an object by its own `properties`, then intersects the branches): so a strict tool whose
  parameters are a root `$ref` or an `allOf` keeps its branches' properties (a name of one
  `anyOf` branch is then admitted beside another branch too: the validator is exact).
* A `format` llguidance does not know is an annotation (JSON Schema's default), dropped.
* An object that declares `properties` and says nothing of other keys is written with the
  declared ones only (its JSON-Schema default admits others; see `_declares_only`).
* `oneOf` is compiled as `anyOf` (the grammar may be wider than the schema there; the
  validator, which checks the exact schema, has the last word).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.constraints.param_path import at
from callgate.errors import SchemaTooComplexError
from callgate.schema_ref import RefError, ref_target

ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
        "writeOnly", "$schema", "$id", "$anchor", "contentMediaType", "contentEncoding",
        "nullable", "strict", "discriminator", "x-guidance",
    }
)  # fmt: skip
ENFORCED = frozenset(
    {
        "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
        "properties", "required", "additionalProperties", "unevaluatedProperties",
        "patternProperties", "minProperties", "maxProperties",
        "items", "prefixItems", "minItems", "maxItems",
        "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    }
)  # fmt: skip
FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "unevaluatedProperties")


def prepare(schema: Mapping[str, Any], param: str, *, object_only: bool = False) -> dict[str, Any]:
    """A copy of `schema` that llguidance compiles and enforces; `object_only` narrows it to
    JSON objects (a tool's arguments are always one). Raises SchemaTooComplexError naming
    every keyword the grammar cannot enforce."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    bad: list[str] = []
    out = _walk(_evaluated_names(schema, schema), param, bad)
    if bad:
        names = ", ".join(bad)
        raise SchemaTooComplexError(
            f"schema keywords the grammar cannot enforce: {names} (it enforces "
            + ", ".join(sorted(ENFORCED, key=str.lower))
            + "; annotations are ignored)",
            param=bad[0].rsplit(".", 1)[0] if "." in bad[0] else param,
        )
    if object_only and isinstance(out, dict):
        out = _as_object(out)
    assert isinstance(out, dict)
    return out


def _evaluated_names(node: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """`node` with every object that `unevaluatedProperties` closes beside `$ref` or a
    combinator given the names its branches evaluate (as `properties` of `{}`): llguidance
    closes an object by its own `properties` and intersects `allOf`/`$ref` branches after,
    so `additionalProperties: false` alone would refuse the branches' names."""
    if isinstance(node, list):
        return [_evaluated_names(v, root, depth) for v in node]
    if not isinstance(node, Mapping) or depth > 32:
        return node
    out = {k: (v if k in ("enum", "const", "default", "examples") else _evaluated_names(v, root, depth + 1))
           for k, v in node.items()}  # fmt: skip
    combined = any(k in node for k in ("$ref", "allOf", "anyOf", "oneOf"))
    if combined and node.get("unevaluatedProperties") is False:
        names = _branch_names(node, root, 0)
        own = dict(out.get("properties") or {})
        out["properties"] = {**{n: {} for n in names if n not in own}, **own}
    return out


def _branch_names(node: Any, root: Mapping[str, Any], depth: int) -> list[str]:
    """The property names `node` and its `$ref` / combinator branches declare."""
    if not isinstance(node, Mapping) or depth > 16:
        return []
    names = list(node.get("properties") or {}) if isinstance(node.get("properties"), Mapping) else []
    ref = node.get("$ref")
    if isinstance(ref, str):
        try:
            names += _branch_names(ref_target(ref, root), root, depth + 1)
        except RefError:
            pass
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(key) or ():
            names += _branch_names(branch, root, depth + 1)
    return list(dict.fromkeys(names))


def _as_object(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if kind == "object":
        return schema
    if kind is None:
        return {**schema, "type": "object"}
    kinds = kind if isinstance(kind, list) else [kind]
    return {**schema, "type": "object"} if "object" in kinds else {**schema, "type": "object", "enum": []}


def _walk(node: Any, path: str, bad: list[str], *, branch: bool = False) -> Any:
    """`node` prepared (see prepare). `branch`: it is an `anyOf`/`oneOf`/`allOf` member,
    whose object is merged with its siblings' and parent's: never closed on its own."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            bad.append(at(path, key))
            continue
        if key == "format":
            if value in FORMATS:
                out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {k: _walk(v, at(path, key, k), bad) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            members = key != "prefixItems"
            out[key] = [_walk(v, at(path, key, i), bad, branch=members) for i, v in enumerate(value)]
        elif key in _SCHEMA_VALUES:
            out[key] = _walk(value, at(path, key), bad)
        else:
            out[key] = value
    closing = out.pop("unevaluatedProperties", None)
    if closing is not None and closing is not True and "additionalProperties" not in out:
        out["additionalProperties"] = closing
    if not branch and _declares_only(node):
        out["additionalProperties"] = False
    return out


def _declares_only(node: Mapping[str, Any]) -> bool:
    """An object schema that declares `properties` and says nothing of others: the grammar
    writes the declared ones only (narrower than the schema, which admits others). A
    grammar cannot keep free keys unique, and the strict parser refuses a repeated key:
    free keys beside declared ones were a model's way to a 502 (`duplicate_key`)."""
    others = ("additionalProperties", "patternProperties", "unevaluatedProperties", "$ref", "allOf", "anyOf", "oneOf")
    return isinstance(node.get("properties"), Mapping) and not any(k in node for k in others)


def rebase(schema: Mapping[str, Any], base: str) -> dict[str, Any]:
    """`schema` with every local `$ref` ("#...") re-rooted at the JSON pointer `base`
    ("#/$defs/args_0"), for placing it at that pointer inside another document."""
    out = _rebase(schema, base.rstrip("/"))
    assert isinstance(out, dict)
    return out


def _rebase(node: Any, base: str) -> Any:
    if isinstance(node, list):
        return [_rebase(v, base) for v in node]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in ("enum", "const", "default", "examples"):
            out[key] = value
        else:
            out[key] = _rebase(value, base)
    return out
