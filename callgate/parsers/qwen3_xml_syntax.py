"""What the qwen3-xml parser derives from the format spec, and the record of one block.

Knows: the markers of the qwen3-xml spec and how to find them in a buffer (first match,
and where a partial marker may start, so a stream parser holds back at most the longest
marker). Does not know: the grammar's states (qwen3_xml.py) or typed values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from callgate.formats import Qwen3XmlMarkers, ToolCallFormat

NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')  # what json.dumps(ensure_ascii=False) escapes


@dataclass(frozen=True, slots=True)
class Scanner:
    """Finds the first of a set of markers; tells where a partial marker may start."""

    pattern: re.Pattern[str]
    prefixes: frozenset[str]
    longest: int
    firsts: str  # the distinct first characters of the markers
    starts: re.Pattern[str]  # finds any of them
    waiting: frozenset[str]  # the prefixes that hold no whole marker: a scan holds all of such a text back

    @classmethod
    def of(cls, *markers: str) -> Scanner:
        prefixes = frozenset(m[:k] for m in markers for k in range(1, len(m)))
        pattern = re.compile("|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)))
        firsts = "".join(sorted({m[0] for m in markers}))
        starts = re.compile("[" + re.escape(firsts) + "]")
        waiting = frozenset(p for p in prefixes if pattern.search(p) is None)
        return cls(pattern, prefixes, max(map(len, markers)), firsts, starts, waiting)

    def safe_end(self, buf: str, pos: int) -> int:
        """The first index from which buf may be the start of a marker (len(buf) if none)."""
        n = len(buf)
        start = max(pos, n - self.longest + 1)
        if self.starts.search(buf, start) is None:  # the common case in a stream's short reads
            return n
        best = n
        # str.find per first character: measured ~2x faster than slicing at every index
        for ch in self.firsts:
            i = buf.find(ch, start, best)
            while i != -1:
                if buf[i:] in self.prefixes:
                    best = i
                    break
                i = buf.find(ch, i + 1, best)
        return best

    def choose(self, buf: str, pos: int, options: tuple[str, ...]) -> str | None:
        """The option buf continues with at pos; "" when undecided yet; None when none."""
        for option in options:
            if buf.startswith(option, pos):
                return option
        return "" if buf[pos : pos + self.longest] in self.prefixes else None


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
    content: Scanner
    reasoning: Scanner
    value: Scanner
    body: Scanner
    between: Scanner
    recover: Scanner
    stray: Scanner
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
        value = Scanner.of(sep + pc, sep + po, fc, co, cc, eos)
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
            content=Scanner.of(co, fo, po, pc, fc, cc, eos),
            reasoning=Scanner.of(m.think_close, co, eos),
            value=value,
            body=Scanner.of(po, fc, cc, co, eos),
            between=Scanner.of(sep + co, eos),
            recover=Scanner.of(cc, co, eos),
            stray=Scanner.of(co),
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
