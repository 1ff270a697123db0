"""Strict JSON: the one rule by which every template and parser reads JSON. Pure Python.

The rule is RFC 8259 JSON narrowed to what travels unchanged through a prompt, a parser and
an HTTP response (much as I-JSON, RFC 7493, narrows it):

* one JSON value, with JSON whitespace (space, tab, LF, CR) around it and nothing else;
* no `NaN`, `Infinity` or `-Infinity` (they are not JSON), and no number that would read
  as one: a number with a fraction or exponent is a double and must stay finite (`1e999`
  is refused, `1e-999` reads as 0.0);
* an integer (no fraction, no exponent) is read exactly, of any size up to
  `MAX_INTEGER_DIGITS` digits (Python's own int-parsing limit), so `2**64 + 1` keeps its
  value and `json.dumps` writes it back the same;
* an object repeats no key;
* strings decode to Unicode scalar values: a `\\uD800`-`\\uDBFF` escape must be followed by
  a `\\uDC00`-`\\uDFFF` escape (the pair reads as one character), a low half never stands
  alone, and no raw surrogate code point appears (UTF-8 cannot carry one: neither the
  tokenizer nor the response body could);
* arrays and objects nest at most `MAX_DEPTH` deep (Python's reader and writer recurse, so
  without a fixed bound the verdict would depend on how deep the caller's stack is).

Two readers hold the rule. `loads` reads a whole text: the templates read the `arguments`
of history tool calls with it (callgate/templates/tool_arguments.py, TemplateError 400
naming the field), the parsers read complete values with it (DSML `string="false"`
parameters, qwen3-xml object and array parameters, calls found outside the markup), and
the wire checks the arguments of a request's history with it. The parsers'
incremental scanner (callgate/parsers/json_scan.py) reads streamed model output by the
same rule and takes its number and depth bounds from here; tests/test_strict_json.py and
tests/test_json_calls_scan.py check that the two give the same verdict on every text.

Errors: `loads` raises `StrictJsonError` (a ValueError) with a code (`invalid_json` or
`duplicate_key`), what was expected, what was found and the offset where known.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

MAX_DEPTH = 128
MAX_INTEGER_DIGITS = 4300  # sys.int_info.default_max_str_digits

ErrorCode = Literal["invalid_json", "duplicate_key"]

_RAW_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Every backslash starts an escape; reading them in order keeps `\\\\ud800` (an escaped
# backslash, then text) apart from `\\ud800`. Group 1: a surrogate escape not in a pair.
_ESCAPES = re.compile(
    r"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(u[dD][89a-fA-F][0-9a-fA-F]{2})|[\s\S])"
)
_NESTING_TOKENS = re.compile(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*"?|[\[{]|[\]}]')


class StrictJsonError(ValueError):
    """A text that breaks the rule. `offset` is None where the reader cannot place it."""

    def __init__(self, code: ErrorCode, expected: str, got: str, offset: int | None) -> None:
        self.code: ErrorCode = code
        self.expected = expected
        self.got = got
        self.offset = offset
        where = "" if offset is None else f" at offset {offset}"
        super().__init__(f"expected {expected}, got {got}{where}")


def number_value(token: str) -> int | float | None:
    """The value of a JSON number token (already matched as JSON number syntax); None when
    the rule refuses it: an integer over MAX_INTEGER_DIGITS digits, a double past its range."""
    if "." in token or "e" in token or "E" in token:
        value = float(token)
        return None if value in (_INF, -_INF) else value
    if len(token) - token.startswith("-") > MAX_INTEGER_DIGITS:
        return None
    try:
        return int(token)
    except ValueError:  # the interpreter's limit was lowered below ours
        return None


def loads(text: str) -> Any:
    """The value of `text` by the rule; StrictJsonError where it breaks it."""
    _check_surrogates(text)
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _check_depth(text)
    try:
        return json.loads(
            text, object_pairs_hook=_unique, parse_constant=_constant, parse_float=_number, parse_int=_number
        )
    except json.JSONDecodeError as err:
        raise _syntax_error(text, err) from None


_INF = float("inf")


def _syntax_error(text: str, err: json.JSONDecodeError) -> StrictJsonError:
    got = repr(text[err.pos : err.pos + 12]) if err.pos < len(text) else "end of text"
    if err.msg.startswith("Expecting "):  # "Expecting value", "Expecting ',' delimiter", ...
        expected = err.msg.removeprefix("Expecting ")
        return StrictJsonError("invalid_json", "a JSON value" if expected == "value" else expected, got, err.pos)
    if err.msg == "Extra data":
        return StrictJsonError("invalid_json", "the end of the text", got, err.pos)
    return StrictJsonError("invalid_json", "valid JSON", f"{err.msg.lower()} {got}", err.pos)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            shown = json.dumps(key, ensure_ascii=False)
            raise StrictJsonError("duplicate_key", "a key not used before in this object", shown, None)
        seen.add(key)
    raise AssertionError("unreachable: dict() dropped a pair without a repeated key")


def _constant(name: str) -> Any:
    raise StrictJsonError("invalid_json", "a JSON value", name, None)


def _number(token: str) -> int | float:
    value = number_value(token)
    if value is None:
        shown = token if len(token) <= 24 else f"{token[:12]}...({len(token)} characters)"
        raise StrictJsonError("invalid_json", "a number in range", shown, None)
    return value


def _check_surrogates(text: str) -> None:
    raw = _RAW_SURROGATE.search(text)
    if raw is not None:
        raise StrictJsonError("invalid_json", "a Unicode scalar value", f"U+{ord(raw[0]):04X}", raw.start())
    if _SURROGATE_ESCAPE.search(text) is None:
        return
    for m in _ESCAPES.finditer(text):
        if m[1] is not None:
            raise StrictJsonError("invalid_json", "a surrogate pair (high then low escape)", "\\" + m[1], m.start())


def _check_depth(text: str) -> None:
    depth = 0
    for m in _NESTING_TOKENS.finditer(text):
        token = m[0]
        if token == "[" or token == "{":
            depth += 1
            if depth > MAX_DEPTH:
                raise StrictJsonError(
                    "invalid_json", f"at most {MAX_DEPTH} nested arrays and objects", token, m.start()
                )
        elif token == "]" or token == "}":
            depth -= 1
