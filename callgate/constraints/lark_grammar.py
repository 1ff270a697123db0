"""A normalised request -> the llguidance (Lark) grammar of everything the model may write.

Knows: how the tool_choice modes compose a format family's pieces (content, reasoning,
calls); families are modules with the interface documented in lark_json.py. Does not know:
vocabularies (beyond the texts of their special tokens) or compilation (llg.py).

The grammar covers the text before the end-of-turn token: llguidance allows the model's EOS
only where the grammar can end, and the parser is handed the text plus the format's EOS.

[reasoning] is the rest of the block when the prompt opened one (`thinking` True); nothing
when the prompt closed one or the served model has none (False); else (None) an optional
block the model may open itself where the family reads one (hermes).

* none             -- [reasoning] content
* auto             -- [reasoning] (content | content-up-to-trigger calls): free text ends at
                      the first call trigger (a lazy rule), after which the call grammar holds
                      (llama3-json: content | call, content never starting like a call)
* auto + response_format -- [reasoning] (answer | calls)
* required         -- [reasoning] calls (one or more; exactly one when not parallel)
* named            -- [reasoning] exactly one call to that tool
* response_format  -- [reasoning] JSON of the response schema
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from callgate.constraints import lark_dsml, lark_json, lark_qwen3_xml
from callgate.constraints.lark_schema import prepare
from callgate.constraints.lark_text import Builder
from callgate.constraints.request import GrammarRequest
from callgate.formats import ToolCallFormat, get_format

FAMILIES: dict[str, ModuleType] = {"json": lark_json, "qwen3-xml": lark_qwen3_xml, "dsml": lark_dsml}


def family(fmt: ToolCallFormat) -> ModuleType:
    return FAMILIES[fmt.family]


def lark_grammar(req: GrammarRequest, specials: Mapping[str, int] | None = None) -> str:
    """The grammar text. `specials`: the vocabulary's special tokens, text -> id. Raises
    SchemaTooComplexError naming every schema keyword the grammar cannot enforce."""
    fmt = get_format(req.format)
    fam = family(fmt)
    b = Builder(specials=dict(specials or {}))
    prefix = _reasoning(fmt, fam, req, b)
    return b.render(f"{prefix} {_body(fmt, fam, req, b)}".strip())


def _reasoning(fmt: ToolCallFormat, fam: ModuleType, req: GrammarRequest, b: Builder) -> str:
    if fmt.reasoning_open is None or fmt.reasoning_close is None:
        return ""
    if req.thinking is True:
        return str(fam.reasoning(fmt, b))
    if req.thinking is None and fam.leading_reasoning(fmt):
        return f"({b.marker(fmt.reasoning_open)} {fam.reasoning(fmt, b)})?"
    return ""


def _body(fmt: ToolCallFormat, fam: ModuleType, req: GrammarRequest, b: Builder) -> str:
    if req.mode == "response_format":
        assert req.response_schema is not None
        return b.json(prepare(req.response_schema, "response_format"))
    if req.mode == "none":
        return str(fam.content(fmt, b))
    calls = fam.calls(fmt, req.tools, parallel=req.parallel, b=b)
    whole = f"{b.marker(calls.trigger)} {calls.rest}" if calls.trigger else calls.rest
    if req.mode in ("required", "named"):
        return str(whole)
    if req.response_schema is not None:
        return f"({b.json(prepare(req.response_schema, 'response_format'))} | {whole})"
    content = fam.content(fmt, b)
    if not calls.trigger or not fam.lazy_ok(fmt):
        return f"({content} | {whole})"
    head = b.text_until("content_head", fam.content_markers(fmt), calls.trigger)
    return f"({content} | {head} {calls.rest})"
