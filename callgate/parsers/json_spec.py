"""What the JSON-family parser reads from a format spec.

Knows: how the `markers` of the three JSON-family formats (hermes, llama3-json, mistral)
map onto one parser: the call layout, the block markers, the end-of-turn tokens, the keys of
a call object, and which texts in free text mean what. Does not know: events, or JSON.

Layouts (the `call_layout` of the format's markers):
  object  CONTENT (sep block_open JSON-object block_close)*   hermes; calls repeat
  single  [python_tag] JSON-object, or plain content            llama3-json; one call
  list    CONTENT block_open JSON-list-of-objects               mistral; ids in the objects
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Literal

from callgate.formats import HermesMarkers, Llama3Markers, MistralMarkers, ToolCallFormat, get_format, json_markers
from callgate.parsers.markers import MarkerSet

Layout = Literal["object", "single", "list"]
# What a marker met in free text means.
Action = Literal[
    "block",  # opens a call block
    "end",  # end of turn
    "unbalanced",  # a block close with no open block
    "stray_think",  # a reasoning tag outside the leading reasoning block
    "text_before_call",  # a call after content where the format forbids it
    "special",  # any other control token
]


@dataclass(frozen=True, slots=True)
class JsonFamilySpec:
    format: str
    layout: Layout
    block_open: str  # object/list: opens a block; single: the optional python tag
    block_close: str  # object only; "" otherwise
    separator: str  # object only: between content and a call, and between calls
    ends: tuple[str, ...]  # end-of-turn tokens
    name_key: str
    arguments_key: str
    id_key: str  # list only; "" otherwise
    id_pattern: re.Pattern[str] | None
    reasoning_open: str  # "" where the format has no reasoning block
    reasoning_close: str
    content_markers: MarkerSet
    content_actions: dict[str, Action]
    # finds why a piece of content cannot simply be passed on: a character that may start a
    # content marker, or a separator at its end (held: dropped if a call follows)
    text_stop: re.Pattern[str]
    # the same for reasoning: a character that may start a reasoning marker, or a newline at
    # the end (held: the newlines before the reasoning close are dropped)
    thought_stop: re.Pattern[str]
    ends_set: MarkerSet
    reasoning_markers: MarkerSet
    block_markers: MarkerSet  # what may stop a block's JSON: ends, open, close
    skip_markers: MarkerSet  # where a malformed block stops: ends, close
    trailing_markers: MarkerSet  # what ends text after a call: ends (and open, object layout)
    after_call_prefixes: frozenset[str]  # non-empty prefixes of what may follow a call
    # what the parser can only wait on, after a call and at the start of the output
    after_call_waiting: frozenset[str]
    start_waiting: frozenset[str]


def _content_actions(fmt: ToolCallFormat, layout: Layout, block_open: str, block_close: str) -> dict[str, Action]:
    actions: dict[str, Action] = {tok: "special" for tok in fmt.special_tokens}
    for tok in (fmt.reasoning_open, fmt.reasoning_close):
        if tok:
            actions[tok] = "stray_think"
    if layout == "single":
        actions[block_open] = "text_before_call"
        actions[fmt.markers_as(Llama3Markers).call_in_text] = "text_before_call"
    else:
        actions[block_open] = "block"
    if block_close:
        actions[block_close] = "unbalanced"
    for tok in _ends(fmt):
        actions[tok] = "end"
    return actions


def _ends(fmt: ToolCallFormat) -> tuple[str, ...]:
    m = fmt.markers
    return (fmt.eos, m.end_of_message) if isinstance(m, Llama3Markers) else (fmt.eos,)


@cache
def json_family_spec(format: str) -> JsonFamilySpec:
    """The parser's view of a JSON-family format (computed once per format)."""
    fmt = get_format(format)
    m = json_markers(fmt)
    layout: Layout
    if isinstance(m, HermesMarkers):
        layout, block_open, block_close, sep = m.call_layout, m.block_open, m.block_close, m.call_separator
    elif isinstance(m, Llama3Markers):
        layout, block_open, block_close, sep = m.call_layout, m.python_tag, "", ""
    else:
        layout, block_open, block_close, sep = m.call_layout, m.calls, "", ""
    actions = _content_actions(fmt, layout, block_open, block_close)
    id_pattern = fmt.call_ids.pattern if fmt.call_ids else None
    reasoning = tuple(t for t in (fmt.reasoning_close, block_open, block_close, *_ends(fmt)) if t)
    closes = (block_close,) if block_close else ()
    content_markers = MarkerSet.of(tuple(actions))
    reasoning_markers = MarkerSet.of(reasoning)
    after_call = (*_ends(fmt), block_open, *((sep + block_open,) if layout == "object" else ()))
    after_call_prefixes = frozenset(m[:k] for m in after_call for k in range(1, len(m) + 1))
    # after a call, these open a block, end the turn or are an error as soon as they begin
    decided = (*_ends(fmt), *((sep + block_open, block_open) if layout != "single" else ()))
    start = block_open if layout == "single" else fmt.reasoning_open or ""
    text_stop = content_markers.starts.pattern + (f"|{re.escape(sep)}\\Z" if sep else "")
    return JsonFamilySpec(
        format=fmt.name,
        layout=layout,
        block_open=block_open,
        block_close=block_close,
        separator=sep,
        ends=_ends(fmt),
        name_key=m.name_key,
        arguments_key=m.arguments_key,
        id_key=m.id_key if isinstance(m, MistralMarkers) else "",
        id_pattern=re.compile(id_pattern) if id_pattern else None,
        reasoning_open=fmt.reasoning_open or "",
        reasoning_close=fmt.reasoning_close or "",
        content_markers=content_markers,
        content_actions=actions,
        text_stop=re.compile(text_stop),
        thought_stop=re.compile(reasoning_markers.starts.pattern + r"|\n\Z"),
        ends_set=MarkerSet.of(_ends(fmt)),
        reasoning_markers=reasoning_markers,
        block_markers=MarkerSet.of((*_ends(fmt), block_open, *closes)),
        skip_markers=MarkerSet.of((*_ends(fmt), *closes)),
        trailing_markers=MarkerSet.of((*_ends(fmt), block_open) if layout == "object" else _ends(fmt)),
        after_call_prefixes=after_call_prefixes,
        after_call_waiting=frozenset(p for p in after_call_prefixes if not p.startswith(decided)),
        start_waiting=frozenset(start[:k] for k in range(1, len(start)) if start[0] not in "{["),
    )
