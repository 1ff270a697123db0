"""A streamed answer says what the non-streamed one says: for the same model output, the
concatenated `content` and `reasoning_content` deltas equal the message's `content` and
`reasoning_content`, and the finish reasons agree, however the output is split into deltas
and however it ends (EOS, a stop string, max_tokens), with text the parser held back as a
possible marker start (`<`, `<tool_c`, `<|im_`, `<think`, a separator newline) at the end.
Through the real app, the real hermes parser and a scripted FakeEngine."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests import test_server_app
from tests.harness import check_split_invariance, random_split, streamed_text
from tests.test_server_app import ASK, MODEL, WEATHER

make_harness = test_server_app.make_harness  # the app harness fixture

# Pieces of text that never join into a whole marker (no `>`), so every reply is an answer.
_PIECES = ("Hi", " ", "a<b", "\n", "<", "<tool_c", "<|im_", "<think", "</think", "</tool", "{", "[", "2.", "é", "漢🙂")
_THOUGHT = _PIECES  # a stop string may end the reply inside its reasoning block
_ENDINGS = ("", "<", "<tool_c", "<tool_call", "<|im_", "<|im_end|", "<think", "</think", "\n", "\n\n", "<tool_res")
_MODES: dict[str, dict[str, Any]] = {
    "no tools": {},
    "tool_choice none": {"tools": [WEATHER], "tool_choice": "none"},
    "tool_choice auto": {"tools": [WEATHER]},
    "engine stop": {"stop": ["2.", "é"]},  # no tools (hermes reads reasoning: stop_filter.py still)
    "filtered stop": {"tools": [WEATHER], "stop": ["2.", "é"]},  # calls possible: stop_filter.py
    "max_tokens": {"max_tokens": 5},  # the fake counts one token per delta
}


def _reply(rng: random.Random, reasoning: bool) -> str:
    body = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 8))) + rng.choice(_ENDINGS)
    if reasoning and rng.random() < 0.3:  # a closed reasoning block first
        thought = "".join(rng.choice(_THOUGHT) for _ in range(rng.randint(1, 4)))
        body = f"<think>\n{thought}\n</think>\n\n{body}"
    return body


async def _check(make_harness: Any, text: str, pieces: list[str], mode: str) -> None:
    h = make_harness([pieces, pieces])
    body = {"model": MODEL, "messages": ASK, **_MODES[mode]}
    resp = await h.post(body)
    assert resp.status_code == 200, (mode, text, resp.text)
    choice = resp.json()["choices"][0]
    message = choice["message"]
    expected = (message["content"] or "", message.get("reasoning_content") or "", [choice["finish_reason"]])
    assert streamed_text(await h.events(body)) == expected, (mode, text, pieces)


@pytest.mark.parametrize("mode", sorted(_MODES))
async def test_streamed_text_equals_the_non_streamed_text(make_harness: Any, mode: str) -> None:
    rng = random.Random(f"parity-{mode}")
    for _ in range(25):
        text = _reply(rng, reasoning=mode != "max_tokens")  # a reasoning block cut open is a 502
        await _check(make_harness, text, random_split(text, rng, max_piece=rng.choice((1, 3, 8))), mode)


@pytest.mark.parametrize(
    ("text", "mode", "content"),
    [
        ("Use a<b and b <", "no tools", "Use a<b and b <"),
        ("Hi <tool_c", "tool_choice none", "Hi <tool_c"),
        ("Hi <tool_c", "tool_choice auto", "Hi <tool_c"),
        ("1. Bananas\n2. Apples", "engine stop", "1. Bananas\n"),  # QA B5 on the real model
        ("1. Bananas\n2. Apples", "filtered stop", "1. Bananas\n"),
    ],
)
async def test_held_back_text_is_streamed_at_the_end(make_harness: Any, text: str, mode: str, content: str) -> None:
    await _check(make_harness, text, list(text), mode)
    h = make_harness([list(text)])
    assert streamed_text(await h.events({"model": MODEL, "messages": ASK, **_MODES[mode]}))[0] == content


@pytest.mark.parametrize("fmt", ["hermes", "llama3-json", "mistral", "qwen3-xml", "dsml-v4"])
@pytest.mark.parametrize("ending", ["<", "<tool_c", "<|im_", "<think", "[", "{", "\n", "<｜DSML"])
def test_finish_sends_the_text_it_releases(fmt: str, ending: str) -> None:
    """Each format's parser, any split: the text deltas (those of `finish()` included) are
    the content (tests/harness.py `assert_events_carry_result`)."""
    result = check_split_invariance(fmt, "Use a<b and b " + ending, splits=20)
    assert result.content == "Use a<b and b " + ending
