"""Grammars of the JSON-call family: hermes, llama3-json, mistral.

Knows: how each JSON-call format frames a call (golden/{hermes,llama3-json,mistral}/
FORMAT.md), spelled with the markers of callgate.formats; arguments come from each tool's
parameter schema via json_schema, narrowed to objects (arguments are always one, also for
`parameters: {}`). Does not know: tool_choice (callers pick the tools and the number of
calls) or vocabularies.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from callgate.constraints.json_schema import WS, Context, const_regex, object_regex, tool_param
from callgate.constraints.request import ToolSpec
from callgate.constraints.text import alternation, collapse_numbered, literal, text_without
from callgate.formats import HermesMarkers, Llama3Markers, MistralMarkers, ToolCallFormat, call_id_pattern, json_markers


def _arguments(tool: ToolSpec) -> str:
    schema = tool.parameters
    return object_regex(schema, Context(root=schema), tool_param(tool.index))


def _key(name: str) -> str:
    return f"{const_regex(name)}{WS}:{WS}"


def _call_object(tool: ToolSpec, fmt: ToolCallFormat, extra: str = "") -> str:
    m = json_markers(fmt)
    name = f"{_key(m.name_key)}{const_regex(tool.name)}"
    arguments = f"{_key(m.arguments_key)}{_arguments(tool)}"
    return rf"\{{{WS}{name}{WS},{WS}{arguments}{extra}{WS}\}}"


def _control(fmt: ToolCallFormat) -> list[str]:
    """The control tokens, a numbered run of reserved ones (mistral `<SPECIAL_20..999>`,
    llama3 `<|reserved_special_token_0..247|>`) as its prefix: stricter than the parser,
    which reads each token, and a content grammar of one prefix instead of ~1000 literals
    (mistral's took 4-12 s to compile, past the request's time limit)."""
    return list(_collapsed(fmt.special_tokens))


@functools.cache
def _collapsed(tokens: tuple[str, ...]) -> tuple[str, ...]:
    # once per format, not per request: mistral's ~1000 tokens take ~0.5 ms
    return tuple(collapse_numbered(tokens))


def content_markers(fmt: ToolCallFormat) -> list[str]:
    """What content may not hold (also a lazy row's text before its trigger): control
    tokens, and in the single layout a call object."""
    m = json_markers(fmt)
    if isinstance(m, Llama3Markers):  # the "single" layout
        return [*_control(fmt), m.call_in_text]
    return _control(fmt)


def content(fmt: ToolCallFormat) -> str:
    """Free text the parser reads as content (at least one character): no control token,
    no call syntax."""
    if json_markers(fmt).call_layout == "single":
        # Output starting with <|python_tag|>, { or [ is a call; a call object later on
        # is text_before_call.
        return rf"[^{{\[<]{text_without(content_markers(fmt))}"
    return text_without(content_markers(fmt), nonempty=True)


def reasoning_markers(fmt: ToolCallFormat) -> list[str]:
    """What a reasoning block may not hold before its close: control tokens."""
    return _control(fmt)


def reasoning(fmt: ToolCallFormat) -> str:
    """The rest of a reasoning block the prompt opened, its close and the blank line after."""
    assert fmt.reasoning_close is not None
    return text_without(reasoning_markers(fmt)) + literal(fmt.reasoning_close) + "\n{0,2}"


def leading_reasoning(fmt: ToolCallFormat) -> str:
    """A reasoning block the model may open itself (Qwen3 writes `<think>\n\n</think>\n\n`
    even when not thinking); "" where the format has none."""
    if fmt.reasoning_open is None or fmt.reasoning_close is None:
        return ""
    return f"(?:{literal(fmt.reasoning_open)}{reasoning(fmt)})?"


def calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """One call (parallel=False) or one or more, starting with the format's call trigger."""
    layout = json_markers(fmt).call_layout
    if layout == "single":
        # The template writes no <|python_tag|> (the parser accepts one); one call only.
        return alternation(_call_object(t, fmt) for t in tools)
    if layout == "list":
        return _list_calls(fmt, tools, parallel)
    return _object_calls(fmt, tools, parallel)


def _object_calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], parallel: bool) -> str:
    m = fmt.markers_as(HermesMarkers)
    body = alternation(_call_object(t, fmt) for t in tools)
    block = literal(m.block_open + "\n") + body + literal("\n" + m.block_close)
    return f"{block}(?:{literal(m.call_separator)}{block})*" if parallel else block


def _list_calls(fmt: ToolCallFormat, tools: Sequence[ToolSpec], parallel: bool) -> str:
    m = fmt.markers_as(MistralMarkers)
    call_id = f'(?:{WS},{WS}{_key(m.id_key)}"{call_id_pattern(fmt)}")?'
    obj = alternation(_call_object(t, fmt, call_id) for t in tools)
    items = f"{obj}(?:{WS},{WS}{obj})*" if parallel else obj
    return literal(m.calls) + rf"\[{WS}{items}{WS}\]"


def lazy_ok(fmt: ToolCallFormat) -> bool:
    """Whether content may precede a call (so free text up to the trigger is fine)."""
    return bool(json_markers(fmt).call_layout != "single")
