"""The exact JSON shapes callgate answers with: `chat.completion`, `chat.completion.chunk`,
usage, tool calls, the `callgate` block's candidates, diagnostics and raw output (of a round
that failed), and the model list.

Knows: OpenAI's response shapes and callgate's types. Does not know: requests, HTTP,
templates, engines, parsers or validators.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from callgate.types import Diagnostic, ParseResult, ToolCallCandidate

# A failed round's output in an error body: whole up to this many characters (SmolLM2 or
# Qwen tokens average ~4, so about 16k tokens), else this many around the failure.
RAW_TEXT_MAX_CHARS = 65536


def tool_call_dict(call_id: str, name: str, arguments_json: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json}}


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def candidate_dict(c: ToolCallCandidate) -> dict[str, Any]:
    return {
        "call_id": c.call_id,
        "name": c.name,
        "arguments": c.arguments,
        "raw": c.raw,
        "span": list(c.span),
        "format": c.format,
        "truncated": c.truncated,
    }


def diagnostic_dict(d: Diagnostic) -> dict[str, Any]:
    return {"code": d.code, "message": d.message, "span": list(d.span)}


def raw_output_dict(round_index: int, text: str, result: ParseResult, focus: int) -> dict[str, Any]:
    """The `raw` object of an error's `callgate` block: the round's model output as the parser
    read it (diagnostic spans are offsets into it) and what was read from it. `text` is the
    whole output when it has at most RAW_TEXT_MAX_CHARS characters, else the window of that
    many centred on offset `focus` (the failure): `text_start` is the offset of its first
    character, `text_chars` the length of the whole output."""
    start = min(max(0, focus - RAW_TEXT_MAX_CHARS // 2), max(0, len(text) - RAW_TEXT_MAX_CHARS))
    return {
        "round": round_index,
        "text": text[start : start + RAW_TEXT_MAX_CHARS],
        "text_start": start,
        "text_chars": len(text),
        "content": result.content,
        "reasoning": result.reasoning,
        "calls": [c.raw for c in result.candidates],
    }


def completion_dict(
    *,
    completion_id: str,
    created: int,
    model: str,
    message: Mapping[str, Any],
    finish_reason: str,
    usage: Mapping[str, Any],
    callgate: Mapping[str, Any],
) -> dict[str, Any]:
    """A non-streaming `chat.completion` object."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": dict(message), "logprobs": None, "finish_reason": finish_reason}],
        "usage": dict(usage),
        "callgate": dict(callgate),
    }


def chunk_dict(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: Mapping[str, Any] | None,
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    callgate: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `chat.completion.chunk`; delta None gives the usage-only chunk (empty choices)."""
    choices = (
        [] if delta is None else [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}]
    )
    out: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = dict(usage)
    if callgate is not None:
        out["callgate"] = dict(callgate)
    return out


def models_dict(model: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "callgate", "max_model_len": max_model_len}
        ],
    }


def tool_names(tools: Sequence[Mapping[str, Any]] | None) -> frozenset[str]:
    return frozenset(t["function"]["name"] for t in tools or ())
