"""qwen3-xml values on the llguidance Lark engine: typed as the parser reads them.

The tables of the regex grammar's typing tests (test_qwen3_optional_params.py,
test_qwen3_enum_params.py) hold here too: every value the template renders is admitted and
read back as written, every raw text the parser reads into an invalid argument is refused.
Beyond them: bounded numbers, raw-string pattern/minLength/maxLength/format, parameters in
any order, root unions as parameter sets, and the keywords refused by name. Grammars are
read over a byte vocabulary (tests/llg_harness.py); the parser and a Draft 2020-12 validator
are the real ones.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from callgate.constraints.lark_grammar import lark_grammar
from callgate.constraints.llg import check
from callgate.constraints.request import grammar_request
from callgate.errors import SchemaTooComplexError
from callgate.parsers import parse
from tests import test_qwen3_enum_params as enums
from tests import test_qwen3_optional_params as optional
from tests.llg_harness import accepts, byte_vocabulary, sample
from tests.test_schema_agreement import call_text, parsed, tools

FMT = "qwen3-xml"


def grammar(params: Mapping[str, Any], choice: Any = "required") -> str:
    req = grammar_request(FMT, tools(params), choice, False, None)
    assert req is not None
    return lark_grammar(req)


def valid(params: Mapping[str, Any], arguments: Any) -> bool:
    return arguments is not None and Draft202012Validator(params).is_valid(arguments)


def qwen_call(*params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


def agrees(params: Mapping[str, Any], text: str, g: str | None = None) -> bool:
    """The grammar admits `text` exactly when the parser reads it into valid arguments;
    returns whether it does."""
    admitted = accepts(g or grammar(params), text)
    assert admitted == valid(params, parsed(FMT, params, text)), text
    return admitted


# ---- the regex grammar's typing tables -------------------------------------------------------

TABLES: list[tuple[str, dict[str, Any], Any]] = [
    *((f"optional-{n}-{i}", prop, w) for n, (prop, vals) in optional.CASES.items() for i, (w, _) in enumerate(vals)),
    *((f"enum-{n}-{i}", prop, v) for n, (prop, vals) in enums.CASES.items() for i, v in enumerate(vals)),
]


@pytest.mark.parametrize(("prop", "written"), [(p, w) for _, p, w in TABLES], ids=[n for n, _, _ in TABLES])
def test_a_rendered_value_is_admitted_and_read_back_valid(prop: dict[str, Any], written: Any) -> None:
    params = optional.params_of(prop)
    text = call_text(FMT, params, {"a": written})
    assert accepts(grammar(params), text), text
    assert valid(params, parsed(FMT, params, text)), text


MISSES = [
    *((optional.CASES[n][0], raw) for n, raws in optional.NEAR_MISSES.items() for raw in raws),
    *((enums.CASES[n][0], raw) for n, raws in enums.NEAR_MISSES.items() for raw in raws),
]


@pytest.mark.parametrize(("prop", "raw"), MISSES, ids=[f"{json.dumps(p)[:40]}-{r!r}" for p, r in MISSES])
def test_a_value_read_as_invalid_is_refused(prop: dict[str, Any], raw: str) -> None:
    params = optional.params_of(prop)
    assert not valid(params, parsed(FMT, params, qwen_call(("a", raw)))), raw
    assert not accepts(grammar(params), qwen_call(("a", raw))), raw


def test_a_raw_string_another_type_reads_is_written_only_when_valid() -> None:
    g = grammar(optional.GUARDED)
    for param, raw, written in [
        ("e", "1", True), ("e", "3", False), ("e", "abc", True), ("e", "", True),
        ("p", '{"x": 1, "y": 2}', True), ("p", '{"x": 1}', False), ("p", "abcd", True), ("p", "abcde", False),
        ("b", "true", True), ("b", "yes", True), ("b", "false", False), ("b", "no", False),
        ("l", "abc", True), ("l", "12345", True), ("l", "5", False),
        ("t", "1", True), ("t", "a", True), ("t", "2", False),
    ]:  # fmt: skip
        assert agrees(optional.GUARDED, qwen_call((param, raw)), g) == written, (param, raw)
    shadowed = grammar(enums.SHADOWED)
    for raw, written in (("1", True), ("x", True), ("2", False)):
        assert agrees(enums.SHADOWED, qwen_call(("a", raw)), shadowed) == written, raw


def test_a_cyclic_branch_is_typed_finitely() -> None:
    """`A: anyOf [$ref A, integer, null]`: no validator decides it (jsonschema recurses
    forever), so the grammar leaves out `None`, which it would have to ask one about; an
    integer it takes by its syntax."""
    g = grammar(optional.CYCLIC)
    assert accepts(g, qwen_call(("a", "4")))
    assert parsed(FMT, optional.CYCLIC, qwen_call(("a", "4"))) == {"a": 4}
    assert not accepts(g, qwen_call(("a", "None")))
    assert not accepts(g, qwen_call(("a", "x")))


@pytest.mark.parametrize("params", [optional.ALL, enums.ALL], ids=["optional", "enum"])
def test_samples_of_the_typing_tables_parse_valid(params: dict[str, Any]) -> None:
    g = grammar(params)
    rng = random.Random(3)
    for i in range(15):
        text = sample(g, rng, max_bytes=600 + 100 * (i % 3), format=FMT)
        arguments = parsed(FMT, params, text)
        assert arguments is not None, text
        assert valid(params, arguments), (text, arguments)


# ---- bounds, patterns, lengths, formats ------------------------------------------------------

BOUNDED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "m": {"type": "integer", "multipleOf": 5, "minimum": 0},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "tag": {"type": "string", "pattern": "ab"},
        "word": {"type": "string", "minLength": 2, "maxLength": 4},
        "day": {"type": "string", "format": "date"},
        "dir": {"type": "string", "pattern": "^/usr/[a-z]+\n?$"},
        "id": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^id-"}]},
    },
}
BOUNDED_CASES = [
    ("n", "1", True), ("n", "10", True), ("n", "0", False), ("n", "11", False), ("n", "5.0", False),
    ("x", "0.5", True), ("x", "0", False), ("x", "1", False), ("x", "-0.5", False), ("x", "1e-3", False),
    ("m", "15", True), ("m", "0", True), ("m", "7", False),
    ("code", "ABC", True), ("code", "ABCD", False), ("code", "abc", False), ("code", "", False),
    ("tag", "xxabyy", True), ("tag", "ab", True), ("tag", "ba", False),
    ("word", "ab", True), ("word", "abcd", True), ("word", "a", False), ("word", "abcde", False),
    ("word", "日本", True), ("word", "日本語漢字", False),
    ("day", "2025-02-28", True), ("day", "2025-13-01", False), ("day", "tomorrow", False),
    ("dir", "/usr/bin", True), ("dir", "/usr/", False), ("dir", "x/usr/bin", False),
    ("id", "7", True), ("id", "id-7", True), ("id", "-7", False), ("id", "x-7", False),
]  # fmt: skip


@pytest.mark.parametrize(("param", "raw", "admitted"), BOUNDED_CASES)
def test_bounds_patterns_and_lengths_are_enforced(param: str, raw: str, admitted: bool) -> None:
    text = qwen_call((param, raw))
    if admitted:  # the grammar may be stricter than the schema (`1e-3`), never wider
        assert agrees(BOUNDED, text)
    else:
        assert not accepts(grammar(BOUNDED), text), raw


def test_parameters_come_in_any_order_each_once() -> None:
    params = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
        "required": ["a", "c"],
        "maxProperties": 2,
    }
    g = grammar(params)
    assert agrees(params, qwen_call(("c", "True"), ("a", "1")), g)
    assert agrees(params, qwen_call(("a", "1"), ("c", "false")), g)
    assert not accepts(g, qwen_call(("a", "1"), ("b", "x"), ("c", "true")))  # maxProperties
    assert not accepts(g, qwen_call(("a", "1"), ("a", "2"), ("c", "true")))
    assert not accepts(g, qwen_call(("a", "1")))


# ---- root unions -----------------------------------------------------------------------------

PETS: dict[str, Any] = {  # pydantic: Union[Cat, Dog] with a discriminator, as the tool's parameters
    "anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
    "$defs": {
        "Cat": {
            "type": "object",
            "properties": {"kind": {"const": "cat"}, "name": {"type": "string"}},
            "required": ["kind", "name"],
            "additionalProperties": False,
        },
        "Dog": {
            "type": "object",
            "properties": {"kind": {"const": "dog"}, "bark": {"enum": ["loud", "soft"]}},
            "required": ["kind"],
            "additionalProperties": False,
        },
    },
}
SHARED: dict[str, Any] = {
    "type": "object",
    "properties": {"owner": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["owner"],
    "oneOf": [
        {
            "properties": {"mode": {"const": "a"}, "text": {"type": "string", "maxLength": 3}},
            "required": ["mode", "text"],
        },
        {"properties": {"mode": {"const": "b"}, "count": {"type": "integer"}}, "required": ["mode"]},
    ],
}


@pytest.mark.parametrize(
    ("params", "text", "admitted"),
    [
        (PETS, qwen_call(("kind", "cat"), ("name", "Tom")), True),
        (PETS, qwen_call(("kind", "dog")), True),
        (PETS, qwen_call(("bark", "soft"), ("kind", "dog")), True),
        (PETS, qwen_call(("kind", "cat")), False),  # Cat needs a name
        (PETS, qwen_call(("kind", "dog"), ("name", "Rex")), False),  # Dog is closed
        (PETS, qwen_call(("kind", "cow"), ("name", "Tom")), False),
        (SHARED, qwen_call(("owner", "me"), ("mode", "a"), ("text", "hey")), True),
        (SHARED, qwen_call(("age", "4"), ("mode", "b"), ("owner", "me")), True),
        (SHARED, qwen_call(("owner", "me"), ("mode", "a")), False),
        (SHARED, qwen_call(("owner", "me"), ("mode", "a"), ("text", "long")), False),
        (SHARED, qwen_call(("mode", "b")), False),
        (SHARED, qwen_call(("owner", "me"), ("mode", "b"), ("count", "2")), False),  # see below
    ],
)
def test_a_root_union_is_served_as_parameter_sets(params: dict[str, Any], text: str, admitted: bool) -> None:
    if admitted:
        assert agrees(params, text)
    else:
        assert not accepts(grammar(params), text), text


def test_a_typed_parameter_only_a_branch_declares_cannot_be_written() -> None:
    """The parser types a value by the root's `properties` only: a name only the branch
    declares is raw text, so `count: 2` would be read as the string "2"."""
    arguments = parsed(FMT, SHARED, qwen_call(("owner", "me"), ("mode", "b"), ("count", "2")))
    assert arguments is not None and arguments["count"] == "2" and not valid(SHARED, arguments)


@pytest.mark.parametrize("params", [PETS, SHARED], ids=["pets", "shared"])
def test_samples_of_a_root_union_parse_valid(params: dict[str, Any]) -> None:
    g = grammar(params)
    rng = random.Random(5)
    for i in range(12):
        text = sample(g, rng, max_bytes=500 + 100 * (i % 3), format=FMT)
        result = parse(FMT, text + "<|im_end|>", tools(params))
        assert result.diagnostics == (), text
        [cand] = result.candidates
        assert valid(params, cand.arguments), (text, cand.arguments)


# ---- refusals --------------------------------------------------------------------------------


def test_every_keyword_the_grammar_cannot_enforce_is_named() -> None:
    params = {
        "type": "object",
        "properties": {"a": {"type": "string", "not": {"const": "x"}}, "b": {"if": {"type": "integer"}}},
    }
    with pytest.raises(SchemaTooComplexError) as err:
        grammar(params)
    assert "properties.a.not" in str(err.value) and "properties.b.if" in str(err.value)


@pytest.mark.parametrize(
    "params",
    [
        {"type": "object", "properties": {"a b": {"type": "string"}}, "required": ["a b"]},
        {"type": "object", "properties": {"a": {"enum": ["x</function>y"]}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}, "required": ["a"]},
    ],
    ids=["name", "marker-in-enum", "empty"],
)
def test_a_tool_whose_call_cannot_be_written_is_refused(params: dict[str, Any]) -> None:
    with pytest.raises(SchemaTooComplexError):
        check(grammar(params), byte_vocabulary(), None)


def test_a_json_value_holds_no_marker_the_parser_would_stop_at() -> None:
    params = {
        "type": "object",
        "properties": {"notes": {"type": "array", "items": {"type": "string"}}, "doc": {"$ref": "#/$defs/Doc"}},
        "$defs": {"Doc": {"type": "object", "properties": {"html": {"type": ["string", "null"], "pattern": "b"}}}},
    }
    g = grammar(params)
    assert agrees(params, qwen_call(("notes", '["a</b> <t> <|x", "<"]')), g)
    assert agrees(params, qwen_call(("doc", '{"html": "<b>"}')), g)
    for marker in ("</function>", "<tool_call>", "</tool_call>", "<|im_end|>"):
        assert not accepts(g, qwen_call(("notes", json.dumps([f"x{marker}y"])))), marker
        assert not accepts(g, qwen_call(("doc", json.dumps({"html": f"b{marker}"})))), marker
        assert parse(FMT, qwen_call(("notes", json.dumps([marker]))) + "<|im_end|>", tools(params)).diagnostics


def test_a_closed_root_union_keeps_to_what_closes_it() -> None:
    """`unevaluatedProperties: false` (what strict tools get) sees the branches' names;
    `additionalProperties: false` only the root's, so no branch of SHARED can be written."""
    strict = {**SHARED, "unevaluatedProperties": False}
    g = grammar(strict)
    assert agrees(strict, qwen_call(("owner", "me"), ("mode", "a"), ("text", "hey")), g)
    assert not accepts(g, qwen_call(("owner", "me"), ("mode", "a"), ("text", "hey"), ("extra", "1")))
    with pytest.raises(SchemaTooComplexError):
        grammar({**SHARED, "additionalProperties": False})


def test_a_function_name_the_parser_cannot_read_is_refused() -> None:
    req = grammar_request(FMT, [{"type": "function", "function": {"name": "get weather"}}], "required", False, None)
    assert req is not None
    with pytest.raises(SchemaTooComplexError) as err:
        lark_grammar(req)
    assert err.value.param == "tools[0].function.name"
