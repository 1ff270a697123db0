"""The prompt of a turn: rendered by the templates, located untrusted content, counted and
bounded against the model's context.

Knows: how to render through `callgate.templates` (the tools the call plan shows: none
under tool_choice `none`), where user and tool contents sit in the rendered text (found
format-agnostically), and the context-length rules (400 `context_length_exceeded`). Does not know: engines beyond
their tokenizer, HTTP, parsing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate import templates
from callgate.errors import InvalidRequestError, TemplateError
from callgate.serving.engines.engine import Tokenizer
from callgate.serving.surfaces.protocol import ChatRequest

Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    ids: tuple[int, ...]  # its tokens, counted here and handed to the engine (tokenised once)
    max_tokens: int
    messages: int  # how many messages were rendered
    spans: Spans  # user and tool content: special-token text there stays text


def build_prompt(
    fmt: str,
    req: ChatRequest,
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    context_tokens: int,
    default_max_tokens: int,
) -> Prompt:
    """Render `messages` for `req`, count them and pick max_tokens; 400 when they cannot fit.

    A prompt too long to fit by its length alone is refused before it is tokenised (seconds
    for megabytes). Tokenising can still take a while: call this off the event loop."""
    tools = req.plan.shown

    def render(msgs: Sequence[Mapping[str, Any]]) -> str:
        return templates.render(fmt, msgs, tools, thinking=req.thinking, reasoning_effort=req.reasoning_effort)

    text = render(messages)
    at_least = tokenizer.min_tokens(text)
    if at_least >= context_tokens:
        raise InvalidRequestError(
            f"messages: the prompt is at least {at_least} tokens; the model's context is {context_tokens} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    spans = untrusted_spans(render, messages, text)
    ids = tuple(tokenizer.encode(text, spans))
    n = len(ids)
    if n >= context_tokens:
        raise InvalidRequestError(
            f"messages: the prompt is {n} tokens; the model's context is {context_tokens} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    if req.max_tokens is not None and n + req.max_tokens > context_tokens:
        raise InvalidRequestError(
            f"max_tokens: {req.max_tokens} + a {n}-token prompt exceed the model's context of {context_tokens} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    max_tokens = req.max_tokens or min(default_max_tokens, context_tokens - n)
    return Prompt(text, ids, max_tokens, len(messages), spans)


_UNTRUSTED_ROLES = frozenset({"user", "tool"})
_PLACEHOLDER = re.compile("\ue000(\\d+)\ue001")  # private-use marks: no template treats them specially


def untrusted_spans(
    render: Callable[[Sequence[Mapping[str, Any]]], str], messages: Sequence[Mapping[str, Any]], prompt: str
) -> tuple[tuple[int, int], ...]:
    """[start, end) spans of user and tool contents in `prompt`, found without format knowledge.

    The conversation is rendered again with each such content replaced by a placeholder; the
    text between placeholders is structure, which must appear in `prompt` in order. A content
    the template copied verbatim spans exactly its own length; one the template rewrote
    (neutralised control tokens) spans up to the next structure. Where the two renders cannot
    be aligned, no spans are returned (the templates' own neutralisation still applies).
    """
    contents = {
        i: m["content"] for i, m in enumerate(messages) if m.get("role") in _UNTRUSTED_ROLES and m.get("content")
    }
    if not contents:
        return ()
    masked = [{**m, "content": f"\ue000{i}\ue001"} if i in contents else m for i, m in enumerate(messages)]
    try:
        skeleton = render(masked)
    except TemplateError:  # the template wants something of the content itself: no spans
        return ()
    parts = _PLACEHOLDER.split(skeleton)  # structure, index, structure, index, ..., structure
    if not prompt.startswith(parts[0]):
        return ()
    spans: list[tuple[int, int]] = []
    pos = len(parts[0])
    for k in range(1, len(parts), 2):
        content, after, last = contents.get(int(parts[k]), ""), parts[k + 1], k + 2 >= len(parts)
        end = _content_end(prompt, pos, content, after, last)
        if end < pos:
            return ()
        spans.append((pos, end))
        pos = end + len(after)
    return tuple(spans) if pos == len(prompt) else ()


def _content_end(prompt: str, pos: int, content: str, after: str, last: bool) -> int:
    """Where the content starting at `pos` ends: verbatim, or up to the structure after it
    (which a neutralised content cannot contain); -1 when neither fits."""
    if prompt.startswith(content + after, pos) and (not last or pos + len(content + after) == len(prompt)):
        return pos + len(content)
    if last:
        return len(prompt) - len(after) if prompt.endswith(after) else -1
    return prompt.find(after, pos) if after else -1
