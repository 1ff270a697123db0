"""Model text -> events / candidates. Strict and incremental; pure Python.

Knows: how to pick the family machine for a format name. Does not know: templates,
engines or HTTP. Imports no torch, vllm, fastapi or pydantic.

    parse(format, text, tools=None, *, thinking=False) -> ParseResult
    stream_parser(format, tools=None, *, thinking=False) -> StreamParser
"""

from __future__ import annotations

import importlib

from callgate.formats import get_format
from callgate.parsers.base import CallIdFactory, StreamParser, Tools, random_call_id, sequential_call_ids
from callgate.types import ParseResult

__all__ = ["StreamParser", "parse", "random_call_id", "sequential_call_ids", "stream_parser"]

# family -> module that defines `make_parser(fmt, tools, *, thinking, call_ids) -> StreamParser`
_FAMILY_MODULES = {
    "dsml": "callgate.parsers.dsml",
    "qwen3-xml": "callgate.parsers.qwen3_xml",
    "json": "callgate.parsers.json_calls",
}


def stream_parser(
    format: str,
    tools: Tools = None,
    *,
    thinking: bool = False,
    call_ids: CallIdFactory | None = None,
) -> StreamParser:
    """A fresh per-request parser. `thinking`: the prompt opened a reasoning block."""
    fmt = get_format(format)
    module = importlib.import_module(_FAMILY_MODULES[fmt.family])
    parser: StreamParser = module.make_parser(fmt, tools, thinking=thinking, call_ids=call_ids or random_call_id)
    return parser


def parse(
    format: str,
    text: str,
    tools: Tools = None,
    *,
    thinking: bool = False,
    call_ids: CallIdFactory | None = None,
) -> ParseResult:
    """Parse a whole output: exactly feed(text) + finish() on a fresh stream parser."""
    parser = stream_parser(format, tools, thinking=thinking, call_ids=call_ids)
    parser.feed(text)
    parser.finish()
    return parser.result()
