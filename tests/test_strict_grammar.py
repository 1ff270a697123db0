"""`strict: true` tools: the grammar closes the objects the strict validator closes.

The validator checks a strict tool's arguments against `strict_schema(parameters)`, which
closes every standalone object (`unevaluatedProperties: false`), free-form ones included.
Checked in every format, with the grammars compiled by outlines-core over a byte vocabulary
and the calls read by the real parser:

* every text sampled from a strict tool's grammar (random walks over the Index) parses
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
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import httpx
import pytest

import callgate.constraints as constraints
from callgate.constraints.json_schema import object_regex
from callgate.constraints.request import grammar_request
from callgate.formats import get_format
from callgate.parsers import parse
from callgate.serving.app import create_app
from callgate.serving.fake_engine import FakeEngine
from callgate.serving.validation import JsonSchemaValidator
from tests.harness import assistant_completion, distances_to_final, openai_tool_calls
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


@cache
def byte_vocabulary() -> constraints.TokenVocabulary:
    return constraints.token_vocabulary({bytes([b]): [b] for b in range(256)}, eos_token_id=EOS)


def compiled(fmt: str, strict: bool) -> constraints.Constraint:
    c = constraints.build(fmt, [tool(strict, parameters(fmt))], "required", False, None, byte_vocabulary())
    assert c is not None and c.index is not None
    return c


def accepts(c: constraints.Constraint, text: str) -> bool:
    index = c.index
    state = index.get_initial_state()
    for b in text.encode():
        state = index.get_next_state(state, b)
        if state is None:
            return False
    return bool(index.is_final_state(state))


class ByteSampler:
    """Random walks over an Index of a byte vocabulary that end in a final state: up to
    `budget` random bytes, then the shortest path to a final state."""

    def __init__(self, index: Any, seed: int) -> None:
        self.index, self.rng = index, random.Random(seed)
        self.dist = self._distances()

    def _edges(self, state: int) -> list[tuple[int, int]]:
        allowed = sorted(t for t in self.index.get_allowed_tokens(state) if t < 256)
        return [(t, self.index.get_next_state(state, t)) for t in allowed]

    def _distances(self) -> dict[int, int]:
        return distances_to_final(self.index, self._edges)

    def sample(self, budget: int) -> str:
        state, out = self.index.get_initial_state(), bytearray()
        for _ in range(budget):
            edges = self._edges(state)
            if not edges or (self.index.is_final_state(state) and self.rng.random() < 0.1):
                break
            ascii_ = [e for e in edges if e[0] < 128]
            b, state = self.rng.choice(ascii_ if ascii_ and self.rng.random() < 0.9 else edges)
            out.append(b)
        while not self.index.is_final_state(state):
            b, state = min(self._edges(state), key=lambda e: self.dist.get(e[1], 1 << 30))
            out.append(b)
        return out.decode()


def arguments_of(fmt: str, text: str) -> dict[str, Any]:
    """The one call's arguments (every number the grammar writes is one the parser holds)."""
    result = parse(fmt, text + get_format(fmt).eos, [tool(True, parameters(fmt))])
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
    sampler = ByteSampler(compiled(fmt, strict=True).index, seed=len(fmt))
    for i in range(40):
        text = sampler.sample(budget=40 + (i % 8) * 25)
        arguments = arguments_of(fmt, text)
        assert strict_errors(fmt, arguments) == [], (text, arguments)


@pytest.mark.parametrize("fmt", FORMATS)
def test_strict_grammar_accepts_exactly_the_strict_valid_calls(fmt: str) -> None:
    strict = compiled(fmt, strict=True)
    sampler = ByteSampler(compiled(fmt, strict=False).index, seed=7 + len(fmt))
    verdicts = set()
    for i in range(60):
        text = sampler.sample(budget=40 + (i % 8) * 25)
        arguments = arguments_of(fmt, text)
        valid = strict_errors(fmt, arguments) == []
        # a closed object is `{}` or `{ }`, as for `additionalProperties: false`; the
        # open one's empty form also has `{  }` (a space after `{` and before `}`)
        assert accepts(strict, text.replace("{  }", "{ }")) == valid, (text, valid)
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
        assert strict_errors(fmt, arguments_of(fmt, near_miss)) != [], key
        assert accepts(plain, near_miss) and not accepts(strict, near_miss), key


def test_a_non_strict_tool_keeps_its_grammar_and_key() -> None:
    def req(strict: bool | None) -> Any:
        r = grammar_request("hermes", [tool(strict)], "required", False, None)
        assert r is not None
        return r

    assert req(False).key() == req(None).key() != req(True).key()
    assert req(False).tools[0].parameters == PARAMETERS
    assert object_regex(req(False).tools[0].parameters) == object_regex(PARAMETERS)


def test_strict_empty_parameters_admit_only_the_empty_object() -> None:
    # the validator reads `parameters: {}` as an object without properties
    strict = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {}}}
    c = constraints.build("hermes", [strict], "required", False, None, None)
    assert c is not None
    call = '<tool_call>\n{"name": "f", "arguments": %s}\n</tool_call>'
    assert re.fullmatch(c.regex, call % "{}") and not re.fullmatch(c.regex, call % '{"a": 1}')


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
    assert sent is not None and re.fullmatch(sent.regex, reply)
    assert not re.fullmatch(sent.regex, reply.replace('"l": [{}]', '"l": [{"key": "value"}]'))
