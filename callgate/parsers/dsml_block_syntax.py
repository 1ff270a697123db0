"""What the DSML calls block compiles to, once per format: the reader's states, the literal
tags each state expects, and the markers that end a value.

Knows: the block's markers in the format spec (golden/dsml/FORMAT.md sections 5 and 6)
and JSON string escaping. Does not know: how the block is read (dsml_block.BlockReader),
events or diagnostics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, auto

from callgate.formats import DsmlMarkers, ToolCallFormat
from callgate.parsers.markers import MarkerSet


class BlockState(IntEnum):  # IntEnum: hashed in C, and states are dictionary keys on the per-delta path
    OPEN = auto()  # the block name and ">\n"
    FIRST_INVOKE = auto()
    NAME = auto()
    NAME_END = auto()
    PARAMS = auto()  # a first parameter, or the "\n" of an empty parameter list
    EMPTY_CLOSE = auto()
    KEY = auto()
    ATTR = auto()
    FLAG = auto()
    VALUE = auto()
    AFTER_PARAM = auto()
    NEXT_PARAM = auto()
    AFTER_INVOKE = auto()
    NEXT_INVOKE = auto()
    CLOSED = auto()
    FAILED = auto()


_S = BlockState
_TO_ESCAPE = re.compile(r'[\x00-\x1f"\\]')  # what JSON escapes in a string (ensure_ascii off)
# json.dumps(..., ensure_ascii=False) builds an encoder per call (~1.5 us here); value text
# is escaped once per delta while it streams
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def escaped(text: str) -> str:
    """`text` as the inside of a JSON string literal."""
    if _TO_ESCAPE.search(text) is None:
        return text
    return _ENCODE(text)[1:-1]


# state -> its literal alternatives, each with the next state or an action name
Literals = dict[BlockState, tuple[tuple[str, BlockState | str], ...]]


@dataclass(frozen=True, slots=True)
class BlockSyntax:
    """What a format's block grammar compiles to; built once per format (`block_syntax`)."""

    fmt: ToolCallFormat
    values: MarkerSet  # what ends a value
    value_stop: re.Pattern[str]  # value text without these cannot end the value and needs no escape
    literals: Literals
    # state -> texts that are a proper prefix of one of its literals (or of the end of turn)
    # and contain none: the state can only wait for more
    pending: dict[BlockState, frozenset[str]]


_SYNTAX: dict[str, BlockSyntax] = {}


def block_syntax(fmt: ToolCallFormat) -> BlockSyntax:
    """The block syntax of `fmt`, built once per format."""
    known = _SYNTAX.get(fmt.name)
    if known is not None and known.fmt is fmt:
        return known
    literals = _literal_table(fmt)
    pending = {state: _proper_prefixes([lit for lit, _ in alts] + [fmt.eos]) for state, alts in literals.items()}
    ends = (fmt.markers_as(DsmlMarkers).param_close, fmt.eos)
    values = MarkerSet.of(ends)
    # one character class: measured faster than an alternation of two
    value_stop = re.compile("[" + "".join(sorted({re.escape(m[0]) for m in ends})) + _TO_ESCAPE.pattern[1:])
    known = BlockSyntax(fmt, values, value_stop, literals, pending)
    _SYNTAX[fmt.name] = known
    return known


def _proper_prefixes(alternatives: Sequence[str]) -> frozenset[str]:
    prefixes = {alt[:k] for alt in alternatives for k in range(1, len(alt))}
    return frozenset(p for p in prefixes if not any(p.startswith(alt) for alt in alternatives))


def _literal_table(fmt: ToolCallFormat) -> Literals:
    """state -> its literal alternatives, each with the next state or an action name."""
    m = fmt.markers_as(DsmlMarkers)
    end = m.tag_end  # '">', right after a name or the string flag
    return {
        _S.OPEN: ((m.block_open.split(m.dsml, 1)[1] + "\n", _S.FIRST_INVOKE),),
        _S.FIRST_INVOKE: ((m.invoke_open, "open_invoke"),),
        _S.NAME_END: ((end + "\n", "start_call"),),
        _S.PARAMS: ((m.param_open, _S.KEY), ("\n", _S.EMPTY_CLOSE)),
        _S.EMPTY_CLOSE: ((m.invoke_close, "end_invoke"),),
        _S.ATTR: ((m.string_attr, _S.FLAG),),
        _S.FLAG: (("true" + end, "string_value"), ("false" + end, "json_value")),
        _S.AFTER_PARAM: (("\n", _S.NEXT_PARAM),),
        _S.NEXT_PARAM: ((m.param_open, _S.KEY), (m.invoke_close, "end_invoke")),
        _S.AFTER_INVOKE: (("\n", _S.NEXT_INVOKE),),
        _S.NEXT_INVOKE: ((m.invoke_open, "open_invoke"), (m.block_close, _S.CLOSED)),
    }
