"""The JSON lexical grammar (RFC 8259) as regexes, as Python's `json.dumps` writes it and
`json.loads` reads it: strings, literals, any value nested a bounded depth, members in order.

Knows: JSON's spelling, with at most one space around `:` and `,`. Does not know: JSON
Schema (json_schema.py builds on these pieces) or formats.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from callgate.constraints.json_lexemes import INTEGER, NUMBER

from .text import alternation, literal

GENERIC_DEPTH = 1
WS = "[ ]?"
_HEX = "[0-9a-fA-F]"
# A \u escape of anything but a surrogate (lone surrogates decode to unencodable text).
_U_ESCAPE = r"u(?:[0-9a-cA-C]" + _HEX + "{3}|[dD][0-7]" + _HEX + "{2}|[e-fE-F]" + _HEX + "{3})"
STRING_CHAR = r'(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|' + _U_ESCAPE + "))"
STRING = f'"{STRING_CHAR}*"'
BOOLEAN = "(?:true|false)"
NULL = "null"


def generic_value(depth: int = GENERIC_DEPTH, *, closed: bool = False) -> str:
    """Any JSON value with containers nested at most `depth` deep (`closed`: an object
    value is `{}`, its nested values stay free)."""
    rx = typed_generic(depth, closed, None)
    assert rx is not None
    return rx


def typed_generic(depth: int, closed: bool, types: frozenset[str] | None) -> str | None:
    """`generic_value` of the given types only (None: all); None when there are none."""

    def wanted(kind: str) -> bool:
        return types is None or kind in types

    number = NUMBER if wanted("number") else INTEGER
    kinds = (("string", STRING), ("number", number), ("boolean", BOOLEAN), ("null", NULL))
    scalars = [rx for kind, rx in kinds if wanted(kind) or (kind == "number" and wanted("integer"))]
    scalar = alternation(scalars) if scalars else None
    if depth <= 0:
        return scalar
    inner = generic_value(depth - 1)
    member = f"{STRING}{WS}:{WS}{inner}"
    array = rf"\[{WS}(?:{inner}(?:{WS},{WS}{inner})*)?{WS}\]"
    obj = rf"\{{{WS}\}}" if closed else rf"\{{{WS}(?:{member}(?:{WS},{WS}{member})*)?{WS}\}}"
    alts = [] if scalar is None else [scalar]
    alts += [rx for rx, kind in ((array, "array"), (obj, "object")) if wanted(kind)]
    return alternation(alts) if alts else None


def const_regex(value: Any) -> str:
    """The JSON text `json.dumps` writes for `value`. Raises ValueError for a NaN or an
    infinity (a number outside a double's range in the request), which JSON cannot write."""
    return literal(json.dumps(value, ensure_ascii=False, allow_nan=False))


def ordered_members(members: Sequence[tuple[str, bool]], sep: str) -> str:
    """Members in the given order, each either required or optional, joined by `sep`.

    Linear in the members after the first one written; the choice of the first written
    member makes the whole regex quadratic in the number of leading optional members.
    """

    def after_first(i: int) -> str:
        return "".join(f"{sep}{m}" if req else f"(?:{sep}{m})?" for m, req in members[i:])

    def from_(i: int) -> str:
        if i == len(members):
            return ""
        member, req = members[i]
        first = member + after_first(i + 1)
        if req:
            return first
        rest = from_(i + 1)
        return alternation([first, rest]) if rest else f"(?:{first})?"

    return from_(0)
