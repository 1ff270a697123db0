"""A tool call written outside the format's call markup: found in a finished answer.

Knows: the JSON shapes in which models write a call as plain text when they should have
used the native markup (hermes' `<tool_call>`, mistral's `[TOOL_CALLS]`, ...):

    {"name": N, "arguments": {...}}              hermes' / mistral's call body
    {"name": N, "parameters": {...}}             llama3-json's call body
    {"function": {"name": N, "arguments": ...}}  OpenAI's tool_call object (arguments may be its JSON string)
    {"function": N, "arguments": {...}}          (or "parameters")
    [<one of the above>]                         mistral's call list, one call, without [TOOL_CALLS]

("id" and "type": "function" may be present too; any other key means it is not a call). The
XML and DSML families' own call bodies cannot reach the content: their parsers read a
`<function=` or DSML tag outside a block as a malformed block (a diagnostic of its own), and
the `auto` grammar keeps those tags out of free text.

Does not know: tool_choice, response_format, engines or what is done about it (the chat
service decides whether to ask for the call again, serving/recovery.py).

    find_call_outside_markup(format, output, result, tools, *, truncated=False) -> OutsideCall | None

A call is found only when the answer is *nothing but* it: the whole content (whitespace
aside) is one such JSON value, or one fenced block (```json ... ```) holding one, naming a
declared tool; and the output holds no candidate. Text around the JSON, two values, a
second fence, an undeclared name, an arguments value that is not an object: no call.
JSON is read strictly (parsers/json_scan.py: no single quotes, trailing commas, NaN,
duplicate keys). `truncated`: the output was cut by max_tokens, so the fence may be
unclosed and the JSON may stop early, once its name is complete and its arguments object
has begun. Pure: never raises on any input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from callgate import strict_json
from callgate.formats import MistralMarkers, get_format
from callgate.parsers.base import Tools, tool_names
from callgate.parsers.json_scan import JsonScanner
from callgate.types import Diagnostic, ParseResult

CODE = "call_outside_markup"

_ARGUMENT_KEYS = ("arguments", "parameters")
_OPTIONAL_KEYS = frozenset({"id", "type"})
# an opening fence line: ``` plus an optional info string (json, JSON, jsonc, javascript, ...)
_FENCE_OPEN = re.compile(r"```[A-Za-z0-9_+.-]*[ \t]*\r?\n")
_FENCE_CLOSE = re.compile(r"\r?\n[ \t]*```\Z")


@dataclass(frozen=True, slots=True)
class OutsideCall:
    """The declared tool the answer calls, and the diagnostic (code `call_outside_markup`)
    whose span is the call's JSON text in the output."""

    name: str
    diagnostic: Diagnostic


def find_call_outside_markup(
    format: str, output: str, result: ParseResult, tools: Tools, *, truncated: bool = False
) -> OutsideCall | None:
    """The call that `result`'s content (parsed from `output`) is, if it is wholly one; None
    otherwise. See the module docstring."""
    declared = tool_names(tools) or frozenset()
    content = result.content
    if not declared or result.candidates or not content:
        return None
    body = _body(content.strip(), truncated)
    if body is None:
        return None
    name = _call_name(body, format, truncated)
    if name is None or name not in declared:
        return None
    start = output.rfind(body)
    span = (start, start + len(body)) if start >= 0 else (0, len(output))
    fmt = get_format(format)
    message = (
        f"expected a call to {name!r} in the {fmt.name} call markup ({fmt.call_trigger.strip()!r}), "
        f"got it written as JSON in the content at offset {span[0]}"
    )
    return OutsideCall(name, Diagnostic(CODE, message, span))


def _body(text: str, truncated: bool) -> str | None:
    """The JSON text of an answer that is one fenced block or bare JSON; None for anything
    else (a second fence, text outside the fence)."""
    if not text.startswith("```"):
        return text if text[:1] in ("{", "[") else None
    opened = _FENCE_OPEN.match(text)
    if opened is None:
        return None
    inner = text[opened.end() :]
    closed = _FENCE_CLOSE.search(inner)
    if closed is not None:
        inner = inner[: closed.start()]
    elif not truncated:
        return None
    inner = inner.strip()
    return inner if "```" not in inner else None


def _call_name(body: str, format: str, truncated: bool) -> str | None:
    scanner = JsonScanner()
    end = scanner.feed(body)
    if scanner.failed:
        return None
    if not scanner.done:
        return _prefix_name(body) if truncated else None
    if body[end:].strip():
        return None
    value = json.loads(body[:end])  # the scanner read it by strict_json's rule, depth included
    if isinstance(value, list):
        listed = isinstance(get_format(format).markers, MistralMarkers)  # the "list" call layout
        return _object_name(value[0]) if listed and len(value) == 1 else None
    return _object_name(value)


def _object_name(value: Any) -> str | None:
    """The tool a call object names, when it is one of the shapes; None otherwise."""
    if not isinstance(value, dict) or not _optional_keys_ok(value):
        return None
    fn = value.get("function")
    if isinstance(fn, dict):  # OpenAI's {"type": "function", "function": {...}}
        inner = {k: v for k, v in value.items() if k not in _OPTIONAL_KEYS}
        return _named(fn, "name") if set(inner) == {"function"} and "id" not in fn and "type" not in fn else None
    if "function" in value:
        return _named(value, "function")
    return _named(value, "name")


def _named(obj: Mapping[str, Any], name_key: str) -> str | None:
    keys = set(obj) - _OPTIONAL_KEYS
    args_keys = [k for k in _ARGUMENT_KEYS if k in keys]
    if len(args_keys) != 1 or keys != {name_key, args_keys[0]}:
        return None
    name, arguments = obj[name_key], obj[args_keys[0]]
    if not isinstance(name, str) or not name or not _is_object(arguments):
        return None
    return name


def _is_object(arguments: Any) -> bool:
    """An arguments object, or (OpenAI's wire form) a JSON string of one."""
    if isinstance(arguments, dict):
        return True
    if not isinstance(arguments, str):
        return False
    try:
        return isinstance(strict_json.loads(arguments), dict)
    except strict_json.StrictJsonError:
        return False


def _optional_keys_ok(value: Mapping[str, Any]) -> bool:
    return value.get("type", "function") == "function" and isinstance(value.get("id", ""), str)


def _prefix_name(body: str) -> str | None:
    """A cut-off call object: `{"name": N, "arguments": {` and more, strict so far."""
    for key in _ARGUMENT_KEYS:
        scanner = JsonScanner(name_key="name", capture_key=key)
        scanner.feed(body)
        if scanner.failed or scanner.top_is_array or not scanner.captured:
            continue
        if set(scanner.top_keys) <= {"name", key, *_OPTIONAL_KEYS}:
            return scanner.name
    return None
