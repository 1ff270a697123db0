"""Typed parameter values of the qwen3-xml format.

Knows: how a parameter value, written as bare text between `<parameter=P>\\n` and
`\\n</parameter>`, is turned into a JSON value by the parameter's declared schema
(golden/qwen3-xml/FORMAT.md section 6). Does not know: the call syntax or streaming.

Declared types come from the property's `type` (a string or a list, tried in its order),
after following its `$ref`s, else from its `const` / `enum` values (pydantic's Literal[...]:
their types, every non-string one before `string`, so `1` under `enum: [1, "one"]` is the
integer 1 and a string value such a type reads differently cannot be written), else from
`anyOf` / `oneOf` branches in their order (a branch without a `type` accepts the raw text;
a branch whose `$ref` is already being read, a cycle, adds nothing). A property without any
type, an undeclared parameter and a parameter of an unknown tool keep the raw text: the
validator decides. So the first `string` (or untyped branch) ends the list: under
`anyOf: [string, integer]` or `[string, null]` every text, `5` and `None` included, is the
string.

Per type: `string` -> the text; `integer` -> `-?(0|[1-9][0-9]*)`; `number` -> JSON number
syntax; `boolean` -> `true`/`false`/`True`/`False` (the template writes Python `str()`);
`null` -> `null`/`None`; `object`/`array` -> JSON of that kind by the one strict rule
(callgate/strict_json.py: no NaN, no duplicate keys, no lone surrogates, bounded nesting),
with no surrounding whitespace. Numbers are held to the same rule's range. A value that fits none of its types is an
error code, never a guess: `invalid_json_value` when a container type was declared and
the text starts like JSON but does not parse, `value_type_mismatch` otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from callgate import strict_json
from callgate.schema_ref import RefError, follow_refs

RAW = ""  # pseudo type: keep the text as it is

_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_BOOLEANS = {"true": True, "false": False, "True": True, "False": False}
_NULLS = frozenset({"null", "None"})
_CONTAINERS = {"object": dict, "array": list}
_SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean", "null"})
# The characters a text of each non-string type starts with: the grammar keeps a raw string
# that such a type would read (and find invalid) from starting with one of them.
FIRST_CHARS = {
    "integer": "-0123456789",
    "number": "-0123456789",
    "boolean": "tfTF",
    "null": "nN",
    "object": "{",
    "array": "[",
}
# The order the types of `const` / `enum` values are tried in: `string` last (it reads every
# text), and the other types' texts are disjoint but for integer/number (`2` is an integer).
_VALUE_TYPES = ("null", "boolean", "integer", "number", "object", "array", "string")
# Every text read as a boolean / null, in the order the grammar writes them.
SPELLINGS = {"boolean": tuple(_BOOLEANS), "null": ("null", "None")}


@dataclass(frozen=True, slots=True)
class TypedValue:
    """A decoded value, or the diagnostic code that says why there is none."""

    value: Any = None
    error: str | None = None
    expected: str = ""  # the declared types, for the diagnostic message
    reason: str = ""  # for invalid_json_value: what strict_json found wrong


def declared_types(prop: Any, root: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The types to try, in order, each once; RAW stands for "any text". () when none is
    declared. A `$ref` (the property's, a branch's) is followed within `root`, the tool's
    parameter schema, as the grammar follows it (callgate.schema_ref); one that does not
    resolve declares nothing."""
    return tuple(dict.fromkeys(_declared(prop, root or {}, frozenset())))


def _declared(prop: Any, root: Mapping[str, Any], reading: frozenset[str]) -> list[str]:
    """`reading`: the branch `$ref`s being read (a branch that names one again is a cycle)."""
    try:
        prop = follow_refs(prop, root)
    except RefError:
        return []
    if not isinstance(prop, Mapping):
        return []
    kind = prop.get("type")
    if isinstance(kind, str):
        return [_known(kind)]
    if isinstance(kind, list):
        return [_known(k) if isinstance(k, str) else RAW for k in kind]
    values = [prop["const"]] if "const" in prop else prop.get("enum")
    if isinstance(values, list) and values:
        kinds = {_kind_of(v) for v in values}
        return [k for k in _VALUE_TYPES if k in kinds]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        branches = prop.get(key)
        if isinstance(branches, list):
            for branch in branches:
                ref = branch.get("$ref") if isinstance(branch, Mapping) else None
                if not isinstance(ref, str):
                    out.extend(_declared(branch, root, reading) or [RAW])
                elif ref not in reading:
                    out.extend(_declared(branch, root, reading | {ref}) or [RAW])
    return out


def _kind_of(value: Any) -> str:
    """The type a `const` / `enum` value is written and read back as: a float, even a whole
    one, is a `number` (the template writes `2.0`, which no integer reads)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _known(kind: str) -> str:
    return kind if kind in _SCALAR_TYPES or kind in _CONTAINERS else RAW


def streams_as_text(types: tuple[str, ...]) -> bool:
    """True when the value is the raw text whatever it holds (so it can be streamed)."""
    return not types or types[0] in ("string", RAW)


def decode(text: str, types: tuple[str, ...]) -> TypedValue:
    """The value of `text` under the first of `types` that fits it."""
    if streams_as_text(types):
        return TypedValue(text)
    broken = ""  # why text that starts like JSON is not (strict_json's words)
    for kind in types:
        if kind in ("string", RAW):
            return TypedValue(text)
        if kind in _CONTAINERS:
            fits, value, why = _container(text, _CONTAINERS[kind])
            broken = broken or why
        else:
            fits, value = _scalar(text, kind)
        if fits:
            return TypedValue(value)
    if broken:
        return TypedValue(error="invalid_json_value", expected=" or ".join(types), reason=broken)
    return TypedValue(error="value_type_mismatch", expected=" or ".join(types))


def _scalar(text: str, kind: str) -> tuple[bool, Any]:
    if kind == "integer" or kind == "number":
        if (_INTEGER if kind == "integer" else _NUMBER).fullmatch(text) is None:
            return False, None
        # None past the rule's range (an integer over its digits, a double that overflows):
        # no value the validator can use
        number = strict_json.number_value(text)
        return number is not None, number
    if kind == "boolean":
        return (True, _BOOLEANS[text]) if text in _BOOLEANS else (False, None)
    return (True, None) if text in _NULLS else (False, None)


def _container(text: str, kind: type) -> tuple[bool, Any, str]:
    """(fits, value, why it looked like JSON but did not parse: "" when it did not look so)."""
    if not text or text[0] not in "[{":
        return False, None, ""
    if text[-1] not in "]}":
        return False, None, "a JSON value that ends with ] or }"
    try:
        value = strict_json.loads(text)
    except strict_json.StrictJsonError as err:
        return False, None, str(err)
    return isinstance(value, kind), value, ""
