"""Keywords of the JSON-Schema grammar: `prefixItems` (tuple validation) agrees with a Draft
2020-12 validator, and every refusal names what the grammar enforces.

* For item schemas the grammar enforces exactly, `json.dumps` of an array matches the
  regex exactly when the validator accepts the array (accepted and near-miss alike);
* texts sampled from a compiled grammar (random walks over the outlines-core Index)
  validate, also with free-form items and a strict tool's closed objects;
* through the app, a `response_format` with `prefixItems` is no longer a 400;
* a keyword the grammar knows, used in a form it cannot enforce exactly, is refused with
  the same message shape as an unknown one.
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
from callgate.constraints.json_schema import MAX_PREFIX_ITEMS, schema_regex
from callgate.errors import SchemaTooComplexError
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.serving.app import create_app
from callgate.serving.fake_engine import FakeEngine
from callgate.serving.validation import JsonSchemaValidator
from tests.test_server_app import MODEL, make_settings
from tests.test_strict_grammar import ByteSampler, byte_vocabulary

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
def test_regex_matches_exactly_the_valid_arrays(schema: dict[str, Any], value: list[Any]) -> None:
    rx = schema_regex(schema)
    valid = Draft202012Validator(schema).is_valid(value)
    for text in (json.dumps(value, ensure_ascii=False), json.dumps(value, separators=(",", ":"))):
        assert (re.fullmatch(rx, text) is not None) == valid, (text, valid)


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
    good = [[1, 2]] if schema.get("minItems") else [[], [1], [1, 2]]
    for value in good:
        assert re.fullmatch(rx, json.dumps(value)), value
    for text in near_misses:
        assert not re.fullmatch(rx, text), text


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
    assert c is not None and c.index is not None
    sampler = ByteSampler(c.index, seed=11)
    for i in range(40):
        text = sampler.sample(budget=20 + (i % 8) * 25)
        result = parse("hermes", text + get_format("hermes").eos, tools)
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
    assert sent is not None and not re.fullmatch(sent.regex, '{"g": [1, "x"]}')


def test_prefix_items_length_is_bounded() -> None:
    def tool(n: int) -> dict[str, Any]:
        tuple_ = {"type": "array", "prefixItems": [INT] * n, "items": False}
        parameters = {"type": "object", "properties": {"t": tuple_}}
        return {"type": "function", "function": {"name": "f", "parameters": parameters}}

    c = constraints.build("qwen3-xml", [tool(MAX_PREFIX_ITEMS)], "required", False, None, byte_vocabulary())
    assert c is not None and c.index is not None
    with pytest.raises(SchemaTooComplexError, match=f"'prefixItems' .* more than {MAX_PREFIX_ITEMS} entries"):
        constraints.build("qwen3-xml", [tool(MAX_PREFIX_ITEMS + 1)], "required", False, None, None)


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
def test_refusals_name_what_the_grammar_enforces(schema: dict[str, Any], keyword: str) -> None:
    with pytest.raises(SchemaTooComplexError) as err:
        schema_regex({"type": "object", "properties": {"x": schema}})
    message = err.value.message
    assert message.startswith(f"schema keyword {keyword!r} at properties.x"), message
    assert err.value.param == "properties.x"
    assert "is not supported by the grammar, which enforces $ref, additionalProperties, allOf" in message
    assert "prefixItems" in message and "unevaluatedProperties" in message
