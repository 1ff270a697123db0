"""Grammar construction on the llguidance engine: JSON Schema enforcement, keyword refusal,
tool_choice modes, cache keys, the compile time limit, checked with llguidance matchers over
a byte vocabulary (tests/llg_harness.py) so these tests need no tokenizer.

The regex baseline's helpers (benchmarks/regex_baseline/: text.text_without,
json_schema.schema_regex, bench_compile's outlines-core grammars) keep their cheap checks,
with Python's `re` (the same semantics as outlines-core's dialect for the constructs used)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from hypothesis import assume, given, settings

import callgate.constraints as constraints
from benchmarks.regex_baseline.json_schema import GENERIC_DEPTH, schema_regex
from benchmarks.regex_baseline.text import text_without
from callgate.constraints.llg import matcher
from callgate.constraints.request import grammar_request
from callgate.errors import InvalidRequestError, SchemaTooComplexError
from callgate.formats import get_format
from tests.harness import _schema_of, json_values
from tests.llg_harness import accepts
from tests.llg_harness import byte_vocabulary as bytes_only

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


# ---- the baseline's text_without ------------------------------------------------------------------------


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


# ---- JSON Schema: the llguidance grammar and the baseline's regex ------------------------


def answer(schema: dict[str, Any]) -> Callable[[str], bool]:
    """Whether the response_format grammar of `schema` admits a text."""
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    c = constraints.build("hermes", None, None, None, rf, bytes_only())
    assert c is not None
    return lambda text: accepts(c.grammar, text)


def regex_of(schema: dict[str, Any]) -> Callable[[str], bool]:
    rx = schema_regex(schema)
    return lambda text: full(rx, text)


ENGINES = [pytest.param(answer, id="llguidance"), pytest.param(regex_of, id="baseline-regex")]


@given(json_values(max_leaves=6))
@settings(max_examples=100, deadline=None)
def test_inferred_schema_accepts_json_dumps_of_its_value(value: Any) -> None:
    assume(largest_float(value) < 1e308)  # the parser's float range (see test_agreement's xfail)
    assume("\x7f" not in json.dumps(value, ensure_ascii=False))  # test_strings_admit_a_raw_delete's xfail
    schema = {"type": "object", "properties": {"v": _schema_of(value)}, "required": ["v"]}
    assert answer(schema)(json.dumps({"v": value}, ensure_ascii=False))
    if depth(value) <= GENERIC_DEPTH + 1:  # the baseline: the typed level plus its free-form bound
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
@pytest.mark.parametrize("engine", ENGINES)
def test_schema_grammar_accepts_valid(value: dict[str, Any], engine: Callable[..., Any]) -> None:
    jsonschema.validate(value, SCHEMA)
    assert engine(SCHEMA)(json.dumps(value, ensure_ascii=False))


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
@pytest.mark.parametrize("engine", ENGINES)
def test_schema_grammar_rejects_invalid(value: dict[str, Any], engine: Callable[..., Any]) -> None:
    assert not engine(SCHEMA)(json.dumps(value, ensure_ascii=False))


@pytest.mark.parametrize("engine", ENGINES)
def test_strings_refuse_lone_surrogate_escapes_and_raw_controls(engine: Callable[..., Any]) -> None:
    ok = engine({"type": "object", "properties": {"s": {"type": "string"}}})
    assert ok('{"s": "\\n\\""}') and ok('{"s": "é"}')
    assert not ok('{"s": "\\ud800"}')
    assert not ok('{"s": "a\nb"}')


def test_the_baseline_regex_admits_unicode_escapes() -> None:
    assert regex_of({"type": "object", "properties": {"s": {"type": "string"}}})('{"s": "\\u00e9\\n"}')


@pytest.mark.xfail(
    strict=True,
    reason="llguidance 1.7.6's %json strings admit no \\uXXXX escape at all (json.dumps' default ensure_ascii "
    "output, Jinja's tojson \\u003c), which the parser and the regex grammars read",
)
def test_strings_admit_unicode_escapes() -> None:
    ok = answer({"type": "object", "properties": {"s": {"type": "string"}}})
    assert ok('{"s": "\\u00e9\\n"}') and ok('{"s": "\\ud83d\\ude00"}')


@pytest.mark.xfail(
    strict=True,
    reason="llguidance 1.7.6's %json strings refuse a raw DEL (0x7f), which JSON allows unescaped and json.dumps "
    "writes raw",
)
def test_strings_admit_a_raw_delete() -> None:
    assert answer({"type": "object", "properties": {"s": {"type": "string"}}})('{"s": "a\x7fb"}')


def tool_with(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": schema}}},
    }


@pytest.mark.parametrize(
    ("schema", "keywords"),
    [
        ({"type": "array", "uniqueItems": True}, ["uniqueItems"]),
        ({"not": {"type": "string"}}, ["not"]),
        ({"if": {"type": "string"}, "then": {}}, ["if", "then"]),
        ({"type": "array", "contains": {"type": "integer"}}, ["contains"]),
        ({"type": "object", "dependentRequired": {"a": ["b"]}, "propertyNames": {"maxLength": 2}},
         ["dependentRequired", "propertyNames"]),
    ],
)  # fmt: skip
def test_unenforceable_keywords_are_all_named(schema: dict[str, Any], keywords: list[str]) -> None:
    with pytest.raises(SchemaTooComplexError) as err:
        constraints.build("hermes", [tool_with(schema)], "required", True, None, None)
    for keyword in keywords:
        assert f"tools[0].function.parameters.properties.x.{keyword}" in err.value.message
    assert err.value.status == 400 and err.value.code == "schema_too_complex"


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "integer", "minimum": 0}, "0", "-1"),
        ({"type": "integer", "multipleOf": 2}, "4", "3"),
        ({"type": "object", "patternProperties": {"^a": {"type": "integer"}}, "additionalProperties": False},
         '{"ab": 1}', '{"ab": "x"}'),
        ({"allOf": [{"type": "string"}, {"minLength": 2}]}, '"ab"', '"a"'),
        ({"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, "true", '"x"'),
        ({"type": "string", "pattern": "^a+$"}, '"aa"', '"ab"'),
        ({"type": "string", "maxLength": 100000}, '"a"', "1"),
    ],
)  # fmt: skip
def test_keywords_the_regex_refused_are_enforced(schema: dict[str, Any], good: str, bad: str) -> None:
    c = constraints.build("hermes", [tool_with(schema)], "required", True, None, bytes_only())
    assert c is not None

    def call(x: str) -> str:
        return f'<tool_call>\n{{"name": "f", "arguments": {{"x": {x}}}}}\n</tool_call>'

    assert accepts(c.grammar, call(good)) and not accepts(c.grammar, call(bad))


def test_a_remote_ref_is_a_400_naming_it() -> None:
    with pytest.raises(SchemaTooComplexError) as err:
        constraints.build("hermes", [tool_with({"$ref": "https://example.com/s.json"})], "required", True, None, None)
    assert "https://example.com/s.json" in err.value.message and err.value.status == 400


def test_a_recursive_ref_is_enforced_at_any_depth() -> None:
    ok = answer({"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}})
    assert ok('{"next": {"next": {"v": 1}}}')
    assert ok('{"next": {"next": {"next": {"next": {"next": {}}}}}}')
    assert not ok('{"next": {"next": {"v": "1"}}}')


def test_the_baseline_regex_unrolls_a_recursive_ref_to_a_bound() -> None:
    rx = schema_regex({"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}})
    assert full(rx, '{"next": {"next": {"v": 1}}}')
    assert not full(rx, '{"next": {"next": {"next": {"next": {"next": {}}}}}}')


@pytest.mark.parametrize("engine", ENGINES)
def test_disjoint_one_of_is_enforced(engine: Callable[..., Any]) -> None:
    ok = engine({"type": "object", "properties": {"v": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}})
    assert ok('{"v": "a"}') and ok('{"v": 3}') and not ok('{"v": null}')


# ---- modes -------------------------------------------------------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def grammar(tool_choice: Any, parallel: bool = True, response_format: Any = None, fmt: str = "hermes") -> str:
    c = constraints.build(fmt, [WEATHER, CLOCK], tool_choice, parallel, response_format, bytes_only())
    assert c is not None
    return c.grammar


def test_none_cannot_produce_call_syntax() -> None:
    g = grammar("none")
    assert accepts(g, "It is sunny in Paris.\n<b>ok</b>")
    assert not accepts(g, "Sure: " + CALL)
    assert not accepts(g, "a </tool_call> b")


def test_auto_allows_content_then_calls_from_the_trigger() -> None:
    c = constraints.build("hermes", [WEATHER], "auto", True, None, bytes_only())
    assert c is not None and c.trigger == "<tool_call>"
    assert accepts(c.grammar, "x" + CALL) and accepts(c.grammar, "It is sunny.")
    assert accepts(c.grammar, CALL) and accepts(c.grammar, CALL + "\n" + CALL)
    assert not accepts(c.grammar, "<tool_call>\nhello\n</tool_call>")
    assert not accepts(c.grammar, CALL + " and some text after")
    assert c.ref().trigger == c.trigger and c.ref().key == c.key


def test_auto_with_thinking_keeps_calls_out_of_reasoning() -> None:
    c = constraints.build("hermes", [WEATHER], "auto", True, None, bytes_only(), thinking=True)
    assert c is not None
    assert accepts(c.grammar, "let me see</think>\n\nIt is sunny.")
    assert accepts(c.grammar, "hmm</think>\n\n" + CALL)
    assert not accepts(c.grammar, CALL + "</think>\n\n" + CALL)


def test_required_needs_a_call() -> None:
    g = grammar("required")
    assert accepts(g, CALL) and accepts(g, CALL + "\n" + CALL2)
    assert not accepts(g, "") and not accepts(g, "I will not call.")


def test_named_allows_only_that_tool_once() -> None:
    g = grammar(NAMED)
    assert accepts(g, CALL2)
    assert not accepts(g, CALL) and not accepts(g, CALL2 + "\n" + CALL2)


def test_not_parallel_means_exactly_one_call() -> None:
    g = grammar("required", parallel=False)
    assert accepts(g, CALL) and not accepts(g, CALL + "\n" + CALL2)


def test_response_format_json_schema() -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {
            "name": "r",
            "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        },
    }
    c = constraints.build("hermes", None, None, None, rf, bytes_only())
    assert c is not None and c.mode == "response_format"
    assert accepts(c.grammar, '{"ok": true}') and not accepts(c.grammar, '{"ok": 1}') and not accepts(c.grammar, "ok")
    c2 = constraints.build("hermes", None, None, None, {"type": "json_object"}, bytes_only())
    assert c2 is not None and accepts(c2.grammar, '{"a": [1, null], "b": {"c": "d"}}')
    assert not accepts(c2.grammar, "[1]")


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


def byte_vocabulary() -> constraints.LlgVocabulary:
    """Bytes plus a few multi-byte tokens (a call is also written in them), EOS 300."""
    tokens: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256)}
    for i, word in enumerate([b"<tool_call>", b'"name"', b"get_weather", b"</tool_call>", b"\n"]):
        tokens.setdefault(word, []).append(256 + i)
    return constraints.vocabulary(tokens, eos_token_id=300)


def consumes(grammar: str, ids: list[int], vocab: constraints.LlgVocabulary) -> bool:
    m = matcher(grammar, vocab)
    return all(m.consume_token(t) for t in ids) and bool(m.consume_token(vocab.eos_token_id))


def test_a_grammar_takes_multi_byte_tokens_and_is_cached() -> None:
    vocab = byte_vocabulary()
    c = constraints.build("hermes", [WEATHER], "required", False, None, vocab)
    assert c is not None
    assert consumes(c.grammar, [256, *CALL.encode()[len(b"<tool_call>") :]], vocab)
    assert consumes(c.grammar, list(CALL.encode()), vocab)  # the same text in bytes
    assert not consumes(c.grammar, list(b"<tool_cal>"), vocab)
    again = constraints.build("hermes", [WEATHER], "required", False, None, vocab)
    assert again is c


@pytest.mark.parametrize("text", [CALL + "\n" + CALL2, "It is " + CALL])
def test_a_second_call_and_a_call_after_content_follow_an_accepting_point(text: str) -> None:
    c = constraints.build("hermes", [WEATHER, CLOCK], "auto", True, None, byte_vocabulary(), thinking=True)
    assert c is not None and consumes(c.grammar, list(("x</think>\n\n" + text).encode()), byte_vocabulary())


@pytest.mark.parametrize("fmt", ["hermes", "dsml-v4", "dsml-v3.2", "qwen3-xml", "llama3-json", "mistral"])
@pytest.mark.parametrize("thinking", [None, False, True])
@pytest.mark.parametrize("choice", ["none", "auto", "required", NAMED])
def test_every_mode_compiles(fmt: str, thinking: bool | None, choice: Any) -> None:
    c = constraints.build(fmt, [WEATHER, CLOCK], choice, True, None, byte_vocabulary(), thinking=thinking)
    assert c is not None and not matcher(c.grammar, byte_vocabulary()).is_error()
    if choice in ("required", NAMED) or (thinking is True and get_format(fmt).reasoning_close):
        assert not accepts(c.grammar, "")  # a call, or the opened block's close, must be written


def test_raw_vocabulary_needs_the_eos_id() -> None:
    tokens = {bytes([b]): [b] for b in range(256)}
    with pytest.raises(TypeError, match="eos_token_id"):
        constraints.build("hermes", [WEATHER], "required", True, None, tokens)
    c = constraints.build("hermes", [WEATHER], "required", True, None, tokens, eos_token_id=256)
    assert c is not None and accepts(c.grammar, CALL)


async def test_build_async_compiles_off_the_loop() -> None:
    c = await constraints.build_async("hermes", [WEATHER], "required", True, None, byte_vocabulary())
    assert c is not None and c.mode == "required"


async def test_build_async_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request gets its 400 at the time limit while the compile still runs: the check
    is held until the request has answered (no wall-clock assertion)."""
    release = threading.Event()
    real = constraints.check

    def held(*args: Any) -> Any:
        release.wait(30)
        return real(*args)

    monkeypatch.setattr(constraints, "check", held)
    fresh = {"type": "function", "function": {"name": "time_limit_test"}}  # in no cache yet
    try:
        with pytest.raises(SchemaTooComplexError, match=r"within 0\.05 s"):
            await constraints.build_async("hermes", [fresh], "required", True, None, byte_vocabulary(), timeout_s=0.05)
        assert not release.is_set()  # answered while its compile was still held
    finally:
        release.set()
    while constraints._POOL.busy:  # the worker ends before the loop closes
        await asyncio.sleep(0.01)
