"""A normalised request -> the regex of everything the model may write.

Knows: how the tool_choice modes compose a format family's pieces (content, reasoning,
calls) and when `auto` can be lazy. Does not know: vocabularies or compilation.

The regex covers the text before the end-of-turn token: the model's EOS token is allowed
only where the regex can end, and the parser is handed the text plus the format's EOS.

[reasoning] is the rest of the block when the prompt opened one (`thinking` True); nothing
when the prompt closed one (False: the switch is off, no block may be opened); else (None,
no switch) an optional block the model may open itself where the format reads one (hermes).

Modes:
* none             -- [reasoning] content; the call syntax cannot be produced.
* auto (lazy)      -- `trigger` set; `regex` is the call block from the trigger on. Text
                      before the trigger is outside the regex; once the trigger appears, the
                      rest must be a complete block. Used where content may precede calls
                      and the prompt opened no reasoning block (otherwise a trigger inside
                      reasoning would force a call there). The processor holds the text
                      before the trigger to `free_text`: the markers eager content excludes,
                      and a leading reasoning block as eager auto spells it (the trigger is
                      one of the markers it may not hold).
* auto (eager)     -- [reasoning] content [calls]  (llama3-json: content | call).
* auto + response_format -- [reasoning] (answer | calls): the answer is JSON of the response
                      schema that the parser cannot read as a call (json_answer.py).
* required         -- [reasoning] calls (one or more; exactly one when not parallel).
* named            -- [reasoning] exactly one call to that tool.
* response_format  -- [reasoning] JSON of the response schema.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

from callgate.constraints.request import GrammarRequest
from callgate.formats import FORMATS, ToolCallFormat, get_format

from . import dsml, json_calls, qwen3_xml
from .free_text import FreeText
from .json_answer import answer_regex
from .json_schema import Context, schema_regex

_FAMILIES: dict[str, ModuleType] = {"dsml": dsml, "qwen3-xml": qwen3_xml, "json": json_calls}


@dataclass(frozen=True, slots=True)
class Grammar:
    regex: str
    trigger: str | None  # set: lazy, `regex` starts with the trigger text


def family(fmt: ToolCallFormat) -> ModuleType:
    return _FAMILIES[fmt.family]


def grammar(req: GrammarRequest) -> Grammar:
    """Raises SchemaTooComplexError naming what a regex cannot enforce.

    The regex ends with `$` (end of text). outlines-core 0.2.14 builds its Index from a
    regex-automata DFA whose match states are delayed by one byte, and drops a token whose
    next-to-last byte ends a match while the whole token does not: over single-byte tokens
    `a(?:xb)*` then refuses "axb" (the "x" after the accepting "a"), which here would forbid
    a second parallel call or a call after content. With `$` no state before the end of
    text is a match state, and every continuation is kept (tests/test_constraints.py).
    outlines-core refuses an end-anchored regex that matches the empty text ("anchored
    universal start state doesn't exist"), so content is at least one character wherever
    it can stand alone.
    """
    g = _grammar(req)
    return Grammar(f"(?:{g.regex})$", g.trigger)


def _grammar(req: GrammarRequest) -> Grammar:
    fmt = get_format(req.format)
    fam = family(fmt)
    thinking = req.thinking is True and fmt.reasoning_close is not None
    leading = getattr(fam, "leading_reasoning", lambda f: "")(fmt) if req.thinking is None else ""
    prefix = fam.reasoning(fmt) if thinking else leading
    if req.mode == "response_format":
        assert req.response_schema is not None
        schema = req.response_schema
        return Grammar(prefix + schema_regex(schema, Context(root=schema), "response_format"), None)
    if req.mode == "none":
        return Grammar(prefix + fam.content(fmt), None)
    calls: str = fam.calls(fmt, req.tools, parallel=req.parallel)
    if req.mode in ("required", "named"):
        return Grammar(prefix + calls, None)
    return _auto(fmt, fam, req, prefix, calls)


def _auto(fmt: ToolCallFormat, fam: ModuleType, req: GrammarRequest, prefix: str, calls: str) -> Grammar:
    mixes = getattr(fam, "lazy_ok", lambda f: True)(fmt)
    if req.response_schema is not None:  # the answer never reads as a call (json_answer.py)
        return Grammar(f"{prefix}(?:{answer_regex(fmt, req.response_schema)}|{calls})", None)
    if mixes and req.thinking is not True:
        return Grammar(calls, fmt.call_trigger)
    content: str = fam.content(fmt)
    if not mixes:
        return Grammar(f"{prefix}(?:{content}|{calls})", None)
    return Grammar(f"{prefix}(?:{content}(?:{calls})?|{calls})", None)


@functools.cache
def free_text(format: str, trigger: bytes, *, may_open: bool = True) -> FreeText:
    """The rules of a lazy row's text before `trigger` in `format`: content may not hold
    what the family's eager content grammar keeps out (`content_markers`); where the family
    reads a reasoning block the model opens itself, and `may_open` (the prompt closed no
    block: GrammarRequest.thinking None), the output may open one at its start, holding none
    of `reasoning_markers`. A format that is unknown or not lazy with this trigger gets the
    trigger alone (no other rule)."""
    fmt = FORMATS.get(format)
    if fmt is None or fmt.call_trigger.encode() != trigger or not getattr(family(fmt), "lazy_ok", lambda f: True)(fmt):
        return FreeText(trigger)
    fam = family(fmt)
    content = [m.encode() for m in fam.content_markers(fmt)]
    if not may_open or not getattr(fam, "leading_reasoning", lambda f: "")(fmt):
        return FreeText(trigger, content)
    assert fmt.reasoning_open is not None and fmt.reasoning_close is not None
    reasoning = [m.encode() for m in fam.reasoning_markers(fmt)]
    opening, closing = fmt.reasoning_open.encode(), fmt.reasoning_close.encode()
    return FreeText(trigger, content, opening=opening, closing=closing, reasoning=reasoning)
