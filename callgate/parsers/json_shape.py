"""The shape of a decoded JSON call block: which values are calls and which are malformed.

Knows: a call object has exactly a non-empty string name and an object of arguments (plus,
in the list layout, an optional native id of a fixed pattern); a list block is a non-empty
array of such objects. Does not know: markers, offsets, streaming, or tools.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from callgate.parsers.json_spec import JsonFamilySpec


@dataclass(frozen=True, slots=True)
class CallShape:
    name: str
    arguments: dict[str, Any]
    call_id: str | None  # native id where the format has one and the model wrote it


@dataclass(frozen=True, slots=True)
class ShapeError:
    code: str
    expected: str
    got: str
    element: int  # index in a list block; 0 for an object block


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def check_call_object(spec: JsonFamilySpec, value: Any, element: int = 0) -> CallShape | ShapeError:
    """One call object: {name_key: non-empty string, arguments_key: object[, id_key: id]}."""
    if not isinstance(value, dict):
        return ShapeError("bad_call_object", "a call object", _describe(value), element)
    required = {spec.name_key, spec.arguments_key}
    allowed = required | ({spec.id_key} if spec.id_key else set())
    keys = set(value)
    if not required <= keys or not keys <= allowed:
        expected = "keys " + ", ".join(sorted(required)) + (f" (and optionally {spec.id_key})" if spec.id_key else "")
        return ShapeError("bad_call_object", expected, "keys " + ", ".join(value), element)
    name = value[spec.name_key]
    if not isinstance(name, str) or not name:
        return ShapeError("bad_call_object", f"{spec.name_key!r} as a non-empty string", _describe(name), element)
    arguments = value[spec.arguments_key]
    if not isinstance(arguments, dict):
        return ShapeError("arguments_not_object", f"{spec.arguments_key!r} as an object", _describe(arguments), element)
    call_id = value.get(spec.id_key) if spec.id_key else None
    if call_id is not None and not _valid_id(spec.id_pattern, call_id):
        pattern = spec.id_pattern.pattern if spec.id_pattern else "a string"
        return ShapeError("bad_call_id", f"an id matching {pattern}", _describe(call_id), element)
    return CallShape(name, arguments, call_id)


def _valid_id(pattern: re.Pattern[str] | None, call_id: Any) -> bool:
    if not isinstance(call_id, str):
        return False
    return pattern is None or pattern.fullmatch(call_id) is not None


def check_call_list(spec: JsonFamilySpec, value: Any) -> list[CallShape] | ShapeError:
    """A list block: a non-empty array of call objects; the first bad element decides."""
    if not isinstance(value, list):
        return ShapeError("calls_not_array", "a JSON array of calls", _describe(value), 0)
    if not value:
        return ShapeError("empty_call_list", "at least one call", "[]", 0)
    calls: list[CallShape] = []
    for i, item in enumerate(value):
        shape = check_call_object(spec, item, i)
        if isinstance(shape, ShapeError):
            return shape
        calls.append(shape)
    return calls
