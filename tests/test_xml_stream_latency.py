"""How soon the XML-family parsers (dsml-v3.2, dsml-v4, qwen3-xml) hand out events while
streaming. Inside tag text they collect deltas unread until the tag can end; these tests
check that this never delays what must stream (content, a string value's text), that a
call and each parameter start by the end of their tags, and that the wait is bounded when
the end never comes. The split-invariance tests check that the events themselves do not
change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.formats import get_format
from callgate.parsers import sequential_call_ids, stream_parser
from callgate.types import ArgumentsDelta, CallStart, DiagnosticEvent, Event, TextDelta
from tests.harness import assistant_completion

FORMATS = ["dsml-v3.2", "dsml-v4", "qwen3-xml"]
DELTA_CHARS = 4
HOLD_CHARS = 32  # more than the longest marker a parser may hold back in text or a value
WAIT_BOUND_CHARS = 128 + 2 * DELTA_CHARS  # the parsers' wait limit, and the delta it ends in

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}, "body": {"type": "string"}},
            },
        },
    }
]
CONTEXT = [{"role": "user", "content": "Write it."}]
# "<" that starts no marker, alone, as an HTML tag, or before "/" with no ">" after it
CONTENT = "I will write the file now (1 < 2, 3 </ 4), with every line of it, as you asked me to."
BODY = "first line of the file, 1 < 2 and 3 </ 4, long enough\nsecond line & more <b>text</b> " * 3
ARGS = {"path": "notes.md", "lines": 6, "body": BODY}


def _output(fmt: str) -> str:
    turn = {
        "role": "assistant",
        "content": CONTENT,
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(ARGS)}}
        ],
    }
    return assistant_completion(fmt, CONTEXT, turn, TOOLS, eos=get_format(fmt).eos)


def _stream(fmt: str, text: str) -> list[tuple[int, list[Event]]]:
    """(characters fed so far, events returned by that feed) for 4-character deltas."""
    parser = stream_parser(fmt, TOOLS, call_ids=sequential_call_ids())
    out = [
        (min(i + DELTA_CHARS, len(text)), parser.feed(text[i : i + DELTA_CHARS]))
        for i in range(0, len(text), DELTA_CHARS)
    ]
    out.append((len(text), parser.finish()))
    return out


def _first_feed(fed: list[tuple[int, list[Event]]], pred: Any) -> int:
    """Characters fed when the first event satisfying `pred` came out."""
    return next(n for n, events in fed for ev in events if pred(ev))


@pytest.mark.parametrize("fmt", FORMATS)
def test_content_streams_while_it_arrives(fmt: str) -> None:
    text = _output(fmt)
    shown = ""
    for n, events in _stream(fmt, text):
        shown += "".join(ev.text for ev in events if isinstance(ev, TextDelta))
        if n <= len(CONTENT):
            assert len(shown) >= n - HOLD_CHARS, f"content held back after {n} characters"


@pytest.mark.parametrize("fmt", FORMATS)
def test_string_value_streams_while_it_arrives(fmt: str) -> None:
    text = _output(fmt)
    start = text.index(BODY)
    streamed = ""
    for n, events in _stream(fmt, text):
        streamed += "".join(ev.text for ev in events if isinstance(ev, ArgumentsDelta))
        if start < n <= start + len(BODY):
            arrived = BODY[: max(0, n - start - HOLD_CHARS)]
            assert json.dumps(arrived, ensure_ascii=False)[1:-1] in streamed, f"value held back after {n} characters"


@pytest.mark.parametrize("fmt", FORMATS)
def test_call_and_parameters_start_by_the_end_of_their_tags(fmt: str) -> None:
    text = _output(fmt)
    fed = _stream(fmt, text)
    # a tag's events come at the latest with the delta after the one that ends it (the
    # newline after a qwen3-xml tag may come in the next delta)
    slack = 2 * DELTA_CHARS
    first_value = text.index(str(ARGS["path"]))  # right after the first parameter's tags
    assert _first_feed(fed, lambda ev: isinstance(ev, CallStart)) <= first_value + slack
    for key, value in ARGS.items():
        at = text.index(str(value), text.index(key))
        prefix = json.dumps(key) + ": "
        assert _first_feed(fed, lambda ev, p=prefix: isinstance(ev, ArgumentsDelta) and p in ev.text) <= at + slack


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tag_that_never_ends_is_diagnosed_within_the_wait_bound(fmt: str) -> None:
    text = _output(fmt)
    # cut inside the first parameter's opening tag (after the name's closing quote in DSML,
    # in the name in qwen3-xml), then text with no ">" that breaks the tag
    cut = text.index("path") + len("path") + (fmt != "qwen3-xml")
    broken = text[:cut] + "x y" * 200
    fed = _stream(fmt, broken)
    diagnosed = _first_feed(fed, lambda ev: isinstance(ev, DiagnosticEvent))
    assert diagnosed < len(broken), "the diagnostic waited for the end of the output"
    assert diagnosed <= cut + WAIT_BOUND_CHARS


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_deltas_yield_nothing_and_change_nothing(fmt: str) -> None:
    # each state has its own fast path for a delta: an empty one must be a no-op in all of them
    text = "<think>\nplan</think>\n\n" + _output(fmt) if fmt == "qwen3-xml" else _output(fmt)
    plain = _stream(fmt, text)
    parser = stream_parser(fmt, TOOLS, call_ids=sequential_call_ids())
    events: list[Event] = list(parser.feed(""))
    for i in range(0, len(text), DELTA_CHARS):
        events += parser.feed(text[i : i + DELTA_CHARS])
        assert parser.feed("") == []
    events += parser.finish()
    assert events == [ev for _, evs in plain for ev in evs]
