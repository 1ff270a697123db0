"""What the qwen3-xml parser derives from the format spec, and the record of one block.

Knows: the markers of the qwen3-xml spec, grouped into the MarkerSets (parsers/markers.py)
each state searches, so a stream parser holds back at most the longest marker. Does not
know: the grammar's states (qwen3_xml_text.py, qwen3_xml_block.py) or typed values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from callgate.formats import Qwen3XmlMarkers, ToolCallFormat
from callgate.parsers.markers import MarkerSet

NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')  # what json.dumps(ensure_ascii=False) escapes


def choose(markers: MarkerSet, buf: str, pos: int, options: tuple[str, ...]) -> str | None:
    """The option buf continues with at pos; "" when undecided yet (the rest may still
    become one of `markers`); None when none."""
    for option in options:
        if buf.startswith(option, pos):
            return option
    return "" if markers.could_start(buf, pos) else None


@dataclass(frozen=True, slots=True)
class Syntax:
    """Everything the machine needs from the format spec, derived once per format."""

    fmt: ToolCallFormat
    eos: str
    sep: str
    call_open: str
    call_close: str
    fn_open: str
    fn_close: str
    p_open: str
    p_close: str
    tag_end: str
    think_open: str
    think_close: str
    content: MarkerSet
    reasoning: MarkerSet
    value: MarkerSet
    body: MarkerSet
    between: MarkerSet
    recover: MarkerSet
    stray: MarkerSet
    plain_value: re.Pattern[str]  # finds what may start a value's end marker or needs a JSON escape

    @classmethod
    def of(cls, fmt: ToolCallFormat) -> Syntax:
        m = fmt.markers_as(Qwen3XmlMarkers)
        sep, eos = m.separator, fmt.eos
        co, cc, fo, fc, po, pc = (
            m.call_open,
            m.call_close,
            m.function_open,
            m.function_close,
            m.parameter_open,
            m.parameter_close,
        )
        value = MarkerSet.of((sep + pc, sep + po, fc, co, cc, eos))
        return cls(
            fmt,
            eos,
            sep,
            co,
            cc,
            fo,
            fc,
            po,
            pc,
            m.tag_end,
            m.think_open,
            m.think_close,
            content=MarkerSet.of((co, fo, po, pc, fc, cc, eos)),
            reasoning=MarkerSet.of((m.think_close, co, eos)),
            value=value,
            body=MarkerSet.of((po, fc, cc, co, eos)),
            between=MarkerSet.of((sep + co, eos)),
            recover=MarkerSet.of((cc, co, eos)),
            stray=MarkerSet.of((co,)),
            plain_value=re.compile("[" + re.escape(value.firsts) + NEEDS_ESCAPE.pattern[1:-1] + "]"),
        )


_SYNTAXES: dict[str, Syntax] = {}


def syntax_of(fmt: ToolCallFormat) -> Syntax:
    """The derived syntax of `fmt`, built once per format."""
    syntax = _SYNTAXES.get(fmt.name)
    if syntax is None or syntax.fmt is not fmt:
        syntax = _SYNTAXES[fmt.name] = Syntax.of(fmt)
    return syntax


class Call:
    """The block being read. Mutable on purpose: it lives only while its block is read."""

    __slots__ = (
        "arguments",
        "call_id",
        "index",
        "literal",
        "literal_code",
        "literal_then",
        "name",
        "name_code",
        "name_parts",
        "name_start",
        "name_then",
        "raw",
        "start",
        "value_from",
        "value_name",
        "value_start",
        "value_streams",
        "value_types",
    )

    def __init__(self, start: int) -> None:
        self.start = start
        self.raw: list[str] = []
        self.name = ""
        self.index = -1
        self.call_id = ""
        self.arguments: dict[str, Any] = {}
        self.literal = ""
        self.literal_code = ""
        self.literal_then: Callable[[int], None] = _nothing
        self.name_code = ""
        self.name_parts: list[str] = []
        self.name_start = 0
        self.name_then: Callable[[str], str | None] = _no_error
        self.value_name: str | None = None
        self.value_from = 0  # raw[value_from:] is the text of the value being read
        self.value_types: tuple[str, ...] = ()
        self.value_start = 0
        self.value_streams = True


def _nothing(at: int) -> None:
    del at


def _no_error(name: str) -> str | None:
    del name
    return None
