"""`strict: true` tools: the grammar closes the objects the strict validator closes.

The validator checks a strict tool's arguments against `strict_schema(parameters)`, which
closes every standalone object (`unevaluatedProperties: false`), free-form ones included.
Checked in every format (a family whose Lark grammar is not written yet skips), with the
llguidance grammars over a byte vocabulary and the calls read by the real parser:

* every text sampled from a strict tool's grammar (random walks, tests/llg_harness.py) parses
  cleanly and its arguments pass the strict validator;
* a text of the non-strict grammar is accepted by the strict grammar exactly when its
  arguments pass the strict validator (so the near-misses, keys in a closed object, are
  rejected);
* the rendered call with a key in each closed object is refused, the same call without
  them accepted; a non-strict tool keeps its grammar and its key.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

import callgate.constraints as constraints
from callgate.constraints.lark_grammar import lark_grammar
from callgate.constraints.request import grammar_request
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.serving.app import create_app
from callgate.serving.engines.fake_engine import FakeEngine
from callgate.serving.handoff.validation import JsonSchemaValidator
from tests import llg_harness
from tests.harness import assistant_completion, openai_tool_calls
from tests.llg_harness import byte_vocabulary
from tests.test_agreement import known_number_range
from tests.test_server_app import MODEL, make_settings

FORMATS = ["hermes", "llama3-json", "mistral", "qwen3-xml", "dsml-v4", "dsml-v3.2"]
EOS = 256

# Free-form objects in every place strict_schema closes one: an array's items, a property,
# a `$ref` target, `additionalProperties` values, a type union, an `allOf` branch.
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "l": {"type": "array", "items": {"type": "object"}, "maxItems": 2},
        "n": {"type": "object"},
        "r": {"$ref": "#/$defs/free"},
        "m": {"type": "object", "additionalProperties": {"type": "object"}},
        "u": {"type": ["object", "null"]},
        "c": {"type": "object", "allOf": [{"type": "object"}]},
    },
    "required": ["l", "n"],
    "$defs": {"free": {"type": "object"}},
}


def parameters(fmt: str) -> dict[str, Any]:
    """PARAMETERS (the same in every format; qwen3-xml's parser follows `r`'s `$ref`)."""
    return PARAMETERS


# a key in each object the strict validator closes ("m" may hold keys; its values may not)
OPEN_ARGS = {"l": [{"k": 1}], "n": {"k": 1}, "r": {"k": 1}, "m": {"x": {"k": 1}}, "u": {"k": 1}, "c": {"k": 1}}
CLOSED_ARGS = {"l": [{}], "n": {}, "r": {}, "m": {"x": {}}, "u": {}, "c": {}}


def tool(strict: bool | None, parameters: Mapping[str, Any] = PARAMETERS) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": "f", "parameters": dict(parameters)}
    if strict is not None:
        fn["strict"] = strict
    return {"type": "function", "function": fn}


def compiled(fmt: str, strict: bool) -> constraints.Constraint:
    c = constraints.build(fmt, [tool(strict, parameters(fmt))], "required", False, None, byte_vocabulary())
    assert c is not None
    return c


def accepts(c: constraints.Constraint | str, text: str) -> bool:
    """The grammar (of a Constraint, or its text) admits exactly `text`, then EOS."""
    return llg_harness.accepts(c if isinstance(c, str) else c.grammar, text)


class ByteSampler:
    """Random texts of a grammar: random admitted bytes, then the budget closer's way to
    its end (llg_harness.sample); `format` names the markers the closer may use."""

    def __init__(self, grammar: str, seed: int, format: str = "") -> None:
        self.grammar, self.format, self.rng = grammar, format, random.Random(seed)

    def sample(self, budget: int) -> str:
        return llg_harness.sample(self.grammar, self.rng, max_bytes=2 * budget + 300, format=self.format)


def arguments_of(fmt: str, text: str) -> dict[str, Any] | None:
    """The one call's arguments; None where the text holds a number past the parser's
    float range (test_agreement's known_number_range)."""
    result = parse(fmt, text + get_format(fmt).eos, [tool(True, parameters(fmt))])
    if known_number_range(result):
        return None
    assert result.diagnostics == () and len(result.candidates) == 1, (text, result.diagnostics)
    arguments: dict[str, Any] = result.candidates[0].arguments
    return arguments


def strict_errors(fmt: str, arguments: Any) -> list[dict[str, str]]:
    return JsonSchemaValidator().errors(parameters(fmt), arguments, strict=True)


def rendered(fmt: str, arguments: Mapping[str, Any]) -> str:
    calls = openai_tool_calls([("f", dict(arguments))])
    if fmt == "mistral":  # mistral-common ids are 9 alphanumerics
        calls = [{**c, "id": f"c{i:08d}"} for i, c in enumerate(calls)]
    eos = get_format(fmt).eos
    turn = {"role": "assistant", "content": "", "tool_calls": calls}
    text = assistant_completion(fmt, [{"role": "user", "content": "go"}], turn, [tool(True, parameters(fmt))], eos=eos)
    return text[: -len(eos)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_strict_grammar_samples_pass_the_strict_validator(fmt: str) -> None:
    sampler = ByteSampler(compiled(fmt, strict=True).grammar, seed=len(fmt), format=fmt)
    for i in range(40):
        text = sampler.sample(budget=40 + (i % 8) * 25)
        arguments = arguments_of(fmt, text)
        if arguments is not None:
            assert strict_errors(fmt, arguments) == [], (text, arguments)


@pytest.mark.parametrize("fmt", FORMATS)
def test_strict_grammar_accepts_exactly_the_strict_valid_calls(fmt: str) -> None:
    strict = compiled(fmt, strict=True)
    sampler = ByteSampler(compiled(fmt, strict=False).grammar, seed=7 + len(fmt), format=fmt)
    verdicts = set()
    for i in range(60):
        text = sampler.sample(budget=40 + (i % 8) * 25)
        arguments = arguments_of(fmt, text)
        if arguments is None:
            continue
        valid = strict_errors(fmt, arguments) == []
        assert accepts(strict, text) == valid, (text, valid)
        verdicts.add(valid)
    assert verdicts == {True, False}  # the walks reached both kinds of call


@pytest.mark.parametrize("fmt", FORMATS)
def test_keys_in_closed_objects_are_refused(fmt: str) -> None:
    strict, plain = compiled(fmt, strict=True), compiled(fmt, strict=False)
    keys = parameters(fmt)["properties"]
    good = rendered(fmt, {k: v for k, v in CLOSED_ARGS.items() if k in keys})
    assert accepts(strict, good) and accepts(plain, good)
    for key, value in OPEN_ARGS.items():
        if key not in keys:
            continue
        near_miss = rendered(fmt, {k: (value if k == key else v) for k, v in CLOSED_ARGS.items() if k in keys})
        args = arguments_of(fmt, near_miss)
        assert args is not None and strict_errors(fmt, args) != [], key
        assert accepts(plain, near_miss) and not accepts(strict, near_miss), key


def test_a_non_strict_tool_keeps_its_grammar_and_key() -> None:
    def req(strict: bool | None) -> Any:
        r = grammar_request("hermes", [tool(strict)], "required", False, None)
        assert r is not None
        return r

    assert req(False).key() == req(None).key() != req(True).key()
    assert req(False).tools[0].parameters == PARAMETERS
    assert lark_grammar(req(False)) == lark_grammar(req(None)) != lark_grammar(req(True))


def test_strict_empty_parameters_admit_only_the_empty_object() -> None:
    # the validator reads `parameters: {}` as an object without properties
    strict = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {}}}
    c = constraints.build("hermes", [strict], "required", False, None, byte_vocabulary())
    assert c is not None
    call = '<tool_call>\n{"name": "f", "arguments": %s}\n</tool_call>'
    assert accepts(c, call % "{}") and not accepts(c, call % '{"a": 1}')


async def test_strict_reaches_the_grammar_through_the_app() -> None:
    reply = '<tool_call>\n{"name": "f", "arguments": {"l": [{}], "n": {}}}\n</tool_call>'
    engine = FakeEngine(replies=[reply])
    app = create_app(make_settings(), engine=engine, validator=JsonSchemaValidator())
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool(True)],
        "tool_choice": "required",
        "callgate": {"max_repairs": 0},
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    [call] = resp.json()["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"l": [{}], "n": {}}
    sent = engine.requests[0].constraint
    assert sent is not None and accepts(sent.plain, reply)
    assert not accepts(sent.plain, reply.replace('"l": [{}]', '"l": [{"key": "value"}]'))
