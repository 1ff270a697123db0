"""callgate.serving.handoff.validation: the built-in strict JSON-Schema validator, strict tools, the
published envelope and verdict schemas, reading verdicts, and HttpValidator's retry and
fail-closed rules (over httpx's MockTransport; the real-process tests are in
test_validation_downstream.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from callgate.errors import ValidatorUnavailableError
from callgate.serving.handoff.idempotency import conversation_scope
from callgate.serving.handoff.validation import (
    ENVELOPE_SCHEMA,
    VERDICT_SCHEMA,
    HttpValidator,
    JsonSchemaValidator,
    ValidationRequest,
    Verdict,
    envelope_dict,
    idempotency_key,
    parse_verdict,
    pointer,
    strict_schema,
    verdict_dict,
)
from callgate.serving.handoff.validation_http import redact_url

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
SCOPE = conversation_scope([{"role": "user", "content": "Weather in Oslo?"}])
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
}


def request(
    arguments: Any, schema: Any = WEATHER, *, strict: bool = False, tool: str = "get_weather"
) -> ValidationRequest:
    return ValidationRequest(
        request_id="chatcmpl-1",
        call_id="call_1",
        tool=tool,
        arguments=arguments,
        raw="<tool_call>...</tool_call>",
        format="hermes",
        model="m",
        schema=schema,
        constrained=True,
        actor="anonymous",
        scope=SCOPE,
        idempotency_key=idempotency_key("anonymous", tool, arguments if isinstance(arguments, dict) else {}, SCOPE),
        strict=strict,
    )


# ---- the built-in validator -----------------------------------------------------------------


async def test_valid_arguments_are_accepted_unchanged() -> None:
    v = await JsonSchemaValidator().validate(request({"city": "Oslo", "days": 2}))
    assert (v.verdict, v.arguments, v.errors, v.validator) == (
        "accepted",
        {"city": "Oslo", "days": 2},
        (),
        "builtin-jsonschema",
    )


async def test_errors_are_json_pointers_with_the_failing_keyword() -> None:
    v = await JsonSchemaValidator().validate(request({"days": 0}))
    assert v.verdict == "rejected" and v.retryable
    assert sorted((e["path"], e["kind"]) for e in v.errors) == [("", "required"), ("/days", "minimum")]
    assert all(e["message"] for e in v.errors)


async def test_pointer_escapes_slash_and_tilde() -> None:
    schema = {"type": "object", "properties": {"a/b": {"type": "object", "properties": {"~x": {"type": "integer"}}}}}
    v = await JsonSchemaValidator().validate(request({"a/b": {"~x": "no"}}, schema))
    assert [e["path"] for e in v.errors] == ["/a~1b/~0x"]
    assert pointer(["items", 0, "a/b~"]) == "/items/0/a~1b~0" and pointer([]) == ""


async def test_undeclared_tool_is_rejected() -> None:
    v = await JsonSchemaValidator().validate(request({"city": "Oslo"}, None, tool="launch"))
    assert v.verdict == "rejected" and v.retryable
    assert v.errors == (
        {"path": "", "message": "tool 'launch' is not declared in the request", "kind": "unknown_tool"},
    )


async def test_unknown_fields_pass_unless_the_tool_is_strict() -> None:
    args = {"city": "Oslo", "mood": "sunny"}
    assert (await JsonSchemaValidator().validate(request(args))).verdict == "accepted"
    v = await JsonSchemaValidator().validate(request(args, strict=True))
    assert v.verdict == "rejected" and [e["kind"] for e in v.errors] == ["unevaluatedProperties"]
    assert "mood" in v.errors[0]["message"]


async def test_format_is_an_annotation() -> None:
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}
    assert (await JsonSchemaValidator().validate(request({"when": "not a date"}, schema))).verdict == "accepted"


async def test_remote_refs_are_never_fetched() -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/never.json"}}}
    v = await JsonSchemaValidator().validate(request({"x": 1}, schema))
    assert v.verdict == "rejected" and not v.retryable and v.errors[0]["kind"] == "schema"


async def test_an_invalid_schema_rejects_without_retry() -> None:
    v = await JsonSchemaValidator().validate(request({"city": "Oslo"}, {"type": "object", "minProperties": -1}))
    assert v.verdict == "rejected" and not v.retryable and "cannot be used" in v.errors[0]["message"]


# ---- strict tools ------------------------------------------------------------------------------

NESTED = {
    "type": "object",
    "properties": {
        "trip": {
            "type": "object",
            "properties": {
                "stops": {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"}}}},
                "when": {"anyOf": [{"type": "object", "properties": {"day": {"type": "integer"}}}, {"type": "null"}]},
                "who": {"$ref": "#/$defs/person"},
            },
        },
        "free": {"type": "object", "additionalProperties": True},
        "anything": {},
    },
    "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}}}},
}


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({"trip": {"x": 1}}, "/trip"),
        ({"trip": {"stops": [{"city": "Oslo"}, {"city": "Rome", "x": 1}]}}, "/trip/stops/1"),
        ({"trip": {"when": {"day": 1, "x": 1}}}, "/trip/when"),
        ({"trip": {"who": {"name": "Ada", "x": 1}}}, "/trip/who"),
        ({"trip": {}, "x": 1}, ""),
    ],
)
async def test_strict_closes_every_object(arguments: dict[str, Any], path: str) -> None:
    assert (await JsonSchemaValidator().validate(request(arguments, NESTED))).verdict == "accepted"
    v = await JsonSchemaValidator().validate(request(arguments, NESTED, strict=True))
    assert v.verdict == "rejected" and [e["path"] for e in v.errors] == [path]


async def test_strict_respects_what_the_schema_says() -> None:
    args = {
        "trip": {"stops": [{"city": "Oslo"}], "when": None, "who": {"name": "Ada"}},
        "free": {"extra": 1},
        "anything": {"open": True},
    }
    assert (await JsonSchemaValidator().validate(request(args, NESTED, strict=True))).verdict == "accepted"


async def test_strict_keeps_allof_composition_working() -> None:
    schema = {
        "type": "object",
        "allOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer"}}},
        ],
    }
    validator = JsonSchemaValidator()
    assert (await validator.validate(request({"a": 1, "b": 2}, schema, strict=True))).verdict == "accepted"
    v = await validator.validate(request({"a": 1, "c": 3}, schema, strict=True))
    assert v.verdict == "rejected" and "c" in v.errors[0]["message"]


def test_strict_schema_does_not_touch_the_input() -> None:
    before = json.dumps(NESTED, sort_keys=True)
    closed = strict_schema(NESTED)
    assert json.dumps(NESTED, sort_keys=True) == before and closed != NESTED
    assert strict_schema(True) is True


# ---- published schemas ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "schema"), [("validation_envelope", ENVELOPE_SCHEMA), ("validation_verdict", VERDICT_SCHEMA)]
)
def test_published_schema_files_equal_the_code(name: str, schema: Mapping[str, Any]) -> None:
    assert json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8")) == schema
    Draft202012Validator.check_schema(schema)


def test_envelopes_validate_against_the_published_schema() -> None:
    check = Draft202012Validator(ENVELOPE_SCHEMA)
    assert list(check.iter_errors(envelope_dict(request({"city": "Oslo"})))) == []
    undeclared = envelope_dict(request({"x": [1, {"y": None}]}, None, tool="nope"))
    assert undeclared["schema"] is None and list(check.iter_errors(undeclared)) == []
    assert list(check.iter_errors({**envelope_dict(request({})), "arguments": []}))  # arguments must be an object


def test_idempotency_key_names_actor_tool_canonical_arguments_and_scope() -> None:
    a = idempotency_key("alice", "t", {"x": 1, "y": [1, 2]}, SCOPE)
    assert a == idempotency_key("alice", "t", {"y": [1, 2], "x": 1}, SCOPE)  # key order is not part of it
    others = {
        idempotency_key("bob", "t", {"x": 1, "y": [1, 2]}, SCOPE),
        idempotency_key("alice", "u", {"x": 1, "y": [1, 2]}, SCOPE),
        idempotency_key("alice", "t", {"x": 2, "y": [1, 2]}, SCOPE),
        idempotency_key("alice", "t", {"x": 1, "y": [1, 2]}, "0" * 64),
        idempotency_key("alice\u0000t", "", {"x": 1, "y": [1, 2]}, SCOPE),  # no separator to forge
    }
    assert len(others | {a}) == 6


@pytest.mark.parametrize(
    "verdict",
    [
        Verdict.accept("v"),
        Verdict.accept("v", {"city": "Oslo"}),
        Verdict.reject("v", [{"path": "/city", "message": "no", "kind": "enum"}], retryable=False),
    ],
)
def test_verdicts_round_trip_through_the_published_schema(verdict: Verdict) -> None:
    doc = verdict_dict(verdict)
    assert list(Draft202012Validator(VERDICT_SCHEMA).iter_errors(doc)) == []
    assert parse_verdict(json.loads(json.dumps(doc)), "v") == verdict


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        "accepted",
        {},
        {"verdict": "ok"},
        {"verdict": "accepted", "arguments": [1]},
        {"verdict": "rejected", "retryable": True},
        {"verdict": "rejected", "errors": [], "retryable": True},
        {"verdict": "rejected", "errors": [{"path": "city", "message": "x"}], "retryable": True},
        {"verdict": "rejected", "errors": [{"path": "/a~2", "message": "x"}], "retryable": True},
        {"verdict": "rejected", "errors": [{"path": "/a", "message": ""}], "retryable": True},
        {"verdict": "rejected", "errors": [{"path": "/a", "message": "x"}]},
        {"verdict": "rejected", "errors": [{"path": "/a", "message": "x"}], "retryable": "yes"},
    ],
)
def test_nonsense_is_not_a_verdict(doc: Any) -> None:
    with pytest.raises(ValueError, match="not a verdict"):
        parse_verdict(doc, "v")


# ---- HttpValidator: retries, limits, fail closed ------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def counting(answers: list[Any]) -> tuple[list[httpx.Request], httpx.MockTransport]:
    """A transport that answers from `answers` in order (an exception is raised)."""
    seen: list[httpx.Request] = []

    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        answer = answers[min(len(seen), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer

    return seen, httpx.MockTransport(handle)


def ok(doc: Any = None) -> httpx.Response:
    return httpx.Response(200, json=doc if doc is not None else {"verdict": "accepted"})


def http(transport: httpx.MockTransport, **kw: Any) -> HttpValidator:
    return HttpValidator("http://validator.test/v", transport=transport, backoff_s=0.001, **kw)


async def test_posts_the_envelope_with_its_idempotency_key() -> None:
    seen, transport = counting([ok({"verdict": "accepted", "arguments": {"city": "OSLO"}})])
    req = request({"city": "oslo"})
    v = await http(transport).validate(req)
    assert v == Verdict("accepted", {"city": "OSLO"}, validator="http:http://validator.test/v")
    [sent] = seen
    assert sent.method == "POST" and sent.headers["idempotency-key"] == req.idempotency_key
    assert sent.headers["content-type"] == "application/json" and json.loads(sent.content) == envelope_dict(req)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("server disconnected"),
        httpx.Response(502),
        httpx.Response(503),
        httpx.Response(504),
    ],
)
async def test_transient_failures_are_retried(failure: Any) -> None:
    seen, transport = counting([failure, failure, ok()])
    assert (await http(transport, retries=2).validate(request({"city": "Oslo"}))).verdict == "accepted"
    assert len(seen) == 3 and len({r.headers["idempotency-key"] for r in seen}) == 1


async def test_retries_are_bounded() -> None:
    seen, transport = counting([httpx.ConnectError("refused")])
    with pytest.raises(ValidatorUnavailableError, match="cannot reach the validator") as info:
        await http(transport, retries=3).validate(request({"city": "Oslo"}))
    assert len(seen) == 4 and info.value.status == 503 and info.value.code == "validator_unavailable"
    seen, transport = counting([httpx.Response(503)])
    with pytest.raises(ValidatorUnavailableError, match="HTTP 503"):
        await http(transport, retries=1).validate(request({"city": "Oslo"}))
    assert len(seen) == 2


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (httpx.Response(500), "HTTP 500"),
        (httpx.Response(400, json={"verdict": "accepted"}), "HTTP 400"),
        (httpx.Response(201, json={"verdict": "accepted"}), "HTTP 201"),
        (httpx.ReadTimeout("slow"), "no verdict within"),
        (httpx.Response(200, content=b"<html>"), "not JSON"),
        (httpx.Response(200, content=b"\xff\xfe"), "not JSON"),
        (httpx.Response(200, json={"verdict": "rejected"}), "not a verdict"),
    ],
)
async def test_other_failures_fail_closed_at_once(answer: Any, why: str) -> None:
    seen, transport = counting([answer, ok()])
    with pytest.raises(ValidatorUnavailableError, match=why):
        await http(transport).validate(request({"city": "Oslo"}))
    assert len(seen) == 1


async def test_the_time_limit_covers_retries_and_backoff() -> None:
    seen, transport = counting([httpx.Response(503)])
    validator = HttpValidator("http://validator.test/v", transport=transport, timeout_s=0.2, retries=50, backoff_s=0.05)
    with pytest.raises(ValidatorUnavailableError, match=r"no verdict within 0\.2 s"):
        await validator.validate(request({"city": "Oslo"}))
    assert 2 <= len(seen) < 10


def test_identity_hides_credentials_and_query() -> None:
    v = HttpValidator("https://user:secret@validator.example:8443/check?token=abc")
    assert v.name == "http:https://validator.example:8443/check" and "secret" not in v.name
    assert redact_url("http://[::1]:9/v") == "http://[::1]:9/v"
    with pytest.raises(ValueError, match="http"):
        HttpValidator("file:///etc/passwd")


@given(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=4))
def test_any_envelope_serialises_to_the_schema(arguments: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(envelope_dict(request(arguments))))
    assert list(Draft202012Validator(ENVELOPE_SCHEMA).iter_errors(doc)) == []


async def test_prepared_schemas_are_keyed_by_content() -> None:
    validator = JsonSchemaValidator()
    validator.cache_size = 2
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert (await validator.validate(request({"n": 1}, schema))).verdict == "accepted"
    schema["properties"]["n"]["type"] = "string"  # same object, new content
    assert (await validator.validate(request({"n": 1}, schema))).verdict == "rejected"
    for bound in range(5):  # more schemas than the cache holds: each still checked by its own rules
        capped = {"type": "integer", "maximum": bound}
        assert (await validator.validate(request(bound, capped))).verdict == "accepted"
        assert (await validator.validate(request(bound + 1, capped))).verdict == "rejected"
    bad = {"type": "object", "minProperties": -1}
    first, second = [await validator.validate(request({}, bad)) for _ in range(2)]
    assert first == second and first.verdict == "rejected" and not first.retryable


def test_the_validator_page_links_both_published_schemas() -> None:
    page = SCHEMAS.parent / "docs" / "validator.md"
    text = page.read_text(encoding="utf-8")
    section = text[text.index("## Schemas") :]
    section = section[: section.index("\n## ")]
    linked = [page.parent / target for target in re.findall(r"\]\(([^)]+\.schema\.json)\)", section)]
    published = [json.loads(path.read_text(encoding="utf-8")) for path in linked]
    assert published == [ENVELOPE_SCHEMA, VERDICT_SCHEMA]
    pasted = [json.loads(b.split("```", 1)[0]) for b in text.split("```json\n")[1:]]
    assert all(block in (ENVELOPE_SCHEMA, VERDICT_SCHEMA) for block in pasted)  # a pasted copy must not drift
