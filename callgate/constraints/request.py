"""What a grammar is built from: the request's tools, choice and flags, normalised.

Knows: OpenAI `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` shapes,
what a tool's `strict: true` does to its parameters (callgate.strict_tools, the rule the
validator applies too), and the canonical cache key of a request's grammar. Does not know:
formats or regexes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from callgate.errors import InvalidRequestError
from callgate.strict_tools import strict_schema

Mode = Literal["none", "auto", "required", "named", "response_format"]
# What the prompt did with the format's reasoning block: True opened it (the output starts
# inside it and must close it); False closed an (empty) one (Qwen3's enable_thinking=False:
# the output may open none); None neither (no switch: where the family reads one, the model
# may open a block itself at the start of its output, as Qwen3 does unasked).
Thinking = bool | None
# 2: JSON-call arguments admit only objects (`parameters: {}` allowed any value)
# 3: an array schema with `minItems` above `maxItems: 0` admits no array (it admitted `[]`)
# 4: `thinking` is three-valued; false (the prompt closed a reasoning block) admits no
#    leading block, where it meant "no switch" (a leading block allowed) before
# 5: numbers are bounded below 1e308 (integer part <= 20 digits, exponent bounded); a
#    `type` beside enum/const/anyOf/oneOf/allOf narrows it; $ref chains are followed
# 6: qwen3-xml writes a value its parser reads by type: branches in order, text after `string`
# 7: qwen3-xml types an untyped `const`/`enum` by its values (`enum: [1, "a"]` writes `1` too)
# 8: llama3-json answers beside tools under auto never start as a call (json_answer.py)
# 9: json-family content keeps a numbered run of reserved tokens out by its prefix (`<SPECIAL_`)
GRAMMAR_VERSION = 9
_NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A callable tool as the grammar sees it. `parameters` is the schema the arguments
    must satisfy: for a `strict: true` tool, the declared one closed by `strict_schema`
    (its `unevaluatedProperties: false` are part of the cache key, so a strict tool never
    shares a grammar with the same tool declared non-strict)."""

    name: str
    parameters: Mapping[str, Any]
    index: int = field(default=0, compare=False)  # its place in the request's `tools`, for errors


@dataclass(frozen=True, slots=True)
class GrammarRequest:
    """A normalised request. `tools` holds only the callable tools (the named one for
    `named`); `response_schema` is the JSON schema of the content (json_object: `{"type":
    "object"}`), None for free text. `thinking` is what the prompt did with the format's
    reasoning block (a `Thinking`)."""

    format: str
    mode: Mode
    tools: tuple[ToolSpec, ...]
    parallel: bool
    response_schema: Mapping[str, Any] | None
    thinking: Thinking

    def key(self) -> str:
        """Canonical cache key: equal requests (as far as the grammar can tell) share it.

        Property order matters to the grammar, so schemas are serialised in their order.
        """
        doc = {
            "v": GRAMMAR_VERSION,
            "format": self.format,
            "mode": self.mode,
            "tools": [[t.name, t.parameters] for t in self.tools],
            "parallel": self.parallel,
            "response": self.response_schema,
            "thinking": self.thinking,
        }
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)
        return f"{self.format}:{self.mode}:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def tool_specs(tools: Sequence[Mapping[str, Any]] | None) -> tuple[ToolSpec, ...]:
    """Name and parameter schema of each OpenAI tool (`{"type": "function", "function":
    {...}}` or the bare function object); a `strict` tool's schema is closed as the
    validator closes it (`strict_schema`)."""
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools or ()):
        fn = tool.get("function", tool)
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"tools[{i}] has no function name", param=f"tools[{i}]")
        params = fn.get("parameters")
        schema = params if isinstance(params, Mapping) else _NO_PARAMETERS
        specs.append(ToolSpec(name, _closed(schema or _NO_PARAMETERS) if fn.get("strict") else schema, i))
    return tuple(specs)


def _closed(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """A strict tool's parameters as the validator checks them (it reads `parameters: {}`
    as an object without properties, which closed admits only `{}`)."""
    closed = strict_schema(params)
    assert isinstance(closed, Mapping)
    return closed


def _choice(tool_choice: Any) -> tuple[str, str | None]:
    """("none"|"auto"|"required"|"named", name)."""
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice in ("none", "auto", "required"):
            return tool_choice, None
        raise InvalidRequestError(f"tool_choice {tool_choice!r} is not none, auto, required or a function")
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if isinstance(name, str):
            return "named", name
    raise InvalidRequestError("tool_choice must name a function as {'type': 'function', 'function': {'name': ...}}")


def _response_schema(response_format: Any) -> Mapping[str, Any] | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return schema if isinstance(schema, Mapping) else {}
    raise InvalidRequestError(f"response_format type {kind!r} is not text, json_object or json_schema")


def grammar_request(
    format: str,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    response_format: Any,
    *,
    thinking: Thinking = None,
) -> GrammarRequest | None:
    """Normalise; None when nothing constrains the output (free text, no tools).

    Raises InvalidRequestError for a tool_choice naming no declared tool, `required`
    without tools, or malformed shapes.
    """
    specs = tool_specs(tools)
    choice, name = _choice(tool_choice)
    response = _response_schema(response_format)
    parallel = parallel_tool_calls is not False
    if choice == "named":
        specs = tuple(t for t in specs if t.name == name)
        if not specs:
            raise InvalidRequestError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return GrammarRequest(format, "named", specs[:1], False, None, thinking)
    if choice == "required":
        if not specs:
            raise InvalidRequestError("tool_choice 'required' needs at least one tool", param="tool_choice")
        return GrammarRequest(format, "required", specs, parallel, None, thinking)
    if choice == "auto" and specs:
        return GrammarRequest(format, "auto", specs, parallel, response, thinking)
    # No call can be written below: `parallel` is set, so that the key does not split on it.
    if response is not None:
        return GrammarRequest(format, "response_format", (), True, response, thinking)
    if choice == "none" and specs:
        return GrammarRequest(format, "none", (), True, None, thinking)
    return None
