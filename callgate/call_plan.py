"""The call plan: what a request lets the model call and answer, normalised once.

Every surface (chat completions, /v1/responses, /v1/messages) turns its own `tools`,
`tool_choice`, parallelism and response format into OpenAI-style values, checks them
(serving/surfaces/protocol_checks.py: schemas, limits, a named tool is declared) and builds one
`CallPlan` from them with `CallPlan.of`; the prompt, the grammar, the parser, the stop
handling, the recovery decision and the validator handoff all read the plan instead of
comparing `tool_choice` strings.

Knows: OpenAI's `tools` / `tool_choice` / `parallel_tool_calls` / `response_format` shapes
and what `strict: true` does to a tool's parameters (callgate.strict_tools, the rule the
validator applies too). Does not know: formats, grammars, HTTP or wire models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from callgate.errors import InvalidRequestError
from callgate.strict_tools import strict_schema

# none: no call may be written (tool_choice `none`, or no tools); auto: calls or an answer;
# required: at least one call; named: one call to that tool; response_format: no call may be
# written and the answer follows the response schema.
Mode = Literal["none", "auto", "required", "named", "response_format"]
# What the prompt did with the format's reasoning block: True opened it (the output starts
# inside it and must close it); False closed an (empty) one (Qwen3's enable_thinking=False:
# the output may open none); None neither (no switch: where the family reads one, the model
# may open a block itself at the start of its output, as Qwen3 does unasked).
Thinking = bool | None
_NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A callable tool as the grammar sees it. `parameters` is the schema the arguments
    must satisfy: for a `strict: true` tool, the declared one closed by `strict_schema`
    (its `unevaluatedProperties: false` are part of the grammar's cache key, so a strict
    tool never shares a grammar with the same tool declared non-strict)."""

    name: str
    parameters: Mapping[str, Any]
    index: int = field(default=0, compare=False)  # its place in the request's `tools`, for errors


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One request's calls, normalised.

    `tools`: the tools the model may call (named: that one; none and response_format: no
    tool). `shown`: the tools the prompt (and so the parser) knows of, as declared — every
    declared tool except under tool_choice `none`; None when none were declared. `declared`:
    whether the request declared any tool (under `none` the grammar still keeps the format's
    call markup out). `parallel`: the request's parallel_tool_calls. `response_schema`: the
    JSON schema of the answer (json_object: `{"type": "object"}`), None for free text and
    where no answer may be written (required, named). `thinking`: what the prompt did with
    the format's reasoning block, set when the request is fit to the served format
    (serving/conform.py); None until then."""

    mode: Mode
    tools: tuple[ToolSpec, ...]
    shown: tuple[Mapping[str, Any], ...] | None
    declared: bool
    parallel: bool
    response_schema: Mapping[str, Any] | None
    thinking: Thinking = None

    @classmethod
    def of(
        cls,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: Any,
        parallel_tool_calls: bool | None,
        response_format: Any,
        *,
        thinking: Thinking = None,
    ) -> CallPlan:
        """The plan of OpenAI-style values (`tools` as `{"type": "function", "function":
        {...}}` or bare function objects; tool_choice None meaning `auto`).

        Raises InvalidRequestError for shapes the surfaces' checks refuse first (a tool
        without a name, a tool_choice naming no declared tool, `required` without tools, an
        unknown tool_choice or response_format type), so that a caller handing raw values
        (tests, benchmarks) gets the same 400."""
        specs = tool_specs(tools)
        choice, name = _choice(tool_choice)
        response = _response_schema(response_format)
        parallel = parallel_tool_calls is not False
        shown = None if choice == "none" or tools is None else tuple(tools)
        declared = bool(specs)
        if choice == "named":
            named = tuple(t for t in specs if t.name == name)[:1]
            if not named:
                raise InvalidRequestError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
            return cls("named", named, shown, declared, parallel, None, thinking)
        if choice == "required":
            if not specs:
                raise InvalidRequestError("tool_choice 'required' needs at least one tool", param="tool_choice")
            return cls("required", specs, shown, declared, parallel, None, thinking)
        if choice == "auto" and specs:
            return cls("auto", specs, shown, declared, parallel, response, thinking)
        mode: Mode = "none" if response is None else "response_format"
        return cls(mode, (), shown, declared, parallel, response, thinking)

    @property
    def forced(self) -> bool:
        """Whether the model must call a tool (tool_choice `required` or named)."""
        return self.mode in ("required", "named")

    @property
    def named(self) -> str | None:
        """The one tool a named plan allows; None for the other modes."""
        return self.tools[0].name if self.mode == "named" else None

    @property
    def json_answer(self) -> bool:
        """Whether a JSON answer (the response schema) may stand beside calls: both may start
        with `{`, which the JSON-call parsers must tell apart (parsers' `json_answer`)."""
        return self.mode == "auto" and self.response_schema is not None

    def shown_tools(self) -> tuple[Mapping[str, Any], ...]:
        """The tools the parser is told of: `()` when the prompt shows none ("no tools" is
        not "tools unknown", which would let llama3-json read a JSON answer as a call)."""
        return self.shown or ()

    def naming(self, tool: str) -> CallPlan:
        """This plan held to one call of declared tool `tool` (a recovery round's plan: the
        prompt still shows every tool). Raises InvalidRequestError for an undeclared tool."""
        spec = next((t for t in tool_specs(self.shown) if t.name == tool), None)
        if spec is None:
            raise InvalidRequestError(f"tool_choice names {tool!r}, which is not in tools", param="tool_choice")
        return dataclasses.replace(self, mode="named", tools=(spec,), response_schema=None)


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
