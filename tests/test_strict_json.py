"""One strict JSON rule (callgate/strict_json.py), one verdict in every format.

The same assistant histories -- arguments with a repeated key, NaN, Infinity, a number past
its range, a 5000-digit integer, a lone surrogate escape, text after the value, a value that
is not an object, nesting past the bound -- are refused by all six formats'
`templates.render` with a TemplateError (400) naming the field, and the clean ones around
them (a big integer, a surrogate pair, the deepest nesting allowed) are rendered by all six;
the real HTTP server on the fake engine gives the same verdicts on chat completions (hermes,
qwen3-xml) and on the Responses surface, each naming its own field. The parsers
read model output by the same rule: a call whose argument value breaks it is a diagnostic,
never a candidate, in every format, and the clean values come back exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.errors import TemplateError
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.parsers.json_scan import JsonScanner
from callgate.strict_json import MAX_DEPTH, MAX_INTEGER_DIGITS, StrictJsonError, loads
from callgate.templates import render
from tests.harness import assistant_completion
from tests.test_server_app import MODEL
from tests.test_server_openai import serve

__all__ = ["serve"]  # the fixture, used by name

FORMATS = ["hermes", "qwen3-xml", "llama3-json", "mistral", "dsml-v3.2", "dsml-v4"]
FIELD = "messages[1].tool_calls[0].function.arguments"
CALL_ID = "call00001"  # nine letters and digits: a call id mistral can write
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "object"}}}},
    }
]
BIG = str(2**64 + 1)

REFUSED = {
    "duplicate_key": '{"a": 1, "a": 2}',
    "nested_duplicate_key": '{"a": {"x": 1, "x": 2}}',
    "nan": '{"a": NaN}',
    "infinity": '{"a": Infinity}',
    "minus_infinity": '{"a": -Infinity}',
    "double_overflow": '{"a": 1e999}',
    "integer_5000_digits": '{"a": ' + "9" * 5000 + "}",
    "lone_high_surrogate_escape": '{"a": "\\ud800"}',
    "lone_low_surrogate_escape": '{"a": "x\\udc00"}',
    "high_surrogate_then_text": '{"a": "\\ud83dx"}',
    "raw_surrogate": '{"a": "\ud800"}',
    "trailing_text": '{"a": 1} and more',
    "second_value": '{"a": 1}{"b": 2}',
    "array": "[1, 2]",
    "string": '"{}"',
    "number": "1",
    "null": "null",
    "empty": "",
    "single_quotes": "{'a': 1}",
    "too_deep": '{"a": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}",
    "deeper_than_the_interpreter_stack": '{"a": ' + "[" * 5000 + "]" * 5000 + "}",
}
ACCEPTED = {
    "big_integer": ('{"a": ' + BIG + "}", BIG),
    "integer_at_the_digit_limit": ('{"a": ' + "7" * MAX_INTEGER_DIGITS + "}", "7" * MAX_INTEGER_DIGITS),
    "surrogate_pair_escape": ('{"a": "\\ud83d\\ude00"}', "\U0001f600"),
    "escaped_backslash_before_u": ('{"a": "\\\\ud800"}', "ud800"),
    "tiny_double": ('{"a": 1e-999}', "0.0"),
    "whitespace_around": (' \n{"a": 1}\t\r\n', "1"),
    "deepest_nesting": ('{"a": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}", "[" * (MAX_DEPTH - 1)),
}


def history(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": CALL_ID, "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "done"},
    ]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("arguments", REFUSED.values(), ids=REFUSED.keys())
def test_every_format_refuses_the_same_history(fmt: str, arguments: str) -> None:
    with pytest.raises(TemplateError) as err:
        render(fmt, history(arguments), TOOLS)
    assert err.value.status == 400
    assert err.value.param == FIELD
    assert err.value.message.startswith(FIELD + ": ")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("arguments", "shown"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_every_format_renders_the_same_clean_history(fmt: str, arguments: str, shown: str) -> None:
    prompt = render(fmt, history(arguments), TOOLS)
    assert shown in prompt


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "arguments",
    [{"a": float("nan")}, {"a": float("inf")}, {"a": "\ud800"}, {"a": {1j: 2}}],
    ids=["nan", "infinity", "raw_surrogate", "not_json"],
)
def test_an_object_is_held_to_the_rule_of_its_text(fmt: str, arguments: dict[str, Any]) -> None:
    with pytest.raises(TemplateError) as err:
        render(fmt, history(arguments), TOOLS)
    assert err.value.param == FIELD


@pytest.mark.parametrize("fmt", FORMATS)
def test_object_and_absent_arguments_render_like_their_text(fmt: str) -> None:
    value = {"a": {"n": 2**64 + 1, "s": "\U0001f600"}}
    assert render(fmt, history(value), TOOLS) == render(fmt, history(json.dumps(value)), TOOLS)
    assert render(fmt, history(None), TOOLS) == render(fmt, history("{}"), TOOLS)


# ---- the real HTTP server on the fake engine -------------------------------------------------


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-xml"])
def test_the_server_gives_the_same_verdict(serve: Callable[..., Any], fmt: str) -> None:
    server = serve(respond=lambda req: ["fine"], format=fmt, max_model_len=16384)
    url = server.url + "/v1/chat/completions"

    def post(arguments: str) -> httpx.Response:
        body = {"model": MODEL, "messages": history(arguments), "tools": TOOLS}
        # ensure_ascii: a raw surrogate travels as the `\ud800` escape a client would send
        return httpx.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"})

    for name, arguments in REFUSED.items():
        resp = post(arguments)
        assert resp.status_code == 400, (name, resp.text)
        error = resp.json()["error"]
        # a raw surrogate travels as a `\ud800` escape of the body itself, which the body's
        # JSON parser refuses before any field is read
        param = None if name == "raw_surrogate" else FIELD
        assert (error["type"], error["param"]) == ("invalid_request_error", param), name
    for name, (arguments, _) in ACCEPTED.items():
        resp = post(arguments)
        assert resp.status_code == 200, (name, resp.text)
        assert resp.json()["choices"][0]["message"]["content"] == "fine"


def test_the_responses_surface_gives_the_same_verdict(serve: Callable[..., Any]) -> None:
    server = serve(respond=lambda req: ["fine"], format="qwen3-xml", max_model_len=16384)
    tools = [{"type": "function", "name": "f", "parameters": TOOLS[0]["function"]["parameters"]}]

    def post(arguments: str) -> httpx.Response:
        call = {"type": "function_call", "call_id": CALL_ID, "name": "f", "arguments": arguments}
        items = [
            {"role": "user", "content": "go"},
            call,
            {"type": "function_call_output", "call_id": CALL_ID, "output": "done"},
        ]
        body = {"model": MODEL, "input": items, "tools": tools}
        return httpx.post(
            server.url + "/v1/responses",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )

    for name, arguments in REFUSED.items():
        if name == "raw_surrogate":
            continue  # refused with the body itself, as above
        resp = post(arguments)
        assert resp.status_code == 400, (name, resp.text)
        assert resp.json()["error"]["param"] == "input[1].arguments", name
    for name, (arguments, _) in ACCEPTED.items():
        assert post(arguments).status_code == 200, name


# ---- the parsers read model output by the same rule -------------------------------------------

PLACEHOLDER = {"p": 31415926}
BAD_VALUES = {
    "duplicate_key": '{"x": 1, "x": 2}',
    "nan": '{"x": NaN}',
    "infinity": '{"x": Infinity}',
    "minus_infinity": '{"x": -Infinity}',
    "double_overflow": '{"x": 1e999}',
    "integer_5000_digits": '{"x": ' + "9" * 5000 + "}",
    "lone_high_surrogate_escape": '{"x": "\\ud800"}',
    "lone_low_surrogate_escape": '{"x": "\\udc00"}',
    "too_deep": '{"x": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}",
}
GOOD_VALUES = {
    "big_integer": ('{"x": ' + BIG + "}", {"x": 2**64 + 1}),
    "surrogate_pair_escape": ('{"x": "\\ud83d\\ude00"}', {"x": "\U0001f600"}),
    "deepest_nesting": (
        '{"x": ' + "[" * (MAX_DEPTH - 5) + "]" * (MAX_DEPTH - 5) + "}",
        {"x": json.loads("[" * (MAX_DEPTH - 5) + "]" * (MAX_DEPTH - 5))},
    ),
}


def model_output(fmt: str, value_text: str) -> str:
    """What the model writes for a call f(a=<value_text>): the rendered turn, with the
    placeholder object's text replaced by `value_text`."""
    completion = assistant_completion(
        fmt, history("{}")[:1], history(json.dumps({"a": PLACEHOLDER}))[1], TOOLS, eos=get_format(fmt).eos
    )
    placeholder = json.dumps(PLACEHOLDER)
    assert completion.count(placeholder) == 1, completion
    return completion.replace(placeholder, value_text)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_every_parser_refuses_what_the_rule_refuses(fmt: str, value: str) -> None:
    with pytest.raises(StrictJsonError):
        loads(value)
    result = parse(fmt, model_output(fmt, value), TOOLS)
    assert result.candidates == ()
    assert result.diagnostics


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("value", "decoded"), GOOD_VALUES.values(), ids=GOOD_VALUES.keys())
def test_every_parser_reads_what_the_rule_reads(fmt: str, value: str, decoded: dict[str, Any]) -> None:
    assert loads(value) == decoded
    result = parse(fmt, model_output(fmt, value), TOOLS)
    assert [(c.name, c.arguments) for c in result.candidates] == [("f", {"a": decoded})]
    assert result.diagnostics == ()


# ---- the whole-text reader and the incremental scanner agree ----------------------------------


def _scanner_accepts(text: str) -> bool:
    scanner = JsonScanner()
    end = scanner.feed(text)
    if not scanner.failed and not scanner.done:
        scanner.finish()
    return scanner.done and not text[end:].strip(" \t\r\n")


def _loads_accepts(text: str) -> bool:
    try:
        loads(text)
    except StrictJsonError:
        return False
    return True


def _nested(depth: int) -> Iterator[str]:
    yield "[" * depth + "]" * depth
    yield '{"a": ' * depth + "0" + "}" * depth


@pytest.mark.parametrize("text", [*REFUSED.values(), *(a for a, _ in ACCEPTED.values()), *_nested(MAX_DEPTH + 1)])
def test_loads_and_the_scanner_agree_on_the_histories(text: str) -> None:
    assert _scanner_accepts(text) == _loads_accepts(text)


# pieces that make surrogates, escapes, numbers and nesting likely
_PIECES = ["\\ud83d", "\\ude00", "\\ud800", "\\udc00", "\\\\", "\\u0041", "\\n", "\ud800", '"', "[", "]", "{", "}"]
_PIECES += [":", ",", " ", "1", "-", ".5", "e9", "1e999", "NaN", "true", "null", '"k"', "x"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=14))
def test_loads_and_the_scanner_agree_on_random_texts(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert _scanner_accepts(text) == _loads_accepts(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=10))
def test_strings_agree_on_random_escapes(pieces: list[str]) -> None:
    text = '{"s": "' + "".join(p for p in pieces if p != '"') + '"}'
    assert _scanner_accepts(text) == _loads_accepts(text)


def test_error_names_what_and_where() -> None:
    with pytest.raises(StrictJsonError) as err:
        loads('{"a": "\\ud800"}')
    assert (err.value.code, err.value.offset) == ("invalid_json", 7)
    with pytest.raises(StrictJsonError) as err:
        loads('{"a": 1, "a": 2}')
    assert err.value.code == "duplicate_key" and '"a"' in str(err.value)


def test_a_lone_surrogate_in_model_output_is_a_502_not_a_crash(serve: Callable[..., Any]) -> None:
    """Model output the rule refuses is a clear model_output_error; read as before (lone
    halves kept) the candidate could not be written as UTF-8, and the response was a 500."""
    reply = '<tool_call>\n{"name": "f", "arguments": {"a": {"s": "x\\ud800"}}}\n</tool_call>'
    server = serve(respond=lambda req: [reply], format="hermes")
    resp = httpx.post(
        server.url + "/v1/chat/completions", json={"model": MODEL, "messages": history("{}")[:1], "tools": TOOLS}
    )
    assert resp.status_code == 502, resp.text
    assert (resp.json()["error"]["type"], resp.json()["error"]["code"]) == ("model_output_error", "invalid_json")
