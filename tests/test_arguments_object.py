"""Function arguments are always a JSON object, whatever the parameter schema admits
besides: the JSON-call grammars (hermes, llama3-json, mistral) on llguidance, read by the
real parser, and the request checks through the real app."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

import callgate.constraints as constraints
from callgate import parsers
from callgate.errors import SchemaTooComplexError
from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from tests import llg_harness
from tests.llg_harness import byte_vocabulary
from tests.test_server_app import MODEL, Harness, SchemaCheck, make_settings

JSON_FORMATS = ["hermes", "llama3-json", "mistral"]
# no `type`: any object (`minLength` applies to strings only, so it does not narrow it to them)
NO_TYPE = [{}, {"description": "takes no arguments"}, {"minLength": 1}]


def tool(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": dict(parameters)}}


def call(fmt: str, arguments: str) -> str:
    """One call to `f` exactly as the format's template writes it, with raw arguments text."""
    if fmt == "hermes":
        return '<tool_call>\n{"name": "f", "arguments": ' + arguments + "}\n</tool_call>"
    if fmt == "mistral":
        return '[TOOL_CALLS][{"name": "f", "arguments": ' + arguments + "}]"
    return '{"name": "f", "parameters": ' + arguments + "}"


def accepts(c: constraints.Constraint | str, text: str) -> bool:
    return llg_harness.accepts(c if isinstance(c, str) else c.grammar, text)


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@pytest.mark.parametrize("parameters", NO_TYPE, ids=["empty", "annotated", "string-keyword"])
def test_untyped_parameters_admit_only_objects(fmt: str, parameters: Mapping[str, Any]) -> None:
    c = constraints.build(fmt, [tool(parameters)], "required", False, None, byte_vocabulary())
    assert c is not None
    for not_object in ['[123, "sample_data1", 234, 345]', '"x"', "7", "null", "true"]:
        assert not accepts(c, call(fmt, not_object)), not_object
    for obj in ["{}", '{"n": 1}']:
        assert accepts(c, call(fmt, obj)), obj
        result = parsers.parse(fmt, call(fmt, obj), [tool(parameters)])
        assert result.diagnostics == () and [x.arguments for x in result.candidates] == [json.loads(obj)]


@pytest.mark.parametrize(
    "schema",
    [
        {
            "anyOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "string"},
            ]
        },
        {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"type": "array"}]},
        {
            "$ref": "#/$defs/A",
            "$defs": {"A": {"type": ["object", "string"], "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        },
        {"enum": [{"a": 1}, "a", 1]},
    ],
    ids=["anyOf", "oneOf", "ref", "enum"],
)
def test_combined_parameters_keep_only_their_object_branches(schema: Mapping[str, Any]) -> None:
    c = constraints.build("hermes", [tool(schema)], "required", False, None, byte_vocabulary())
    assert c is not None and accepts(c, call("hermes", '{"a": 1}'))
    for not_object in ['"a"', "1", "[]", "[1]", "{}"]:
        assert not accepts(c, call("hermes", not_object)), not_object


NO_OBJECT_REASON = (
    "a schema with no object branch reaches llguidance as {type: object, ...}; its refusal reads 'Unsatisfiable "
    "schema: incompatible types' with param 'tools', where the regex engine said 'admits no JSON object' at "
    "tools[0].function.parameters (lark_schema.prepare(object_only=True) would have to tell)"
)


@pytest.mark.xfail(strict=True, reason=NO_OBJECT_REASON)
@pytest.mark.parametrize(
    "schema", [{"anyOf": [{"type": "string"}, {"type": "integer"}]}, {"enum": [1, "a"]}, {"const": 3}]
)
def test_parameters_with_no_object_are_refused(schema: Mapping[str, Any]) -> None:
    with pytest.raises(SchemaTooComplexError, match="admits no JSON object") as exc:
        constraints.build("hermes", [tool(schema)], "required", False, None, None)
    assert exc.value.param == "tools[0].function.parameters"


# ---- through the app ---------------------------------------------------------------------------


def _body(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool(parameters)],
        "tool_choice": "required",
        "max_tokens": 200,
    }


async def _post(replies: list[str], body: Mapping[str, Any]) -> tuple[Harness, httpx.Response]:
    engine, validator = FakeEngine(replies=replies), SchemaCheck()
    app = create_app(make_settings(), engine=engine, validator=validator)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json=dict(body))
        return Harness(engine, validator, client), resp


async def test_empty_parameters_constrain_the_call_to_an_object() -> None:
    h, resp = await _post([call("hermes", "{}")], _body({}))
    assert resp.status_code == 200, resp.text
    [c] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert c["function"] == {"name": "f", "arguments": "{}"}
    sent = h.engine.requests[0].constraint
    assert sent is not None and accepts(sent.plain, call("hermes", '{"a": 1}'))
    assert not accepts(sent.plain, call("hermes", '[123, "sample_data1", 234, 345]'))


async def test_parameters_admitting_no_object_are_a_400_before_generation() -> None:
    for parameters in ({"type": "array"}, {"type": ["string", "null"]}):
        _, resp = await _post([], _body(parameters))
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] == "tools[0].function.parameters" and "'object'" in err["message"]


async def test_a_union_admitting_no_object_is_a_400_before_generation() -> None:
    h, resp = await _post([call("hermes", '"x"')], _body({"anyOf": [{"type": "string"}]}))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "schema_too_complex"
    assert h.engine.requests == []


@pytest.mark.xfail(strict=True, reason=NO_OBJECT_REASON)
async def test_a_union_admitting_no_object_is_refused_by_name() -> None:
    _, resp = await _post([call("hermes", '"x"')], _body({"anyOf": [{"type": "string"}]}))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert "admits no JSON object" in err["message"] and err["param"] == "tools[0].function.parameters"
