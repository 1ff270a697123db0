"""The answer alternative of tool_choice `auto` with a response schema, beside JSON calls.

Knows: in the single call layout (llama3-json) a call is a bare object `{"name": ...,
"parameters": ...}`, so a JSON answer may start like one. The parser, told the request asks
for a JSON answer (`json_answer`, parsers/json_calls.py), reads a leading object as a call
only when its first two keys are the call's name key then arguments key; here the answer is
kept from ever starting so:
* objects with declared keys (`properties`, and `const`/`enum` values) are written with the
  arguments key before the name key wherever both occur (JSON objects are unordered, so the
  schema is met as before; json_schema already writes declared keys in one fixed order);
* a root that is a free-form object (`json_object`, or `type: object` with no `properties`)
  gets its own regex: its first key does not decode to the name key, or it is the name key
  (written plainly) and the second key does not decode to the arguments key;
* any other root schema that may write a free-form object (a `$ref`, `anyOf`/`oneOf`/
  `allOf` branch, a type list or an untyped schema) is refused with SchemaTooComplexError
  (a 400 at request time, naming why) rather than compiled into a grammar whose answers the
  parser could read as calls.
Other layouts mark their calls, and their answer is the plain schema regex.
Does not know: tool_choice, vocabularies, compilation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from callgate.constraints.json_schema import ANNOTATIONS, STRING, STRING_CHAR, WS, Context, schema_regex, value_regex
from callgate.constraints.text import literal
from callgate.errors import SchemaTooComplexError
from callgate.formats import Llama3Markers, ToolCallFormat
from callgate.schema_ref import RefError, ref_target

_PATH = "response_format"
_REF_DEPTH = 8


def answer_regex(fmt: ToolCallFormat, schema: Mapping[str, Any]) -> str:
    """The regex of the JSON answers under `schema` that the parser reads as the answer."""
    m = fmt.markers
    if not isinstance(m, Llama3Markers):  # only the "single" call layout reads an answer as a call
        return schema_regex(schema, Context(root=schema), _PATH)
    name, arguments = m.name_key, m.arguments_key
    ordered = _arguments_first(schema, name, arguments)
    assert isinstance(ordered, Mapping)
    if _is_free_object(ordered):
        return _free_answer(ordered, name, arguments)
    if _may_write_free_object(ordered, ordered, _REF_DEPTH):
        raise SchemaTooComplexError(
            f"{_PATH}: with tools under tool_choice auto, {fmt.name} reads an answer object whose first"
            f" keys are {name!r} then {arguments!r} as a call, and this schema may write a free-form"
            " object at its root through $ref, anyOf/oneOf/allOf, a type list or no type; give the"
            " root `type: object` with `properties` (or use json_object)",
            param=_PATH,
        )
    return schema_regex(ordered, Context(root=ordered), _PATH)


def _arguments_first(value: Any, name: str, arguments: str) -> Any:
    """`value` with every mapping that holds both keys rebuilt with `arguments` just before
    `name` (declared properties, const/enum objects; harmless elsewhere: order is free)."""
    if isinstance(value, list):
        return [_arguments_first(v, name, arguments) for v in value]
    if not isinstance(value, Mapping):
        return value
    keys = list(value)
    if name in value and arguments in value:
        keys.remove(arguments)
        keys.insert(keys.index(name), arguments)
    return {k: _arguments_first(value[k], name, arguments) for k in keys}


def _is_free_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" and set(schema) - ANNOTATIONS <= {"type", "additionalProperties"}


def _may_write_free_object(schema: Any, root: Mapping[str, Any], depth: int) -> bool:
    """Whether `schema` may write, as its value, an object whose keys it does not declare."""
    if not isinstance(schema, Mapping):
        return schema is True
    if "$ref" in schema:
        try:
            target = ref_target(schema["$ref"], root)
        except RefError:
            return False  # schema_regex names the broken $ref
        return depth > 0 and _may_write_free_object(target, root, depth - 1)
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in schema.get(key) or ()]
    if any(_may_write_free_object(b, root, depth) for b in branches):
        return True
    if "const" in schema or "enum" in schema or "properties" in schema:
        return False
    kinds = schema.get("type", "object")
    return kinds == "object" or (isinstance(kinds, list) and "object" in kinds)


def _free_answer(schema: Mapping[str, Any], name: str, arguments: str) -> str:
    value = value_regex(schema.get("additionalProperties", True), Context(root=schema), f"{_PATH}.additionalProperties")
    if value is None:
        return rf"\{{{WS}\}}"

    # one copy of the value and the members after it (DFA states are the cost)
    key = f"{literal(json.dumps(name))}{WS}:{WS}{value}"
    first = f"(?:{_string_not(name)}|{key}{WS},{WS}{_string_not(arguments)})"
    members = f"{first}{WS}:{WS}{value}(?:{WS},{WS}{STRING}{WS}:{WS}{value})*|{key}"
    return rf"\{{{WS}(?:{members})?{WS}\}}"


# ---- a JSON string that does not decode to a given key -----------------------------------

_HEX = "0123456789abcdef"


def _hex_class(digits: str) -> str:
    return "[" + "".join(sorted({c for d in digits for c in (d, d.upper())})) + "]"


def _spellings(ch: str) -> str:
    """The JSON spellings of `ch` in a string: itself, or its `\\u` escape (any hex case)."""
    code = f"{ord(ch):04x}"
    return f"(?:{literal(ch)}|\\\\u{''.join(_hex_class(d) for d in code)})"


def _not_spelling(ch: str) -> str:
    """One JSON string character (raw or escaped) that does not decode to `ch`."""
    code = f"{ord(ch):04x}"
    assert code.startswith("00") and (ch.isalnum() or ch == "_"), ch
    escapes = "|".join(
        "".join(_hex_class(d) for d in code[:i]) + _hex_class(_HEX.replace(code[i], "")) + "[0-9a-fA-F]" * (3 - i)
        for i in range(1, 4)
    )
    unicode = rf"u(?:[1-9a-cA-Ce-fE-F][0-9a-fA-F]{{3}}|[dD][0-7][0-9a-fA-F]{{2}}|{escapes})"
    return rf'(?:[^"\\\x00-\x1F{ch}]|\\(?:["\\/bfnrt]|{unicode}))'


def _string_not(word: str) -> str:
    """A JSON string (what json_schema's STRING matches) that does not decode to `word`."""

    def rest(k: int) -> str:
        if k == len(word):
            return f"{STRING_CHAR}+"
        return f"(?:{_not_spelling(word[k])}{STRING_CHAR}*|{_spellings(word[k])}{rest(k + 1)})?"

    assert STRING == f'"{STRING_CHAR}*"'
    return f'"{rest(0)}"'
