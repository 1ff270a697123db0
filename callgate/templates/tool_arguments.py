"""The `function.arguments` of a history tool call, read the same way by every format. Pure Python.

Knows: the accepted forms of an OpenAI tool call's `arguments` -- a JSON string (the wire
form), an object already decoded (the Python API), or absent (None: no arguments) -- and
the one strict rule they are read by (callgate/strict_json.py: no repeated key, no NaN or
Infinity, numbers in range, no lone surrogate, bounded nesting, nothing after the value).
An object is held to the same rule as the text it would be written as. The value must be
a JSON object; an empty string is not JSON (mistral-common reads it as {}, callgate refuses
it in every format, as the HTTP surfaces do).
Does not know: any prompt layout; what a format does with the object afterwards.

Raises TemplateError (HTTP 400) whose message and `param` name the field, e.g.
`messages[3].tool_calls[0].function.arguments: not valid JSON (expected ...)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from callgate.errors import TemplateError
from callgate.strict_json import StrictJsonError, loads

_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def decode_arguments(raw: object, where: str) -> dict[str, Any]:
    """The arguments object at `where` (the path of the `arguments` field itself)."""
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        try:
            raw = json.dumps(raw, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as err:
            raise TemplateError(f"{where}: not representable as JSON ({err})", param=where) from None
    if not isinstance(raw, str):
        raise TemplateError(f"{where}: expected a JSON string, got {type(raw).__name__}", param=where)
    try:
        value = loads(raw)
    except StrictJsonError as err:
        raise TemplateError(f"{where}: not valid JSON ({err})", param=where) from None
    if not isinstance(value, dict):
        kind = "null" if value is None else _KINDS.get(type(value), type(value).__name__)
        raise TemplateError(f"{where}: must be a JSON object, got {kind}", param=where)
    return value
