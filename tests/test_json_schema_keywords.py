"""Keywords of the JSON-Schema grammar: `prefixItems` (tuple validation) agrees with a Draft
2020-12 validator, and every refusal names every keyword the grammar cannot enforce.

* For item schemas, `json.dumps` of an array is admitted by the llguidance grammar (and
  matched by the baseline regex) exactly when the validator accepts the array;
* texts sampled from a grammar (random walks, tests/llg_harness.py) validate, also with
  free-form items and a strict tool's closed objects;
* through the app, a `response_format` with `prefixItems` is served;
* keywords outside lark_schema.ENFORCED (`not`, `uniqueItems`, `if`, ...) are refused with
  one 400 naming every one of them, with its place; the baseline regex's refusals keep
  their message shape.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import callgate.constraints as constraints
from benchmarks.regex_baseline.json_schema import MAX_PREFIX_ITEMS, schema_regex
from callgate.constraints.lark_schema import ENFORCED
from callgate.errors import SchemaTooComplexError
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.handoff.validation import JsonSchemaValidator
from tests.test_agreement import known_number_range
from tests.test_server_app import MODEL, make_settings
from tests.test_strict_grammar import ByteSampler, accepts, byte_vocabulary

INT, STR, NULL, BOOL = {"type": "integer"}, {"type": "string"}, {"type": "null"}, {"type": "boolean"}
EXACT = [
    {"type": "array", "prefixItems": [INT, STR]},
    {"type": "array", "prefixItems": [INT, STR], "items": False},
    {"type": "array", "prefixItems": [INT, STR], "items": BOOL, "minItems": 3},
    {"type": "array", "prefixItems": [INT, STR], "maxItems": 1},
    {"type": "array", "prefixItems": [NULL, False]},
    {"type": "array", "prefixItems": [INT], "items": NULL, "minItems": 1, "maxItems": 3},
    {"type": "array", "prefixItems": [{"enum": [1, "a"]}, INT, INT], "items": False, "minItems": 2},
]
ELEMENTS = st.one_of(st.integers(-3, 3), st.booleans(), st.none(), st.text(alphabet='ab"\\é', max_size=3))


@pytest.mark.parametrize("schema", EXACT, ids=[json.dumps(s) for s in EXACT])
@given(value=st.lists(ELEMENTS, max_size=5))
@settings(max_examples=150, deadline=None)
def test_grammar_admits_exactly_the_valid_arrays(schema: dict[str, Any], value: list[Any]) -> None:
    grammar = answer(schema)
    valid = Draft202012Validator(schema).is_valid(value)
    text = json.dumps(value, ensure_ascii=False)  # the formats' separators: ", " and ": "
    assert accepts(grammar, text) == valid, (text, valid)
    rx = schema_regex(schema)  # the baseline, also with compact separators
    for text in (json.dumps(value, ensure_ascii=False), json.dumps(value, separators=(",", ":"))):
        assert (re.fullmatch(rx, text) is not None) == valid, (text, valid)


def answer(schema: dict[str, Any]) -> str:
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    c = constraints.build("hermes", None, None, None, rf, byte_vocabulary())
    assert c is not None
    return c.grammar


@pytest.mark.parametrize(
    ("schema", "near_misses"),
    [
        ({"prefixItems": [{"type": "number"}, {"type": "number"}]}, ['[1, "a"]', '["a"]', "[1, 2, {"]),
        ({"prefixItems": [{"type": "number"}, {"type": "number"}], "items": False}, ["[1, 2, 3]", '[1, "2"]']),
        ({"prefixItems": [{"type": "number"}], "minItems": 2, "maxItems": 2}, ["[1]", "[1, 2, 3]", "[]"]),
    ],
)
def test_the_reported_schemas_compile_and_refuse_near_misses(schema: dict[str, Any], near_misses: list[str]) -> None:
    rx = schema_regex({"type": "array", **schema})
    grammar = answer({"type": "array", **schema})
    good = [[1, 2]] if schema.get("minItems") else [[], [1], [1, 2]]
    for value in good:
        assert re.fullmatch(rx, json.dumps(value)) and accepts(grammar, json.dumps(value)), value
    for text in near_misses:
        assert not re.fullmatch(rx, text) and not accepts(grammar, text), text


SAMPLED = {
    "type": "object",
    "properties": {
        "pair": {"type": "array", "prefixItems": [INT, {"type": "string", "maxLength": 3}]},
        "head": {
            "type": "array",
            "prefixItems": [
                {"type": "object", "additionalProperties": {"type": ["string", "boolean"]}},
                {"type": "object"},
                {"type": ["array", "null"], "items": INT},
            ],
            "items": BOOL,
        },
        "tuple": {"type": "array", "prefixItems": [NULL, {"enum": ["x", 2]}], "items": False, "minItems": 1},
    },
    "required": ["pair", "head", "tuple"],
}


@pytest.mark.parametrize("strict", [False, True])
def test_sampled_texts_validate(strict: bool) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": SAMPLED}}
    tools = None
    if strict:
        fn = {"name": "f", "strict": True, "parameters": SAMPLED}
        tools, response_format = [{"type": "function", "function": fn}], None
    c = constraints.build("hermes", tools, "required" if strict else None, False, response_format, byte_vocabulary())
    assert c is not None
    sampler = ByteSampler(c.grammar, seed=11, format="hermes")
    for i in range(40):
        text = sampler.sample(budget=20 + (i % 8) * 25)
        result = parse("hermes", text + get_format("hermes").eos, tools)
        if known_number_range(result):
            continue
        assert result.diagnostics == (), (text, result.diagnostics)
        if strict:
            [call] = result.candidates
            assert JsonSchemaValidator().errors(SAMPLED, call.arguments, strict=True) == [], text
        else:
            assert result.content is not None
            Draft202012Validator(SAMPLED).validate(json.loads(result.content))


async def test_response_format_with_prefix_items_is_served() -> None:
    schema = {"type": "object", "properties": {"g": {"type": "array", "prefixItems": [{"type": "number"}] * 2}}}
    engine = FakeEngine(replies=['{"g": [1, 2.5]}'])
    app = create_app(make_settings(), engine=engine, validator=JsonSchemaValidator())
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.json()["choices"][0]["message"]["content"]) == {"g": [1, 2.5]}
    sent = engine.requests[0].constraint
    assert sent is not None and accepts(sent.plain, '{"g": [1, 2.5]}') and not accepts(sent.plain, '{"g": [1, "x"]}')


def test_long_prefix_items_compile_where_the_baseline_bounded_them() -> None:
    n = 2 * MAX_PREFIX_ITEMS
    tuple_ = {"type": "array", "prefixItems": [INT] * n, "items": False}
    grammar = answer(tuple_)
    assert accepts(grammar, json.dumps(list(range(n)))) and not accepts(grammar, json.dumps(list(range(n + 1))))
    schema_regex({"type": "array", "prefixItems": [INT] * MAX_PREFIX_ITEMS, "items": False})
    with pytest.raises(SchemaTooComplexError, match=f"'prefixItems' .* more than {MAX_PREFIX_ITEMS} entries"):
        schema_regex(tuple_)


def test_every_unenforceable_keyword_is_named_in_one_400() -> None:
    params = {
        "type": "object",
        "properties": {
            "a": {"type": "array", "uniqueItems": True, "contains": {"type": "integer"}},
            "b": {"not": {"type": "string"}},
            "c": {"anyOf": [{"type": "string"}, {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {}}]},
            "d": {"type": "integer", "minimum": 0, "maximum": 9, "multipleOf": 3},  # enforced
        },
        "dependentRequired": {"a": ["b"]},
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    with pytest.raises(SchemaTooComplexError) as err:
        constraints.build("hermes", [tool], "required", True, None, None)
    at = "tools[0].function.parameters"
    named = [
        f"{at}.properties.a.uniqueItems",
        f"{at}.properties.a.contains",
        f"{at}.properties.b.not",
        f"{at}.properties.c.anyOf[1].if",
        f"{at}.properties.c.anyOf[1].then",
        f"{at}.properties.c.anyOf[1].else",
        f"{at}.dependentRequired",
    ]
    message = err.value.message
    assert all(n in message for n in named), message
    assert not any(f"properties.d.{k}" in message for k in ("minimum", "maximum", "multipleOf"))
    assert (err.value.status, err.value.code, err.value.param) == (400, "schema_too_complex", f"{at}.properties.a")
    assert all(k in message for k in ENFORCED)  # it says what it does enforce


async def test_an_unenforceable_keyword_through_the_app_is_a_400_naming_it() -> None:
    app = create_app(make_settings(), engine=FakeEngine(replies=["hi"]), validator=JsonSchemaValidator())
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "schema_too_complex" and "properties.tags.uniqueItems" in error["message"]


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"allOf": [{"type": "string"}, {"minLength": 2}]}, "allOf"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"$ref": "#/$defs/a", "type": "string", "$defs": {"a": {}}}, "$ref"),
        ({"$ref": "https://example.com/s.json"}, "$ref"),
        ({"enum": [1], "minLength": 1}, "enum"),
        ({"type": "object", "unevaluatedProperties": {"type": "string"}}, "unevaluatedProperties"),
        ({"type": "integer", "minimum": 0}, "minimum"),
    ],
)
def test_baseline_refusals_name_what_the_regex_enforces(schema: dict[str, Any], keyword: str) -> None:
    with pytest.raises(SchemaTooComplexError) as err:
        schema_regex({"type": "object", "properties": {"x": schema}})
    message = err.value.message
    assert message.startswith(f"schema keyword {keyword!r} at properties.x"), message
    assert err.value.param == "properties.x"
    assert "is not supported by the grammar, which enforces $ref, additionalProperties, allOf" in message
    assert "prefixItems" in message and "unevaluatedProperties" in message
