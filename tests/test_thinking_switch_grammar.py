"""The reasoning switch in the grammar, three ways: the prompt opened a reasoning block
(`thinking` True: the output starts inside it), closed one (False: Qwen3's
`enable_thinking=False`, no block may be opened), or neither (None: no switch, hermes may
open one at its very start, as Qwen3 does unasked).

Grammar level: real llguidance grammars over a byte vocabulary, and the auto row's mask
through the real logits processor. Request level: the constraint the real app hands the
(fake) engine for each switch, per format."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import callgate.constraints as constraints
from callgate.constraints.lark_grammar import lark_grammar
from callgate.constraints.llg import matcher
from callgate.constraints.request import grammar_request
from callgate.decoding.processor import ConstrainedBatch
from tests import test_server_app
from tests.llg_harness import EOS, accepts, byte_vocabulary, consume_text
from tests.test_server_app import ASK, MODEL, WEATHER, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
EMPTY_BLOCK = "<think>\n\n</think>\n\n"
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _vocabulary() -> constraints.LlgVocabulary:
    return byte_vocabulary()


def _takes(grammar: str, text: str) -> bool:
    """The grammar admits `text` as a prefix of an output."""
    m = matcher(grammar, byte_vocabulary())
    return consume_text(m, text) == len(text.encode())


# ---- the grammars --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "answer"),
    [("required", CALL), (NAMED, CALL), ("none", "Oslo is cold."), ("auto-json", '{"city": "Oslo"}')],
    ids=["required", "named", "none", "response_format"],
)
def test_switch_off_refuses_a_reasoning_block_that_no_switch_allows(choice: Any, answer: str) -> None:
    response = {"type": "json_object"} if choice == "auto-json" else None
    tool_choice = "auto" if choice == "auto-json" else choice
    built = {
        thinking: constraints.build("hermes", [WEATHER], tool_choice, True, response, _vocabulary(), thinking=thinking)
        for thinking in (None, False)
    }
    free, off = built[None], built[False]
    assert free is not None and off is not None and free.key != off.key
    assert free.grammar != off.grammar
    assert accepts(free.grammar, EMPTY_BLOCK + answer) and accepts(free.grammar, answer)
    assert not _takes(off.grammar, "<think>")
    assert not accepts(off.grammar, EMPTY_BLOCK + answer) and accepts(off.grammar, answer)


def test_switch_on_starts_inside_the_block() -> None:
    on = constraints.build("hermes", [WEATHER], "required", True, None, _vocabulary(), thinking=True)
    assert on is not None
    assert accepts(on.grammar, "cold north</think>\n\n" + CALL)
    assert not accepts(on.grammar, CALL)  # the block must be closed first
    assert not accepts(on.grammar, EMPTY_BLOCK + CALL)  # no second opener inside it


def test_the_three_states_are_three_cache_keys_and_grammars() -> None:
    reqs = [grammar_request("hermes", [WEATHER], "required", True, None, thinking=t) for t in (None, False, True)]
    assert all(r is not None for r in reqs)
    keys = [r.key() for r in reqs if r is not None]
    assert len(set(keys)) == 3
    grammars = {lark_grammar(r) for r in reqs if r is not None}
    assert len(grammars) == 3
    # the cache: whichever state compiled first, each request gets its own grammar back
    vocab = _vocabulary()
    for order in ((None, False), (False, None)):
        first, second = (constraints.build("hermes", [WEATHER], NAMED, True, None, vocab, thinking=t) for t in order)
        assert first is not None and second is not None and first.key != second.key
        off = first if order[0] is False else second
        free = second if off is first else first
        assert not _takes(off.grammar, "<think>") and _takes(free.grammar, "<think>")


# ---- auto: the processor's mask ---------------------------------------------------------


class _ByteBatch(ConstrainedBatch):
    def load_tokens(self) -> constraints.LlgVocabulary:
        return byte_vocabulary()


def _allowed_after(ref: Any, text: bytes) -> set[int]:
    """The tokens the real processor leaves after the row has written `text`."""
    batch = _ByteBatch(None, "cpu", False)
    out: list[int] = list(text)
    extra = {f.name: getattr(ref, f.name) for f in dataclasses.fields(ref)}  # as vllm_engine sends it
    params = SimpleNamespace(extra_args={"callgate": extra}, max_tokens=4096)
    batch.update_state(SimpleNamespace(removed=[], added=[(0, params, None, out)], moved=[]))
    batch.update_state(None)
    logits = batch.apply(torch.zeros(1, EOS + 1))
    return {i for i in range(EOS + 1) if bool(torch.isfinite(logits[0, i]))}


@pytest.mark.parametrize("thinking", [None, False])
def test_an_auto_row_opens_a_block_only_without_the_switch(thinking: bool | None) -> None:
    c = constraints.build("hermes", [WEATHER], "auto", True, None, _vocabulary(), thinking=thinking)
    assert c is not None and c.trigger == "<tool_call>" and c.thinking is thinking
    allowed = _allowed_after(c.ref(), b"<think")
    assert (ord(">") in allowed) is (thinking is None)
    assert ord("s") in _allowed_after(c.ref(), b"<think")  # "<thinks" is content either way


# ---- request level: what the app hands the engine -----------------------------------------


def _body(switch: bool | None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": ASK, "max_tokens": 400, "tools": [WEATHER], **kw}
    if switch is not None:
        body["chat_template_kwargs"] = {"enable_thinking": switch}
    return body


async def _constraints(make: Any, fmt: str, bodies: Sequence[dict[str, Any]], reply: str) -> list[Any]:
    """The constraint of each request; the fake model answers `reply` (after closing the
    block where the switch opened one)."""
    opened = [b.get("chat_template_kwargs", {}).get("enable_thinking") is True for b in bodies]
    replies = [("hmm</think>\n\n" if o else "") + reply for o in opened]
    h = make(replies, settings=make_settings(format=fmt))
    for body in bodies:
        resp = await h.post(body)
        assert resp.status_code == 200, resp.text
    return [r.constraint for r in h.engine.requests]


async def test_hermes_switch_off_hands_the_engine_a_grammar_without_a_block(make_harness: Any) -> None:
    bodies = [
        _body(None, tool_choice="required"),
        _body(False, tool_choice="required"),
        _body(True, tool_choice="required"),
        {**_body(None, tool_choice="required"), "reasoning_effort": "none"},  # Qwen3's switch off, spelt so
        _body(False),
        _body(None),
    ]
    free, off, on, effort_none, lazy_off, lazy_free = await _constraints(make_harness, "hermes", bodies, CALL)
    expected = {
        t: grammar_request("hermes", [WEATHER], "required", True, None, thinking=t) for t in (None, False, True)
    }
    assert [free.key, off.key, on.key] == [r.key() for r in expected.values() if r is not None]
    assert effort_none.key == off.key and len({free.key, off.key, on.key}) == 3
    # `plain`: the grammar with markers as text (the fake tokenizer's special tokens spelt out)
    assert accepts(free.plain, EMPTY_BLOCK + CALL) and not accepts(off.plain, EMPTY_BLOCK + CALL)
    assert accepts(off.plain, CALL) and accepts(on.plain, "hmm</think>\n\n" + CALL)
    assert lazy_off.trigger == lazy_free.trigger == "<tool_call>" and lazy_off.key != lazy_free.key
    assert ord(">") not in _allowed_after(lazy_off, b"<think")
    assert ord(">") in _allowed_after(lazy_free, b"<think")


UNCHANGED = {
    "dsml-v4": '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "llama3-json": json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}}),
}


@pytest.mark.parametrize("fmt", list(UNCHANGED))
async def test_switch_off_leaves_formats_that_close_no_block_unchanged(make_harness: Any, fmt: str) -> None:
    """dsml's prompt closes a block with or without the switch; llama3-json has none."""
    bodies = [_body(None, tool_choice="required"), _body(False, tool_choice="required")]
    without, off = await _constraints(make_harness, fmt, bodies, UNCHANGED[fmt])
    assert (without.key, without.grammar) == (off.key, off.grammar)
    unset = grammar_request(fmt, [WEATHER], "required", True, None, thinking=None)
    assert unset is not None and off.key == unset.key()
