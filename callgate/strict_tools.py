"""What OpenAI's `strict: true` on a tool means for its parameter schema.

Knows: the rule that closes a schema's objects to unknown fields (`strict_schema`), shared
by the validator (callgate.serving.handoff.validation), which checks calls against the closed
schema, and the grammar (callgate.constraints.request), which is built from it, so that the
two agree on which objects are closed. Does not know: validation, grammars or HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Subschemas that describe a *value* of their own (an object there stands alone).
_VALUE_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_VALUE_ONE = ("additionalProperties", "items", "contains", "unevaluatedItems", "propertyNames")
_VALUE_LIST = ("prefixItems", "anyOf", "oneOf")
# In-place applicators whose subschemas are combined with a sibling: their objects are
# not closed on their own (allOf branches would reject each other's fields).
_COMBINED_ONE = ("not", "if", "then", "else")
_COMBINED_LIST = ("allOf",)
# anyOf/oneOf are not hints: their branches are closed one by one, which is enough.
_OBJECT_HINTS = ("type", "properties", "patternProperties", "required", "$ref", "allOf")


def strict_schema(schema: Mapping[str, Any] | bool) -> Mapping[str, Any] | bool:
    """`schema` with unknown fields forbidden wherever it does not say otherwise.

    OpenAI's `strict: true` means `additionalProperties: false` on every object. Here each
    standalone subschema that may describe an object and sets neither `additionalProperties`
    nor `unevaluatedProperties` gets `unevaluatedProperties: false` — which, unlike
    `additionalProperties`, sees the fields that `allOf`/`$ref`/`if` branches declare.
    Branches of `allOf`/`if`/`then`/`else`/`not` are left open (closing them separately
    would reject each other's fields); schemas with no type hint at all (`{}`) stay open.
    The input is not modified.
    """
    closed: Mapping[str, Any] | bool = _close(schema, standalone=True)
    return closed


def _close(schema: Any, *, standalone: bool) -> Any:
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _VALUE_MAPS and isinstance(value, Mapping):
            out[key] = {k: _close(v, standalone=key not in ("$defs", "definitions")) for k, v in value.items()}
        elif key in _VALUE_ONE:
            out[key] = _close(value, standalone=True)
        elif key in _VALUE_LIST and isinstance(value, Sequence):
            out[key] = [_close(v, standalone=True) for v in value]
        elif key in _COMBINED_ONE:
            out[key] = _close(value, standalone=False)
        elif key in _COMBINED_LIST and isinstance(value, Sequence):
            out[key] = [_close(v, standalone=False) for v in value]
        elif key == "dependentSchemas" and isinstance(value, Mapping):
            out[key] = {k: _close(v, standalone=False) for k, v in value.items()}
        else:
            out[key] = value
    open_ended = "additionalProperties" in out or "unevaluatedProperties" in out
    if standalone and not open_ended and _may_be_object(out):
        out["unevaluatedProperties"] = False
    return out


def _may_be_object(schema: Mapping[str, Any]) -> bool:
    if not any(k in schema for k in _OBJECT_HINTS):
        return False
    types = schema.get("type", "object")
    return types == "object" or (isinstance(types, list) and "object" in types)
