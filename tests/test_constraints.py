"""Grammar construction: exact free-text exclusion, JSON Schema regexes, keyword refusal,
tool_choice modes, cache keys, the compile time limit. Regexes are checked with Python's
`re` (same semantics as outlines-core's dialect for the constructs used); compilation uses
a small synthetic byte vocabulary so these tests need no tokenizer."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from typing import Any

import jsonschema
import pytest
from hypothesis import assume, given, settings

import callgate.constraints as constraints
from callgate.constraints import cache
from callgate.constraints.json_schema import GENERIC_DEPTH, schema_regex
from callgate.constraints.request import grammar_request
from callgate.constraints.text import text_without
from callgate.errors import InvalidRequestError, SchemaTooComplexError
from tests.harness import _schema_of, json_values

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMED = {"type": "function", "function": {"name": "get_time"}}


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


def largest_float(value: Any) -> float:
    if isinstance(value, list | dict):
        return max(map(largest_float, value.values() if isinstance(value, dict) else value), default=0.0)
    return abs(value) if isinstance(value, float) else 0.0


def full(rx: str, text: str) -> bool:
    return re.fullmatch(rx, text) is not None


# ---- text_without ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    [
        ["<tool_call>", "</tool_call>", "<think>", "<tc>", "<t/"],
        ["</parameter>", "<parameter=", "</function>", "<tool_call>", "[TOOL_CALLS]", "[/INST]"],
        ["<ab", "</a", "[x]"],
    ],
)
def test_text_without_is_exactly_the_marker_free_language(words: list[str]) -> None:
    rx = re.compile(text_without(words, banned="|"))
    alphabet = sorted(set("".join(words)) | {"x", "|", "\n"})
    rng = random.Random(0)
    for _ in range(20000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.4:
            w = rng.choice(words)
            i = rng.randint(0, len(s))
            s = s[:i] + w[: rng.randint(1, len(w))] + s[i:]
        expected = not any(w in s for w in words) and "|" not in s
        assert (rx.fullmatch(s) is not None) == expected, s


def test_text_without_refuses_markers_it_cannot_express_exactly() -> None:
    with pytest.raises(ValueError, match="also starts a marker"):
        text_without(["\n</parameter>", "</function>"])


# ---- JSON Schema -> regex ----------------------------------------------------------------


@given(json_values(max_leaves=6))
@settings(max_examples=200, deadline=None)
def test_inferred_schema_accepts_json_dumps_of_its_value(value: Any) -> None:
    assume(depth(value) <= GENERIC_DEPTH + 1)  # the typed level plus the free-form bound
    assume(largest_float(value) < 1e308)  # the grammar's bound on numbers (json_schema.NUMBER)
    schema = {"type": "object", "properties": {"v": _schema_of(value)}, "required": ["v"]}
    assert full(schema_regex(schema), json.dumps({"v": value}, ensure_ascii=False))
    assert full(schema_regex(schema), json.dumps({"v": value}, ensure_ascii=False, separators=(",", ":")))


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "unit": {"enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        "when": {"type": "string", "format": "date"},
        "maybe": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
    },
    "required": ["name"],
}


@pytest.mark.parametrize(
    "value",
    [
        {"name": "ab"},
        {"name": "abcde", "unit": "c", "tags": [1, -2], "when": "2024-02-29", "maybe": None},
        {"name": "a", "maybe": True},
        {"name": '\u00e9\\"', "tags": []},
    ],
)
def test_schema_regex_accepts_valid(value: dict[str, Any]) -> None:
    jsonschema.validate(value, SCHEMA)
    assert full(schema_regex(SCHEMA), json.dumps(value, ensure_ascii=False))


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"name": ""},
        {"name": "abcdef"},
        {"name": "a", "unit": "k"},
        {"name": "a", "tags": [1, 2, 3]},
        {"name": "a", "tags": [1.5]},
        {"name": "a", "when": "2024-13-01"},
        {"name": "a", "maybe": 0},
        {"name": 1},
    ],
)
def test_schema_regex_rejects_invalid(value: dict[str, Any]) -> None:
    assert not full(schema_regex(SCHEMA), json.dumps(value, ensure_ascii=False))


def test_strings_refuse_lone_surrogate_escapes_and_raw_controls() -> None:
    rx = schema_regex({"type": "string"})
    assert full(rx, '"\\u00e9\\n"')
    assert not full(rx, '"\\ud800"')
    assert not full(rx, '"a\nb"')


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "integer", "minimum": 0}, "minimum"),
        ({"type": "number", "multipleOf": 2}, "multipleOf"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
        ({"not": {"type": "string"}}, "not"),
        ({"if": {"type": "string"}, "then": {}}, "if"),
        ({"allOf": [{"type": "string"}, {"minLength": 2}]}, "allOf"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "string", "pattern": "^a+$"}, "pattern"),
        ({"$ref": "https://example.com/s.json"}, "$ref"),
        ({"type": "object", "properties": {}, "required": ["x"]}, "required"),
        ({"type": "string", "maxLength": 100000}, "maxLength"),
    ],
)
def test_unenforceable_keyword_is_named(schema: dict[str, Any], keyword: str) -> None:
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": schema}}},
    }
    with pytest.raises(SchemaTooComplexError) as err:
        constraints.build("hermes", [tool], "required", True, None, None)
    assert repr(keyword) in err.value.message
    assert err.value.status == 400 and err.value.code == "schema_too_complex"


def test_recursive_ref_is_unrolled_and_bounded() -> None:
    schema = {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}}
    rx = schema_regex(schema)
    assert full(rx, '{"next": {"next": {"v": 1}}}')
    assert not full(rx, '{"next": {"next": {"next": {"next": {"next": {}}}}}}')


def test_disjoint_one_of_is_enforced() -> None:
    rx = schema_regex({"oneOf": [{"type": "string"}, {"type": "integer"}]})
    assert full(rx, '"a"') and full(rx, "3") and not full(rx, "null")


# ---- modes -------------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def regex(tool_choice: Any, parallel: bool = True, response_format: Any = None, fmt: str = "hermes") -> str:
    c = constraints.build(fmt, [WEATHER, CLOCK], tool_choice, parallel, response_format, None)
    assert c is not None
    return c.regex


def test_none_cannot_produce_call_syntax() -> None:
    rx = regex("none")
    assert full(rx, "It is sunny in Paris.\n<b>ok</b>")
    assert not full(rx, "Sure: " + CALL)
    assert not full(rx, "a </tool_call> b")


def test_auto_is_lazy_from_the_trigger() -> None:
    c = constraints.build("hermes", [WEATHER], "auto", True, None, None)
    assert c is not None and c.trigger == "<tool_call>" and not full(c.regex, "x" + CALL)
    assert full(c.regex, CALL) and full(c.regex, CALL + "\n" + CALL)
    assert not full(c.regex, "<tool_call>\nhello\n</tool_call>")
    assert c.ref().trigger == c.trigger and c.ref().key == c.key


def test_auto_with_thinking_is_eager_and_keeps_calls_out_of_reasoning() -> None:
    c = constraints.build("hermes", [WEATHER], "auto", True, None, None, thinking=True)
    assert c is not None and c.trigger is None
    assert full(c.regex, "let me see</think>\n\nIt is sunny.")
    assert full(c.regex, "hmm</think>\n\n" + CALL)
    assert not full(c.regex, CALL + "</think>\n\n" + CALL)


def test_required_needs_a_call() -> None:
    rx = regex("required")
    assert full(rx, CALL) and full(rx, CALL + "\n" + CALL2)
    assert not full(rx, "") and not full(rx, "I will not call.")


def test_named_allows_only_that_tool_once() -> None:
    rx = regex(NAMED)
    assert full(rx, CALL2)
    assert not full(rx, CALL) and not full(rx, CALL2 + "\n" + CALL2)


def test_not_parallel_means_exactly_one_call() -> None:
    rx = regex("required", parallel=False)
    assert full(rx, CALL) and not full(rx, CALL + "\n" + CALL2)


def test_response_format_json_schema() -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {
            "name": "r",
            "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        },
    }
    c = constraints.build("hermes", None, None, None, rf, None)
    assert c is not None and c.mode == "response_format"
    assert full(c.regex, '{"ok": true}') and not full(c.regex, '{"ok": 1}') and not full(c.regex, "ok")
    c2 = constraints.build("hermes", None, None, None, {"type": "json_object"}, None)
    assert c2 is not None and full(c2.regex, '{"a": [1, null], "b": {"c": "d"}}') and not full(c2.regex, "[1]")


def test_unconstrained_and_bad_choices() -> None:
    assert constraints.build("hermes", None, "auto", True, None, None) is None
    assert constraints.build("hermes", None, None, None, {"type": "text"}, None) is None
    with pytest.raises(InvalidRequestError):
        constraints.build("hermes", [WEATHER], {"type": "function", "function": {"name": "nope"}}, True, None, None)
    with pytest.raises(InvalidRequestError):
        constraints.build("hermes", None, "required", True, None, None)


def test_key_is_canonical() -> None:
    def key(tools: list[Any], choice: Any = "required") -> str:
        req = grammar_request("hermes", tools, choice, True, None)
        assert req is not None
        return req.key()

    described = json.loads(json.dumps(WEATHER))
    described["function"]["description"] = "changes nothing in the grammar"
    assert key([WEATHER]) == key([described])
    reordered = json.loads(json.dumps(WEATHER))
    props = reordered["function"]["parameters"]["properties"]
    reordered["function"]["parameters"]["properties"] = dict(reversed(list(props.items())))
    assert key([WEATHER]) != key([reordered])
    assert key([WEATHER]) != key([WEATHER], "auto")


# ---- compilation -------------------------------------------------------------------------


def byte_vocabulary() -> constraints.TokenVocabulary:
    tokens: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256)}
    for i, word in enumerate([b"<tool_call>", b'"name"', b"get_weather", b"</tool_call>", b"\n"]):
        tokens.setdefault(word, []).append(256 + i)
    return constraints.token_vocabulary(tokens, eos_token_id=300)


def walk(index: Any, ids: list[int]) -> Any:
    state = index.get_initial_state()
    for t in ids:
        state = index.get_next_state(state, t)
        if state is None:
            return None
    return state


def test_compiled_index_walks_and_is_cached() -> None:
    vocab = byte_vocabulary()
    c = constraints.build("hermes", [WEATHER], "required", False, None, vocab)
    assert c is not None and c.index is not None
    ids = [256, *CALL.encode()[len(b"<tool_call>") :]]
    state = walk(c.index, ids)
    assert state is not None and c.index.is_final_state(state)
    assert walk(c.index, list(b"<tool_cal>")) is None
    again = constraints.build("hermes", [WEATHER], "required", False, None, vocab)
    assert again is not None and again.index is c.index
    assert constraints.get_index(c.key, c.regex, vocab) is c.index


@pytest.mark.parametrize("text", [CALL + "\n" + CALL2, "It is " + CALL])
def test_index_keeps_continuations_after_an_accepting_point(text: str) -> None:
    # outlines-core drops a byte that leaves an accepting position unless the regex is
    # anchored at the end; both a second call and a call after content need that byte.
    c = constraints.build("hermes", [WEATHER, CLOCK], "auto", True, None, byte_vocabulary(), thinking=True)
    assert c is not None
    state = walk(c.index, list(("x</think>" + text).encode()))
    assert state is not None and c.index.is_final_state(state)


@pytest.mark.parametrize("fmt", ["hermes", "dsml-v4", "dsml-v3.2", "qwen3-xml", "llama3-json", "mistral"])
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("choice", ["none", "auto", "required", NAMED])
def test_every_mode_compiles_and_needs_output(fmt: str, thinking: bool, choice: Any) -> None:
    c = constraints.build(fmt, [WEATHER, CLOCK], choice, True, None, byte_vocabulary(), thinking=thinking)
    assert c is not None and c.index is not None
    assert not full(c.regex, "")


def test_raw_vocabulary_needs_the_eos_id() -> None:
    tokens = {bytes([b]): [b] for b in range(256)}
    with pytest.raises(TypeError, match="eos_token_id"):
        constraints.build("hermes", [WEATHER], "required", True, None, tokens)
    c = constraints.build("hermes", [WEATHER], "required", True, None, tokens, eos_token_id=256)
    assert c is not None and c.index is not None


async def test_build_async_compiles_off_the_loop() -> None:
    c = await constraints.build_async("dsml-v4", [WEATHER], "required", True, None, byte_vocabulary())
    assert c is not None and c.index is not None


async def test_build_async_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request gets its 400 at the time limit while the compile still runs: the compile
    is held until the request has answered (no wall-clock assertion)."""
    release = threading.Event()

    def held(regex: str, vocabulary: constraints.TokenVocabulary) -> Any:
        release.wait(30)
        return real(regex, vocabulary)

    real = cache.compile_index
    monkeypatch.setattr(cache, "compile_index", held)
    fresh = {"type": "function", "function": {"name": "time_limit_test"}}  # in no cache yet
    try:
        with pytest.raises(SchemaTooComplexError, match=r"within 0\.05 s"):
            await constraints.build_async("hermes", [fresh], "required", True, None, byte_vocabulary(), timeout_s=0.05)
        assert not release.is_set()  # answered while its compile was still held
    finally:
        release.set()
    while constraints._POOL.busy:  # the worker ends before the loop closes
        await asyncio.sleep(0.01)
