"""The reasoning switch in the grammar, three ways: the prompt opened a reasoning block
(`thinking` True: the output starts inside it), closed one (False: Qwen3's
`enable_thinking=False`, no block may be opened), or neither (None: no switch, hermes may
open one at its very start, as Qwen3 does unasked).

Grammar level: real outlines-core Indexes over a byte vocabulary, and the lazy row's
free-text rules through the real logits processor. Request level: the constraint the real
app hands the (fake) engine for each switch, per format."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from callgate.constraints.processor import ConstrainedBatch, TokenTable

import callgate.constraints as constraints
from callgate.constraints.free_text import CALL as CALL_PHASE
from callgate.constraints.grammar import free_text
from callgate.constraints.request import grammar_request
from tests import test_server_app
from tests.test_server_app import ASK, MODEL, WEATHER, make_settings

make_harness = test_server_app.make_harness  # the app harness fixture

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
EMPTY_BLOCK = "<think>\n\n</think>\n\n"
NAMED = {"type": "function", "function": {"name": "get_weather"}}
TOKENS = {bytes([b]): [b] for b in range(256)}
EOS = 256
TABLE = TokenTable.build(TOKENS, EOS, {})


def _vocabulary() -> constraints.TokenVocabulary:
    return constraints.token_vocabulary(TOKENS, eos_token_id=EOS)


def _walk(index: Any, text: str) -> Any:
    state = index.get_initial_state()
    for t in text.encode():
        state = index.get_next_state(state, t)
        if state is None:
            return None
    return state


def _accepts(index: Any, text: str) -> bool:
    state = _walk(index, text)
    return state is not None and bool(index.is_final_state(state))


# ---- eager grammars: the compiled Index ---------------------------------------------------


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
    assert free.index is not off.index
    assert _accepts(free.index, EMPTY_BLOCK + answer) and _accepts(free.index, answer)
    assert _walk(off.index, "<think>") is None
    assert not _accepts(off.index, EMPTY_BLOCK + answer) and _accepts(off.index, answer)


def test_switch_on_starts_inside_the_block() -> None:
    on = constraints.build("hermes", [WEATHER], "required", True, None, _vocabulary(), thinking=True)
    assert on is not None
    assert _accepts(on.index, "cold north</think>\n\n" + CALL)
    assert not _accepts(on.index, CALL)  # the block must be closed first
    assert not _accepts(on.index, EMPTY_BLOCK + CALL)  # no second opener inside it


def test_the_three_states_are_three_cache_keys_and_grammars() -> None:
    reqs = [grammar_request("hermes", [WEATHER], "required", True, None, thinking=t) for t in (None, False, True)]
    assert all(r is not None for r in reqs)
    keys = [r.key() for r in reqs if r is not None]
    assert len(set(keys)) == 3
    regexes = {constraints.build_regex(r).regex for r in reqs if r is not None}
    assert len(regexes) == 3
    # the cache: whichever state compiled first, each request gets its own grammar back
    vocab = _vocabulary()
    for order in ((None, False), (False, None)):
        first, second = (constraints.build("hermes", [WEATHER], NAMED, True, None, vocab, thinking=t) for t in order)
        assert first is not None and second is not None and first.key != second.key
        off = first if order[0] is False else second
        free = second if off is first else first
        assert _walk(off.index, "<think>") is None and _walk(free.index, "<think>") is not None


# ---- lazy auto: the processor's free-text rules ---------------------------------------------


def test_free_text_rules_refuse_an_opener_only_when_the_prompt_closed_one() -> None:
    trigger = b"<tool_call>"
    free, off = free_text("hermes", trigger), free_text("hermes", trigger, may_open=False)
    assert free.step(free.start(), b"<think>") is not None
    assert off.step(off.start(), b"<think>") is None
    state = off.step(off.start(), b"Oslo. ")
    assert state is not None and off.step(state, b"<tool_call>") == (CALL_PHASE, b"<tool_call>")


class _ByteBatch(ConstrainedBatch):
    def load_tokens(self) -> TokenTable:
        return TABLE


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
def test_lazy_auto_row_opens_a_block_only_without_the_switch(thinking: bool | None) -> None:
    c = constraints.build("hermes", [WEATHER], "auto", True, None, _vocabulary(), thinking=thinking)
    assert c is not None and c.trigger == "<tool_call>" and c.ref().thinking is thinking
    allowed = _allowed_after(c.ref(), b"<think")
    assert (ord(">") in allowed) is (thinking is None)
    assert ord("s") in _allowed_after(c.ref(), b"<think")  # "<thinks" is content either way


# ---- request level: what the app hands the engine -----------------------------------------


def _body(switch: bool | None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": ASK, "max_tokens": 400, "tools": [WEATHER], **kw}
    if switch is not None:
        body["chat_template_kwargs"] = {"enable_thinking": switch}
    return body


def _full(regex: str, text: str) -> bool:
    return re.fullmatch(regex, text) is not None


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
    states = [c.thinking for c in (free, off, on, effort_none, lazy_off, lazy_free)]
    assert states == [None, False, True, False, False, None]
    assert len({free.key, off.key, on.key}) == 3 and effort_none.key == off.key
    assert _full(free.regex, EMPTY_BLOCK + CALL) and not _full(off.regex, EMPTY_BLOCK + CALL)
    assert _full(off.regex, CALL) and _full(on.regex, "hmm</think>\n\n" + CALL)
    # lazy auto: the regex starts at the trigger; the free-text rules differ
    assert lazy_off.trigger == lazy_free.trigger == "<tool_call>" and lazy_off.key != lazy_free.key
    assert ord(">") not in _allowed_after(lazy_off, b"<think")
    assert ord(">") in _allowed_after(lazy_free, b"<think")


async def test_switch_off_leaves_formats_that_close_no_block_unchanged(make_harness: Any) -> None:
    """dsml's prompt closes a block with or without the switch; llama3-json has none."""
    dsml = await _constraints(
        make_harness,
        "dsml-v4",
        [_body(None, tool_choice="required"), _body(False, tool_choice="required")],
        '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    )
    llama = await _constraints(
        make_harness,
        "llama3-json",
        [_body(None, tool_choice="required"), _body(False, tool_choice="required")],
        json.dumps({"name": "get_weather", "parameters": {"city": "Oslo"}}),
    )
    for without, off in (dsml, llama):
        assert (without.key, without.regex, without.thinking) == (off.key, off.regex, off.thinking)
        assert off.thinking is None
