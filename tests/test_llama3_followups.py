"""llama3-json follow-ups from QA on a real server.

1. A response_format (json_schema or json_object) with tools under tool_choice auto: a
   bare call `{"name": ..., "parameters": ...}` and a JSON answer both start with `{`. The
   parser, told the request asks for a JSON answer, reads a leading object as a call only
   when its first two keys are `name` then `parameters`; the grammar's answer alternative
   never starts so (benchmarks/regex_baseline/json_answer.py). Checked with the real parser, the real
   compiled grammar over a byte vocabulary and the app with the fake engine.
2. A second system-like message before the first user message, with tools: refused
   naming the role the client sent.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import callgate.constraints as constraints
from benchmarks.regex_baseline.json_answer import answer_regex
from callgate.errors import SchemaTooComplexError, TemplateError
from callgate.formats import get_format
from callgate.parsers import parse, sequential_call_ids, stream_parser
from callgate.templates import render
from tests.harness import assert_events_carry_result, random_split
from tests.test_agreement import known_number_range
from tests.test_server_app import make_harness, make_settings  # noqa: F401 - a fixture
from tests.test_strict_grammar import ByteSampler, accepts, byte_vocabulary

FMT = "llama3-json"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
JSON_OBJECT = {"type": "json_object"}
QA_ANSWER = '{ "name": ",","age":153}'  # what the model wrote in QA's repro
CALL = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
ASK = [{"role": "user", "content": "Give a person as JSON"}]


def compiled(response_format: Any) -> constraints.Constraint:
    c = constraints.build(FMT, [WEATHER], "auto", None, response_format, byte_vocabulary())
    assert c is not None
    return c


# ---- 1. parser ------------------------------------------------------------------------------


def check_splits(text: str) -> None:
    """Any split of `text` into deltas gives parse(text), carried by the events."""
    whole = parse(FMT, text, [WEATHER], json_answer=True, call_ids=sequential_call_ids())
    rng = random.Random(0)
    for k in range(40):
        parser = stream_parser(FMT, [WEATHER], json_answer=True, call_ids=sequential_call_ids())
        pieces = random_split(text, rng, max_piece=1 if k == 0 else rng.choice((2, 4, 8)))
        events = [ev for piece in pieces for ev in parser.feed(piece)] + parser.finish()
        assert parser.result() == whole, f"split {k} changed the result"
        assert_events_carry_result(events, whole)


@pytest.mark.parametrize(
    "text",
    [
        QA_ANSWER,
        '{"name": "Bob"}',
        '{"age": 3, "name": "Bob"}',
        "{}",
        '[{"name": "x"}]',
        '{"parameters": {}, "name": "x"}',
    ],
)
def test_a_json_answer_that_is_not_call_shaped_is_content(text: str) -> None:
    result = parse(FMT, text + "<|eot_id|>", [WEATHER], json_answer=True)
    assert (result.content, result.candidates, result.diagnostics) == (text, (), ())
    check_splits(text)


def test_a_call_shaped_object_is_still_a_call_beside_a_json_answer() -> None:
    for text in (CALL, "<|python_tag|>" + CALL):
        check_splits(text)
        result = parse(FMT, text + "<|eot_id|>", [WEATHER], json_answer=True)
        assert result.diagnostics == () and result.content is None
        assert [(c.name, c.arguments) for c in result.candidates] == [("get_weather", {"city": "Oslo"})]
    bad = parse(FMT, '{"name": "get_weather", "parameters": {}, "x": 1}', [WEATHER], json_answer=True)
    assert [d.code for d in bad.diagnostics] == ["bad_call_object"]


def test_without_a_json_answer_a_leading_object_is_a_call_attempt() -> None:
    assert [d.code for d in parse(FMT, QA_ANSWER, [WEATHER]).diagnostics] == ["bad_call_object"]


# ---- 1. grammar -----------------------------------------------------------------------------


@pytest.mark.parametrize("response_format", [PERSON_FORMAT, JSON_OBJECT], ids=["json_schema", "json_object"])
def test_the_grammar_admits_the_answer_and_the_call(response_format: Any) -> None:
    """QA's answer as the grammar spells JSON (one space after `,` and `:`; it fixes spacing)."""
    c = compiled(response_format)
    assert accepts(c, json.dumps(json.loads(QA_ANSWER))) and accepts(c, CALL)
    assert not accepts(c, QA_ANSWER)


NO_ANSWER_RULE = pytest.mark.xfail(
    strict=True,
    reason="lark_grammar composes auto + response_format as (%json answer | call) with no json_answer rule "
    '(GRAMMAR_VERSION 8): in llama3-json an answer may start like a call ({"name": "x", "parameters": '
    "...}), which the parser reads as a call to an undeclared tool (a diagnostic), and declared keys are not "
    "written arguments-key first",
)


@NO_ANSWER_RULE
@pytest.mark.parametrize(
    ("call_shaped", "answer"),
    [
        ('{"name": "x", "parameters": {}}', '{"name": "x", "parameterz": {}}'),
        ('{"name": "x", "param\\u0065ters": {}}', '{"name": "x", "param\\u0065ter": {}}'),
        ('{"\\u006eame": "x", "parameters": {}}', '{"\\u006eamE": "x", "parameters": {}}'),
        ('{"\\u006Eame": "x", "parameters": {}}', '{"\\u006Eam": "x", "parameters": {}}'),
    ],
)
def test_a_free_form_answer_never_starts_like_a_call(call_shaped: str, answer: str) -> None:
    """The parser reads the first text of each pair as a call, the second as an answer."""
    assert parse(FMT, call_shaped, [WEATHER], json_answer=True).content is None
    assert parse(FMT, answer, [WEATHER], json_answer=True).content == answer
    c = compiled(JSON_OBJECT)
    assert not accepts(c, call_shaped) and accepts(c, answer)


@NO_ANSWER_RULE
def test_declared_keys_are_written_with_the_arguments_key_first() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}}}
    c = compiled({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert accepts(c, '{"parameters": {}, "name": "x"}')
    assert not accepts(c, '{"name": "x", "parameters": {}}')


@pytest.mark.parametrize("response_format", [PERSON_FORMAT, JSON_OBJECT], ids=["json_schema", "json_object"])
def test_every_sampled_output_parses_cleanly(response_format: Any) -> None:
    sampler = ByteSampler(compiled(response_format).grammar, seed=11, format=FMT)
    for _ in range(150):
        text = sampler.sample(48)
        result = parse(FMT, text, [WEATHER], json_answer=True)
        if known_number_range(result):
            continue
        assert result.diagnostics == (), text
        assert (result.content == text) != bool(result.candidates), text


def test_a_root_that_may_hide_a_free_form_object_is_refused() -> None:
    schema = {"anyOf": [{"type": "object"}, {"type": "string"}]}
    with pytest.raises(SchemaTooComplexError, match="reads an answer object"):
        answer_regex(get_format(FMT), schema)


# ---- 1. through the app ---------------------------------------------------------------------


@pytest.mark.parametrize("response_format", [PERSON_FORMAT, JSON_OBJECT], ids=["json_schema", "json_object"])
async def test_the_server_returns_the_json_answer_as_content(make_harness: Any, response_format: Any) -> None:  # noqa: F811
    h = make_harness([QA_ANSWER], settings=make_settings(format=FMT))
    resp = await h.post({"messages": ASK, "tools": [WEATHER], "response_format": response_format})
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["message"]["content"] == QA_ANSWER and not choice["message"].get("tool_calls")
    assert choice["finish_reason"] == "stop"


async def test_the_server_still_returns_a_call_beside_a_response_format(make_harness: Any) -> None:  # noqa: F811
    h = make_harness([CALL], settings=make_settings(format=FMT))
    resp = await h.post({"messages": ASK, "tools": [WEATHER], "response_format": JSON_OBJECT})
    assert resp.status_code == 200, resp.text
    [call] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}


# ---- 2. a second system-like message ---------------------------------------------------------


@pytest.mark.parametrize("second", ["developer", "system"])
def test_a_second_system_message_is_refused_naming_its_role(second: str) -> None:
    messages = [{"role": "system", "content": "Be terse."}, {"role": second, "content": "Use tools."}]
    with pytest.raises(TemplateError, match=f"^messages\\[1\\].role: .* got {second} "):
        render(FMT, [*messages, {"role": "user", "content": "Weather in Oslo?"}], [WEATHER])


async def test_the_server_names_the_developer_role(make_harness: Any) -> None:  # noqa: F811
    h = make_harness(["x"], settings=make_settings(format=FMT))
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    resp = await h.post({"messages": messages, "tools": [WEATHER], "tool_choice": "required"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "messages[1].role" and "got developer" in error["message"]
