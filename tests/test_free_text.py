"""Free-text rules (grammar.free_text) against the strict parsers, for every lazy format.

A lazy `auto` row writes free text until its trigger; the processor holds that text to the
rules grammar.free_text derives from the format's eager content pieces. Whatever the rules
let a row write and end with must parse with no diagnostic (the parser would answer 502),
and each marker the format names is kept out of content, while the trigger still starts
the call. Pure: no vocabulary, the text is walked in pieces as a model would write it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.constraints.free_text import CALL, FreeText, State
from callgate.constraints.grammar import free_text
from callgate.formats import get_format
from callgate.parsers import parse

LAZY = ["hermes", "qwen3-xml", "mistral", "dsml-v4", "dsml-v3.2"]


def rules_of(name: str) -> FreeText:
    return free_text(name, get_format(name).call_trigger.encode())


def walk(rules: FreeText, pieces: list[bytes]) -> State | None:
    """The state after the pieces (None: a piece broke the rules; stops at the trigger)."""
    state: State | None = rules.start()
    for piece in pieces:
        assert state is not None
        state = rules.step(state, piece)
        if state is None or state[0] == CALL:
            return state
    return state


def allowed_to_end(rules: FreeText, pieces: list[bytes]) -> bool:
    state = walk(rules, pieces)
    return state is not None and state[0] != CALL and rules.may_end(state)


# call tags that are not control tokens, by their formats.py names (the parsers reject them in content)
TAGS = {
    "qwen3-xml": ("function_open", "function_close", "parameter_open", "parameter_close"),
    "dsml": ("dsml", "block_open", "block_close", "invoke_open", "invoke_close", "param_open", "param_close"),
}


def named_markers(name: str) -> list[str]:
    """The format's control tokens and call tags, as formats.py names them, but the trigger
    and EOS (as text, EOS ends the turn: the EOS token is the engine's business)."""
    fmt = get_format(name)
    tags = [fmt.markers[k] for k in TAGS.get(fmt.family, ())]
    return sorted({*fmt.special_tokens, *tags} - {fmt.call_trigger, fmt.eos})


@pytest.mark.parametrize("name", LAZY)
def test_no_named_marker_can_stand_in_free_text(name: str) -> None:
    rules = rules_of(name)
    for marker in named_markers(name):
        text = f"Hi {marker} there".encode()
        assert not allowed_to_end(rules, [bytes([b]) for b in text]), marker
        assert not allowed_to_end(rules, [b"Hi ", marker.encode(), b" there"]), marker


@pytest.mark.parametrize("name", LAZY)
def test_the_trigger_still_starts_the_call(name: str) -> None:
    trigger = get_format(name).call_trigger.encode()
    rules = rules_of(name)
    for pieces in ([b"Sure.", trigger, b"\n"], [b"Sure.", *(bytes([b]) for b in trigger)], [trigger]):
        state = walk(rules, pieces)
        assert state is not None and state[0] == CALL and state[1].startswith(trigger)


def test_the_qa_output_is_refused_in_hermes_free_text() -> None:
    # QA finding 2: SmolLM2 imitates the tool-result wrapper after a tool message
    rules = rules_of("hermes")
    pieces = [b"<", b"tool", b"_", b"response", b">", b"\n", b"{}"]
    assert walk(rules, pieces[:4]) is not None  # "<tool_response" is still plain text
    assert walk(rules, pieces[:5]) is None
    assert parse("hermes", "<tool_response>\n{}").diagnostics[0].code == "special_token_in_content"


def test_a_leading_reasoning_block_is_read_as_eager_auto_reads_it() -> None:
    rules = rules_of("hermes")
    assert allowed_to_end(rules, [b"<think>", b"plan", b"</think>", b"\n\nHi"])
    assert not allowed_to_end(rules, [b"<think>", b"plan"])  # an open block may not end the output
    assert walk(rules, [b"<think>", b"call <tool_call>"]) is None  # no call inside reasoning
    assert walk(rules, [b"Hi <think>"]) is None  # only at the very start
    state = walk(rules, [b"<think>", b"</think>", b"<tool_call>"])
    assert state is not None and state[0] == CALL


def test_dsml_allows_its_bar_only_inside_the_trigger() -> None:
    rules = rules_of("dsml-v4")
    begun = [b"Hi", b"\n\n<", "｜DSML｜".encode()]
    state = walk(rules, begun)
    assert state is not None and rules.pending(state) and not rules.may_end(state)
    assert walk(rules, [*begun, b"invoke"]) is None  # a wrong block name
    assert walk(rules, [b"Hi <", "｜DSML｜".encode()]) is None  # no blank line before it


FRAGMENTS = {
    name: sorted(
        {
            *named_markers(name),
            *(m[: len(m) // 2] for m in named_markers(name)),
            *(m[len(m) // 2 :] for m in named_markers(name)),
            *(get_format(name).reasoning_open or "", get_format(name).reasoning_close or ""),
            *("Hi", " ", "\n", "<", ">", "/", "｜", "a"),
        }
        - {""}
    )[:400]
    for name in LAZY
}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), name=st.sampled_from(LAZY))
def test_text_the_rules_let_a_row_end_with_parses_cleanly(data: st.DataObject, name: str) -> None:
    pieces = data.draw(st.lists(st.sampled_from(FRAGMENTS[name]), max_size=8))
    raw = [p.encode() for p in pieces]
    if allowed_to_end(rules_of(name), raw):
        result = parse(name, "".join(pieces))
        assert result.diagnostics == (), (pieces, result.diagnostics)
