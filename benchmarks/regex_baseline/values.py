"""Argument values written as raw text (DSML `string="true"`, qwen3-xml string parameters).

Knows: how to split a parameter schema into the part that accepts strings (written raw, no
quotes or escapes) and the rest (written as JSON), following `$ref` branches, and the regex
of a raw string that may not contain the format's closing markers, nor a `Reserved` text
(one the format would read as another type). Does not know: any format's markers or
reserved texts (callers pass them) or how values are framed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.constraints.json_lexemes import FORMATS
from callgate.constraints.value_schema import ANNOTATIONS, with_closure
from callgate.errors import SchemaTooComplexError
from callgate.schema_ref import RefError, follow_refs

from .json_schema import REF_DEPTH, Context, declared_types, schema_regex, value_regex
from .text import alternation, char_class_excluding, literal, text_without

Schema = Mapping[str, Any] | bool
_NON_STRING = ["null", "boolean", "object", "array", "number"]


@dataclass(frozen=True, slots=True)
class Reserved:
    """Raw texts a format reads as something other than the string written (the qwen3-xml
    parser reads `5` as an integer where one is declared before `string`) and would then
    find invalid: `test` says which, and each of them starts with a character of `first`."""

    first: str = ""
    test: Callable[[str], bool] = lambda text: False


NOTHING_RESERVED = Reserved()


def split_string(schema: Any, root: Mapping[str, Any]) -> tuple[Schema | None, Schema | None]:
    """(schema of the string values, schema of the other values); None = no such values.

    The union of the two is exactly the input schema (callers validate the whole schema
    with json_schema first, so unsupported keywords were already named there), except that
    a branch's `$ref` (followed within `root`) is unrolled REF_DEPTH times, as json_schema
    unrolls it; an `unevaluatedProperties` applies to the non-string part.
    """
    return _split_string(schema, root, REF_DEPTH)


def _split_string(schema: Any, root: Mapping[str, Any], refs: int) -> tuple[Schema | None, Schema | None]:
    strings, others = _split(schema, root, refs)
    return strings, (with_closure(others, schema) if isinstance(schema, Mapping) else others)


def _split(schema: Any, root: Mapping[str, Any], refs: int) -> tuple[Schema | None, Schema | None]:
    if schema is True or (isinstance(schema, Mapping) and not schema.keys() - ANNOTATIONS):
        return {"type": "string"}, {"type": _NON_STRING}
    if schema is False or not isinstance(schema, Mapping):
        return None, None
    if "$ref" in schema:
        return _split_ref(schema, root, refs)
    if "type" in schema and schema.keys() & {"anyOf", "oneOf", "allOf", "const", "enum"}:
        return _split_typed(schema, root, refs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _split_branches(schema[key], key, root, refs)
    if "allOf" in schema:
        return _split_string(schema["allOf"][0], root, refs)
    if "const" in schema:
        return _split_values([schema["const"]])
    if "enum" in schema:
        return _split_values(schema["enum"])
    types = declared_types(schema, "")
    rest = [t for t in types if t != "string"]
    strings = {**schema, "type": "string"} if "string" in types else None
    return strings, ({**schema, "type": rest} if rest else None)


def _split_ref(schema: Mapping[str, Any], root: Mapping[str, Any], refs: int) -> tuple[Schema | None, Schema | None]:
    """A `$ref` (a branch's, or inside one): its target's parts, with no `$ref` left at their
    top (a raw string is written without reading one); none past the unrolling depth."""
    if refs <= 0:
        return None, None
    try:
        target = follow_refs(schema, root, with_closure)
    except RefError:  # json_schema names it when it reads the branch
        return None, None
    return _split_string(target, root, refs - 1)


def _split_typed(schema: Mapping[str, Any], root: Mapping[str, Any], refs: int) -> tuple[Schema | None, Schema | None]:
    """A `type` beside a combinator, `const` or `enum`: both apply. The string part is the
    rest's, when `type` allows strings; the other part keeps the non-string types beside
    the rest's (json_schema applies a `type` beside `allOf`)."""
    types = declared_types(schema, "")
    strings, others = _split({k: v for k, v in schema.items() if k != "type"}, root, refs)
    non_string = [t for t in types if t != "string"]
    typed_others = {"allOf": [others], "type": non_string} if others is not None and non_string else None
    return (strings if "string" in types else None), typed_others


def _split_values(values: Sequence[Any]) -> tuple[Schema | None, Schema | None]:
    strings = [v for v in values if isinstance(v, str)]
    others = [v for v in values if not isinstance(v, str)]
    return ({"enum": strings} if strings else None), ({"enum": others} if others else None)


def _split_branches(
    branches: Sequence[Any], key: str, root: Mapping[str, Any], refs: int
) -> tuple[Schema | None, Schema | None]:
    parts = [_split_string(b, root, refs) for b in branches]
    strings = [s for s, _ in parts if s is not None]
    others = [o for _, o in parts if o is not None]
    return ({key: strings} if strings else None), ({key: others} if others else None)


def raw_string(schema: Schema, markers: Sequence[str], banned: str, path: str) -> str | None:
    """Regex of the raw text of the string values of `schema` (from split_string); None
    when it admits none (`minLength` above `maxLength`)."""
    return unreserved_string(schema, markers, banned, path, NOTHING_RESERVED)


def unreserved_string(schema: Schema, markers: Sequence[str], banned: str, path: str, reserved: Reserved) -> str | None:
    """`raw_string` without the `reserved` texts; None when every string value is one."""
    if schema is True:
        return _free_text(markers, banned, reserved)
    assert isinstance(schema, Mapping)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            alts = [
                rx for b in schema[key] if (rx := unreserved_string(b, markers, banned, path, reserved)) is not None
            ]
            return alternation(alts) if alts else None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if values is not None:
        kept = [v for v in values if isinstance(v, str) and not reserved.test(v)]
        return _raw_literals(kept, markers, banned, path) if kept else None
    fmt = schema.get("format")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(fmt, str) and fmt in FORMATS and lo is None and hi is None:
        # a date, time or uuid holds `-` or `:` within: never a number, a keyword or JSON
        return FORMATS[fmt]
    if lo is None and hi is None:
        return _free_text(markers, banned, reserved)
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        return None  # no string is that long and that short
    # Length-bounded raw text: a plain character class (no marker can start in it) keeps the
    # count exact; stricter than needed, never weaker.
    starts = {m[0] for m in markers} | set(banned)
    chars = char_class_excluding(starts)
    if not reserved.first or hi == 0:
        return f"{chars}{{{lo or 0},{'' if hi is None else hi}}}"
    first = char_class_excluding(starts | set(reserved.first))
    rest = f"{chars}{{{max((lo or 0) - 1, 0)},{'' if hi is None else hi - 1}}}"
    return f"(?:{first}{rest})" + ("" if lo else "?")


def _free_text(markers: Sequence[str], banned: str, reserved: Reserved) -> str:
    """Any text without the markers; with `reserved`, only one that is empty or starts with
    none of its first characters. Stricter than needed (`3 apples`, `<b>` are left out too),
    and exact otherwise: a first character that starts no marker cannot be part of one
    (text_without's markers start with a character found nowhere else in them)."""
    text = text_without(markers, banned=banned)
    if not reserved.first:
        return text
    first = char_class_excluding({m[0] for m in markers if m} | set(banned) | set(reserved.first))
    return f"(?:{first}{text})?"


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
