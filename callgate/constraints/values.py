"""Argument values written as raw text (DSML `string="true"`, qwen3-xml string parameters).

Knows: how to split a parameter schema into the part that accepts strings (written raw, no
quotes or escapes) and the rest (written as JSON), and the regex of a raw string that may
not contain the format's closing markers. Does not know: any format's markers (callers
pass them) or how values are framed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from callgate.constraints.json_schema import (
    ANNOTATIONS,
    FORMATS,
    Context,
    declared_types,
    schema_regex,
    value_regex,
    with_closure,
)
from callgate.constraints.text import alternation, char_class_excluding, literal, text_without
from callgate.errors import SchemaTooComplexError
from callgate.schema_ref import RefError, follow_refs

Schema = Mapping[str, Any] | bool
_NON_STRING = ["null", "boolean", "object", "array", "number"]


def resolve(schema: Any, root: Mapping[str, Any], path: str) -> Any:
    """Follow a top-level chain of local `$ref`s (as the qwen3-xml parser does, with the same
    callgate.schema_ref), keeping an `unevaluatedProperties: false` beside each."""
    try:
        return follow_refs(schema, root, with_closure)
    except RefError as exc:
        raise SchemaTooComplexError(f"schema keyword '$ref' at {path} {exc}", param=path) from None


def split_string(schema: Any) -> tuple[Schema | None, Schema | None]:
    """(schema of the string values, schema of the other values); None = no such values.

    The union of the two is exactly the input schema (callers validate the whole schema
    with json_schema first, so unsupported keywords were already named there); an
    `unevaluatedProperties` applies to the non-string part.
    """
    strings, others = _split(schema)
    return strings, (with_closure(others, schema) if isinstance(schema, Mapping) else others)


def _split(schema: Any) -> tuple[Schema | None, Schema | None]:
    if schema is True or (isinstance(schema, Mapping) and not schema.keys() - ANNOTATIONS):
        return {"type": "string"}, {"type": _NON_STRING}
    if schema is False or not isinstance(schema, Mapping):
        return None, None
    if "type" in schema and schema.keys() & {"anyOf", "oneOf", "allOf", "const", "enum"}:
        return _split_typed(schema)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _split_branches(schema[key], key)
    if "allOf" in schema:
        return split_string(schema["allOf"][0])
    if "const" in schema:
        return _split_values([schema["const"]])
    if "enum" in schema:
        return _split_values(schema["enum"])
    types = declared_types(schema, "")
    rest = [t for t in types if t != "string"]
    strings = {**schema, "type": "string"} if "string" in types else None
    return strings, ({**schema, "type": rest} if rest else None)


def _split_typed(schema: Mapping[str, Any]) -> tuple[Schema | None, Schema | None]:
    """A `type` beside a combinator, `const` or `enum`: both apply. The string part is the
    rest's, when `type` allows strings; the other part keeps the non-string types beside
    the rest's (json_schema applies a `type` beside `allOf`)."""
    types = declared_types(schema, "")
    strings, others = _split({k: v for k, v in schema.items() if k != "type"})
    non_string = [t for t in types if t != "string"]
    typed_others = {"allOf": [others], "type": non_string} if others is not None and non_string else None
    return (strings if "string" in types else None), typed_others


def _split_values(values: Sequence[Any]) -> tuple[Schema | None, Schema | None]:
    strings = [v for v in values if isinstance(v, str)]
    others = [v for v in values if not isinstance(v, str)]
    return ({"enum": strings} if strings else None), ({"enum": others} if others else None)


def _split_branches(branches: Sequence[Any], key: str) -> tuple[Schema | None, Schema | None]:
    parts = [split_string(b) for b in branches]
    strings = [s for s, _ in parts if s is not None]
    others = [o for _, o in parts if o is not None]
    return ({key: strings} if strings else None), ({key: others} if others else None)


def raw_string(schema: Schema, markers: Sequence[str], banned: str, path: str) -> str:
    """Regex of the raw text of the string values of `schema` (from split_string)."""
    if schema is True:
        return text_without(markers, banned=banned)
    assert isinstance(schema, Mapping)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return alternation(raw_string(b, markers, banned, path) for b in schema[key])
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if values is not None:
        return _raw_literals([v for v in values if isinstance(v, str)], markers, banned, path)
    fmt = schema.get("format")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(fmt, str) and fmt in FORMATS and lo is None and hi is None:
        return FORMATS[fmt]
    if lo is None and hi is None:
        return text_without(markers, banned=banned)
    # Length-bounded raw text: a plain character class (no marker can start in it) keeps the
    # count exact; stricter than needed, never weaker.
    chars = char_class_excluding({m[0] for m in markers} | set(banned))
    return f"{chars}{{{lo or 0},{'' if hi is None else hi}}}"


def _raw_literals(values: Sequence[str], markers: Sequence[str], banned: str, path: str) -> str:
    for v in values:
        if any(m in v for m in markers) or set(banned) & set(v):
            raise SchemaTooComplexError(
                f"schema keyword 'enum' at {path} holds {v!r}, which this format cannot write as a raw value",
                param=path,
            )
    return alternation(literal(v) for v in values)


def json_values(schema: Schema | None, root: Mapping[str, Any], path: str) -> str | None:
    """Regex of the JSON texts of the non-string values, or None when there are none."""
    if schema is None:
        return None
    return value_regex(schema, Context(root=root), path)


def check_whole(schema: Any, root: Mapping[str, Any], path: str) -> None:
    """Name any unsupported keyword of the full parameter schema (raises)."""
    schema_regex(schema, Context(root=root), path)


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
