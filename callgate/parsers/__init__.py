"""Model text -> events / candidates. Strict and incremental; pure Python.

Knows: which family machine reads a format (by its `family`: json_calls, qwen3_xml or
dsml). Does not know: templates, engines or HTTP. Imports no torch, vllm, fastapi or
pydantic.

    parse(format, text, tools=None, *, thinking=False, json_answer=False) -> ParseResult
    stream_parser(format, tools=None, *, thinking=False, json_answer=False) -> StreamParser

`json_answer`: the request asks for a JSON answer (response_format) while tools may be
called. Only the JSON family reads it (in llama3-json both may start with `{`); the other
families mark their calls, so an answer never looks like one.
"""

from __future__ import annotations

from typing import assert_never

from callgate.formats import get_format
from callgate.parsers import dsml, json_calls, qwen3_xml
from callgate.parsers.base import CallIdFactory, StreamParser, Tools, random_call_id, sequential_call_ids
from callgate.types import ParseResult

__all__ = ["StreamParser", "parse", "random_call_id", "sequential_call_ids", "stream_parser"]


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
    ids = call_ids or random_call_id
    if fmt.family == "json":
        return json_calls.make_parser(fmt, tools, thinking=thinking, call_ids=ids, json_answer=json_answer)
    if fmt.family == "qwen3-xml":
        return qwen3_xml.make_parser(fmt, tools, thinking=thinking, call_ids=ids)
    if fmt.family == "dsml":
        return dsml.make_parser(fmt, tools, thinking=thinking, call_ids=ids)
    assert_never(fmt.family)


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
