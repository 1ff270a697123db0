"""The streaming JSON scanner against the whole-text reader of the same rule: the same
verdict as callgate.strict_json.loads on every text, the canonical arguments text equal to
json.dumps of the decoded value, and the same results however the text is split."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.parsers.json_scan import PLAIN_KEPT, PLAIN_STREAMED, RUNNING, JsonScanner
from callgate.strict_json import StrictJsonError, loads
from tests.harness import json_values, random_split


def _scan(pieces: list[str], **kwargs: Any) -> tuple[JsonScanner, int]:
    scanner = JsonScanner(**kwargs)
    consumed = 0
    for piece in pieces:
        pos = scanner.feed(piece, 0)
        consumed += pos
        if scanner.done or scanner.failed:
            return scanner, consumed
    scanner.finish()
    return scanner, consumed


def _accepts(text: str) -> bool:
    scanner, consumed = _scan([text])
    return scanner.done and not text[consumed:].strip(" \t\r\n")


TEXTS = [
    '{"a": [1, -0, 0.5, 1e5, 1E-2, true, false, null, "x\\u00e9\\ud83d\\ude00\\n"]}',
    '  {"a" : {}, "b":[ ] }  ',
    '"\\ud83d"',
    '"\\ud83d\\ude00"',
    '"\\ude00"',
    '"\\ud83dx"',
    '"\\ud83d\\n"',
    '"\\ud83d\\ud83d"',
    '"\\\\ud83d"',
    '{"\\ud83d": 1}',
    '["\ud83d"]',
    "[" * 128 + "]" * 128,
    "[" * 129 + "]" * 129,
    '{"a": ' * 129 + "1" + "}" * 129,
    "9" * 4300,
    "-" + "9" * 4300,
    "9" * 4301,
    str(2**64 + 1),
    "1e-999",
    "-12.5e+3",
    "{'a': 1}",
    '{"a": 1,}',
    "[1, 2,]",
    "[01]",
    "[1.]",
    "[.5]",
    "[-]",
    "[1e]",
    '{"a": NaN}',
    "[Infinity]",
    "[1e400]",
    '{"a": 1, "a": 2}',
    '["a\nb"]',
    '["\\x"]',
    '["\\u12G4"]',
    "[tru]",
    "[nul",
    "{",
    '{"a" 1}',
    '{"a": 1 "b": 2}',
    "[1 2]",
    "",
    "   ",
    "[1]]",
]


@pytest.mark.parametrize("text", TEXTS)
def test_same_verdict_as_strict_json(text: str) -> None:
    try:
        loads(text)
        code = None
    except StrictJsonError as err:
        code = err.code
    scanner, _ = _scan([text])
    assert _accepts(text) == (code is None)
    if code is not None and scanner.error is not None:  # each text here breaks one thing
        assert scanner.error.code == code


CALL_OBJECTS = st.builds(
    lambda name, arguments: {"name": name, "arguments": arguments},
    st.text(min_size=1, max_size=8),
    st.dictionaries(st.text(max_size=6), json_values()),
)


@settings(max_examples=200, deadline=None)
@given(CALL_OBJECTS, st.sampled_from([None, 0, 2, "\n"]), st.integers(min_value=0, max_value=2**16))
def test_canonical_arguments_stream(call: dict[str, Any], indent: Any, seed: int) -> None:
    text = json.dumps(call, ensure_ascii=indent is None, indent=indent)
    pieces = random_split(text, random.Random(seed), max_piece=5)
    scanner, consumed = _scan(pieces, name_key="name", capture_key="arguments")
    assert scanner.done and consumed == len(text)
    assert scanner.name == call["name"]
    assert scanner.captured
    assert "".join(scanner.out) == json.dumps(call["arguments"], ensure_ascii=False)


def test_arguments_before_name_are_not_streamed() -> None:
    scanner, _ = _scan(['{"arguments": {"a": 1}, "name": "f"}'], name_key="name", capture_key="arguments")
    assert scanner.done and scanner.name == "f" and not scanner.captured and scanner.out == []


@settings(max_examples=150, deadline=None)
@given(json_values(max_leaves=12), st.integers(min_value=0, max_value=2**16))
def test_values_and_splits(value: Any, seed: int) -> None:
    text = json.dumps(value, ensure_ascii=seed % 2 == 0)
    whole, _ = _scan([text])
    split, _ = _scan(random_split(text, random.Random(seed), max_piece=3))
    assert whole.done and split.done
    assert whole.element_spans == split.element_spans
    if isinstance(value, list):
        assert [json.loads(text[s:e]) for s, e in whole.element_spans] == value


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="{}[]\",:\\ 0123456789.eE+-truefalsn\n'abu", max_size=30))
def test_random_text_verdict(text: str) -> None:
    try:
        loads(text)
        valid = True
    except StrictJsonError:
        valid = False
    assert _accepts(text) == valid


# ---- feed_delta: the streaming parser's entry, with its one-step shortcut for string body ----


def _scan_deltas(pieces: list[str], **kwargs: Any) -> tuple[JsonScanner, int, str]:
    """As _scan, through feed_delta; also the streamed text: `out` as it fills, plus each
    piece feed_delta says is a plain fragment of the streamed arguments."""
    scanner = JsonScanner(**kwargs)
    consumed, streamed = 0, []
    for piece in pieces:
        j = scanner.feed_delta(piece)
        if j == PLAIN_STREAMED:
            streamed.append(piece)
        streamed.extend(scanner.out)
        scanner.out.clear()
        if j >= 0:
            return scanner, consumed + j, "".join(streamed)
        consumed += len(piece)
    scanner.finish()
    return scanner, consumed, "".join(streamed)


@pytest.mark.parametrize("text", TEXTS)
def test_feed_delta_gives_the_verdict_of_feed(text: str) -> None:
    whole, consumed = _scan([text])
    for size in (1, 2, 3, 4):
        split, split_consumed, _ = _scan_deltas([text[i : i + size] for i in range(0, len(text), size)])
        assert (split.done, split.failed, split.error, split_consumed) == (
            whole.done,
            whole.failed,
            whole.error,
            consumed,
        )


@settings(max_examples=200, deadline=None)
@given(CALL_OBJECTS, st.booleans(), st.integers(min_value=0, max_value=2**16))
def test_feed_delta_streams_the_canonical_arguments(call: dict[str, Any], ascii: bool, seed: int) -> None:
    text = json.dumps(call, ensure_ascii=ascii)
    pieces = random_split(text, random.Random(seed), max_piece=5)
    scanner, consumed, streamed = _scan_deltas(pieces, name_key="name", capture_key="arguments")
    assert scanner.done and consumed == len(text)
    assert scanner.name == call["name"] and scanner.top_keys == ["name", "arguments"]
    assert streamed == json.dumps(call["arguments"], ensure_ascii=False)


def test_feed_delta_reads_plain_string_body_in_one_step() -> None:
    scanner = JsonScanner("name", "arguments")
    assert scanner.feed_delta('{"na') == RUNNING
    assert scanner.feed_delta("me") == PLAIN_KEPT  # a key: kept, not streamed
    assert scanner.feed_delta('": "get_') == RUNNING
    assert scanner.feed_delta("weather") == PLAIN_KEPT  # the name
    assert scanner.feed_delta('", "arguments": {"a": "') == RUNNING
    assert scanner.out == ["{", '"a"', ": ", '"']
    scanner.out.clear()
    assert scanner.feed_delta("é \x7f") == PLAIN_STREAMED  # printable or not, nothing to escape
    assert scanner.feed_delta("a\tb") == 1  # a raw control character: the machine errs there
    assert scanner.failed and scanner.error is not None
    assert scanner.error.offset == len('{"name": "get_weather", "arguments": {"a": "é \x7fa')
    assert scanner.name == "get_weather"
