"""A parameter value's schema, read as the qwen3-xml parser reads it.

Knows: how a top-level chain of local `$ref`s is followed (with callgate.schema_ref, as the
parser does) keeping an `unevaluatedProperties: false` that stands beside each, and when a
schema takes every value of one type. Does not know: grammars, formats or vocabularies.

    resolve(schema, root, path) -> Any          # raises SchemaTooComplexError for a bad $ref
    with_closure(target, outer) -> Any          # `target` carrying `outer`'s closure
    takes_all(schema, kind, root) -> bool       # every value of `kind` valid? False when unsure

Used by the Lark grammar of qwen3-xml values (lark_qwen3_values.py) and by the regex
baseline (benchmarks/regex_baseline/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.errors import SchemaTooComplexError
from callgate.schema_ref import RefError, follow_refs

# Keywords that constrain no value: annotations, and the containers of sub-schemas that are
# reached only through `$ref`.
ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
        "writeOnly", "$schema", "$id", "$anchor", "$defs", "definitions", "format",
        "contentMediaType", "contentEncoding", "nullable", "strict",
    }
)  # fmt: skip


def with_closure(target: Any, outer: Mapping[str, Any]) -> Any:
    """`target` (what `outer` applies in place: its `$ref`'s target, its only `allOf`
    branch, its non-string part) carrying `outer`'s `unevaluatedProperties: false`.

    Exact: the keyword sees the same evaluated fields whether it stands next to `$ref` or
    inside the target; a target that has its own `unevaluatedProperties` evaluates every
    field already, so `outer`'s has nothing left to reject.
    """
    if outer.get("unevaluatedProperties", True) is not False or target is False:
        return target
    if target is True:
        return {"unevaluatedProperties": False}
    if not isinstance(target, Mapping) or "unevaluatedProperties" in target:
        return target
    return {**target, "unevaluatedProperties": False}


def resolve(schema: Any, root: Mapping[str, Any], path: str) -> Any:
    """Follow a top-level chain of local `$ref`s (as the qwen3-xml parser does, with the same
    callgate.schema_ref), keeping an `unevaluatedProperties: false` beside each."""
    try:
        return follow_refs(schema, root, with_closure)
    except RefError as exc:
        raise SchemaTooComplexError(f"schema keyword '$ref' at {path} {exc}", param=path) from None


def takes_all(schema: Any, kind: str, root: Mapping[str, Any], reading: frozenset[str] = frozenset()) -> bool:
    """Whether every value of `kind` (integer, number, array) is valid under `schema`; False
    when unsure. `reading`: the `$ref`s being read (a cycle takes nothing more).

    An `anyOf` or `oneOf` takes all when one branch does: exact for `anyOf`; for `oneOf`
    only where its branches are disjoint (the regex baseline admits only branches of distinct
    types; the Lark grammar compiles `oneOf` as `anyOf`, and the validator, which checks the
    exact schema, has the last word)."""
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
    for key in ("anyOf", "oneOf"):
        if rest == {key}:
            return any(takes_all(b, kind, root, reading) for b in schema[key])
    return not rest
