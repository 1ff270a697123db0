"""Model text -> events / candidates. Strict and incremental; pure Python.

Knows: how to pick the family machine for a format name. Does not know: templates,
engines or HTTP. Imports no torch, vllm, fastapi or pydantic.

    parse(format, text, tools=None, *, thinking=False, json_answer=False) -> ParseResult
    stream_parser(format, tools=None, *, thinking=False, json_answer=False) -> StreamParser

`json_answer`: the request asks for a JSON answer (response_format) while tools may be
called. Only the JSON family reads it (in llama3-json both may start with `{`); the other
families mark their calls, so an answer never looks like one.
"""

from __future__ import annotations

import importlib

from callgate.formats import get_format
from callgate.parsers.base import CallIdFactory, StreamParser, Tools, random_call_id, sequential_call_ids
from callgate.types import ParseResult

__all__ = ["StreamParser", "parse", "random_call_id", "sequential_call_ids", "stream_parser"]

# family -> module that defines `make_parser(fmt, tools, *, thinking, call_ids) -> StreamParser`
# (and, for the families in _READS_JSON_ANSWER, a `json_answer` keyword)
_FAMILY_MODULES = {
    "dsml": "callgate.parsers.dsml",
    "qwen3-xml": "callgate.parsers.qwen3_xml",
    "json": "callgate.parsers.json_calls",
}
_READS_JSON_ANSWER = frozenset({"json"})


def stream_parser(
    format: str,
    tools: Tools = None,
    *,
    thinking: bool = False,
    call_ids: CallIdFactory | None = None,
    json_answer: bool = False,
) -> StreamParser:
    """A fresh per-request parser. `thinking`: the prompt opened a reasoning block;
    `json_answer`: see the module docstring."""
    fmt = get_format(format)
    module = importlib.import_module(_FAMILY_MODULES[fmt.family])
    options = {"json_answer": json_answer} if fmt.family in _READS_JSON_ANSWER else {}
    parser: StreamParser = module.make_parser(
        fmt, tools, thinking=thinking, call_ids=call_ids or random_call_id, **options
    )
    return parser


def parse(
    format: str,
    text: str,
    tools: Tools = None,
    *,
    thinking: bool = False,
    call_ids: CallIdFactory | None = None,
    json_answer: bool = False,
) -> ParseResult:
    """Parse a whole output: exactly feed(text) + finish() on a fresh stream parser."""
    parser = stream_parser(format, tools, thinking=thinking, call_ids=call_ids, json_answer=json_answer)
    parser.feed(text)
    parser.finish()
    return parser.result()
