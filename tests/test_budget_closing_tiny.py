"""Budget closing on the tiny test vocabulary of test_processor (fast, no tokenizer).

Exact masks for each regime of budget.py (slack above, at and below zero), the bit packing
against the kernels' reference layout, and the distances against a brute-force count.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.constraints.automaton import Spelling, build_automaton
from callgate.constraints.budget import SizedLRU
from callgate.constraints.free_text import CONTENT, FreeText, begun_prefix
from callgate.constraints.late_trigger import TriggerGuard
from callgate.constraints.processor import RowSpec, row_spec
from callgate.constraints.walk import pack_bits
from callgate.kernels.reference import allowed_matrix
from tests.test_processor import EOS, PIECES, TABLE, TEXT, VOCAB, Params, TinyBatch, Update, constrained, new_batch


@dataclass
class BudgetParams(Params):
    max_tokens: int | None = None


def allowed_after(
    regex: str, output: list[int], max_tokens: int | None, trigger: str | None = None, closing: bool | None = None
) -> set[int]:
    """The tokens allowed next; max_tokens - len(output) tokens are left, this one included.
    `closing` set: the request says `"budget_closing": closing` (absent by default)."""
    batch = TinyBatch(None, "cpu", False)
    extra = constrained(regex, trigger=trigger).extra_args or {}
    if closing is not None:
        extra = {"callgate": {**extra["callgate"], "budget_closing": closing}}
    params = BudgetParams(extra, max_tokens)
    batch.update_state(Update(1, added=[(0, params, None, list(output))]))
    logits = batch.apply(torch.zeros(1, VOCAB))
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


A, B, C, AB = PIECES[b"a"][0], PIECES[b"b"][0], PIECES[b"c"][0], PIECES[b"ab"][0]


def test_far_from_the_budget_the_grammar_decides() -> None:
    assert allowed_after("a(?:bbbbbb)?c", [A], None) == {B, C}
    assert allowed_after("a(?:bbbbbb)?c", [A], 100) == {B, C}


def test_a_token_that_opens_more_than_the_budget_can_close_is_masked() -> None:
    # after "a": "c" then EOS needs 2; "b" needs 5 more b's, "c" and EOS: 8
    assert allowed_after("a(?:bbbbbb)?c", [A], 1 + 8) == {B, C}
    assert allowed_after("a(?:bbbbbb)?c", [A], 1 + 7) == {C}


def test_with_no_slack_the_shortest_completion_is_followed() -> None:
    assert allowed_after("a+b", [], 2) == {AB}  # "ab" then EOS: the only way in 2
    assert allowed_after("a+b", [A], 1 + 2) == {B, AB}  # then EOS, exactly at max_tokens
    assert allowed_after("a+b", [A, B], 2 + 1) == {EOS}
    assert allowed_after("a+b", [A], 1 + 3) == {A, B, AB}  # slack: the model chooses


def test_below_the_shortest_output_the_grammars_mask_stands() -> None:
    assert allowed_after("ab(?:c)c", [], 1) == allowed_after("ab(?:c)c", [], None) == {A, AB}


def test_a_model_that_never_stops_ends_at_exactly_max_tokens() -> None:
    for max_tokens in range(3, 12):
        batch = TinyBatch(None, "cpu", False)
        out: list[int] = []
        batch.update_state(Update(1, added=[(0, BudgetParams(constrained("ca+b").extra_args, max_tokens), None, out)]))
        while len(out) < max_tokens and EOS not in out:
            logits = torch.zeros(1, VOCAB)
            logits[0, A] = 10.0  # always another "a" if it may
            out.append(int(batch.apply(logits)[0].argmax()))
        assert len(out) == max_tokens and out[-1] == EOS
        assert re.fullmatch("ca+b", b"".join(TEXT[i] for i in out[:-1]).decode())


@pytest.mark.parametrize("regex", ["a+b", "ca+b", "a(?:bbbbbb)?c", "<call>\\{x+\\}", "(?:ab|c)+x"])
def test_distances_match_a_brute_force_count(regex: str) -> None:
    index = new_batch()._new_row(constrained(regex), []).index  # type: ignore[union-attr]
    automaton = build_automaton(index, Spelling.of(TABLE.by_bytes))
    pieces = [i for ids in PIECES.values() for i in ids]
    state = index.get_initial_state()
    fewest = next(
        n
        for n in range(1, 8)
        if any(
            re.fullmatch(regex, b"".join(TEXT[t] for t in seq).decode()) for seq in itertools.product(pieces, repeat=n)
        )
    )
    assert automaton.distance[automaton.state(state)] == fewest


def test_bits_are_packed_as_the_kernels_read_them() -> None:
    ids = [0, 1, 31, 32, 63, 64, 95]
    words = pack_bits(ids, 4).unsqueeze(0)
    assert words.dtype == torch.int32
    assert allowed_matrix(words, 128)[0].nonzero().flatten().tolist() == ids


def test_a_trigger_spelled_byte_by_byte_is_found() -> None:
    # The free-text tail once kept too few bytes while shorter than the trigger, so
    # "<", "c", "a", "l", "l", ">" never matched "<call>" (SmolLM2 spells "<tool_call>" in 5 tokens).
    out = [PIECES[b"<"][0], C, A, PIECES[b"l"][0], PIECES[b"l"][0], PIECES[b">"][0]]
    assert allowed_after(r"<call>\{x+\}", out, None, "<call>") == {PIECES[b"{"][0]}


def test_a_trigger_that_could_not_close_in_time_is_held_back() -> None:
    regex = r"<call>\{x+\}"  # the shortest call: "<call>", "{", "x", "}" then EOS
    lt, call = PIECES[b"<"][0], PIECES[b"call"][0]
    assert allowed_after(regex, [A], 1 + 6, "<call>") == set(range(VOCAB))  # 4 tokens and EOS fit in 6
    held = allowed_after(regex, [A], 1 + 4, "<call>")
    assert held == set(range(VOCAB)) - {PIECES[b"<call>"][0]}  # "<" may still begin free text
    completing = {PIECES[p][0] for p in (b"<call>", b">", b">{", b">x")}  # after "<call"
    assert allowed_after(regex, [A, lt, call], 3 + 4, "<call>") == set(range(VOCAB)) - completing


GUARD = TriggerGuard(TEXT)  # one guard for every example: its kept rows are reused across tails
BARE: dict[bytes, FreeText] = {}  # rules of the trigger alone (a guard keeps its rows per rules object)


def bare(trigger: bytes) -> FreeText:
    return BARE.setdefault(trigger, FreeText(trigger))


@settings(max_examples=200, deadline=None)
@given(tail=st.text("<calbx>{", max_size=7), trigger=st.sampled_from(["<call>", "<c<call>", "abab"]))
def test_the_guard_bans_exactly_the_tokens_that_complete_the_trigger(tail: str, trigger: str) -> None:
    raw, data = trigger.encode(), tail.encode()[-(len(trigger) - 1) :]  # the row keeps len - 1 bytes
    if raw in data:
        return  # a row whose tail held the trigger would have started its grammar
    banned = {t for t, piece in TEXT.items() if raw in data + piece}
    row = torch.from_numpy(GUARD.row(bare(raw), (CONTENT, data), 2, held=True)[0]).unsqueeze(0)
    assert set(allowed_matrix(row, 64)[0].nonzero().flatten().tolist()) == set(range(64)) - banned


@pytest.mark.parametrize("trigger", ["<call>", "<c<call>", "abab", "[T]"])
def test_marks_flag_exactly_the_tokens_that_can_begin_or_contain_the_trigger(trigger: str) -> None:
    raw = trigger.encode()
    marks = GUARD.marks(bare(raw))
    expected = {t for t, p in TEXT.items() if raw in p or any(p.endswith(raw[:m]) for m in range(1, len(raw)))}
    assert {t for t in range(len(marks)) if marks[t]} == expected
    assert expected and len(marks) == max(TEXT) + 1


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.sampled_from(sorted(TEXT)), max_size=14), trigger=st.sampled_from(["<call>", "abab", "[T]"]))
def test_a_lazy_row_sees_its_trigger_exactly_where_the_text_holds_it(tokens: list[int], trigger: str) -> None:
    """Token by token (most skipped by the marks), the row starts its grammar at the first
    token whose text completes the trigger, and until then it keeps the trigger's prefix
    the text ends with, so its guard bans exactly the tokens that would complete it."""
    raw = trigger.encode()
    batch, out, text = TinyBatch(None, "cpu", False), [], b""
    batch.update_state(Update(1, added=[(0, constrained(re.escape(trigger) + "[abcx]*", trigger=trigger), None, out)]))
    for token in [*tokens, EOS]:
        batch.apply(torch.zeros(1, VOCAB))
        row = batch.rows[0]
        if raw in text:
            assert row.guide is not None or row.failed
            return
        assert row.guide is None and row.tail == begun_prefix(text, raw)
        banned = {t for t, piece in TEXT.items() if raw in text[-len(raw) :] + piece}
        mask = torch.from_numpy(batch.guard.row(row.rules, (row.phase, row.tail), 2, held=True)[0]).unsqueeze(0)
        assert set(allowed_matrix(mask, 64)[0].nonzero().flatten().tolist()) == set(range(64)) - banned
        out.append(token)
        text += TEXT[token]


def test_a_request_that_opts_out_of_budget_closing_keeps_the_grammars_mask() -> None:
    assert allowed_after("a+b", [], 2, closing=True) == {AB}  # the default: closed within 2
    assert allowed_after("a+b", [], 2, closing=False) == allowed_after("a+b", [], None) == {A, AB}
    assert allowed_after("a(?:bbbbbb)?c", [A], 1 + 7, closing=False) == {B, C}
    held = allowed_after(r"<call>\{x+\}", [A], 1 + 4, "<call>", closing=False)
    assert held == set(range(VOCAB))  # a lazy row's late trigger is not held back either


@pytest.mark.parametrize("bad", [0, 1, "false"])
def test_budget_closing_must_be_a_boolean(bad: object) -> None:
    extra = {"callgate": {"key": "k", "regex": "a+b", "budget_closing": bad}}
    with pytest.raises(ValueError, match="budget_closing"):
        row_spec(extra)
    unset = row_spec({"callgate": {"key": "k", "regex": "a+b", "budget_closing": None}})
    assert unset is not None and unset.budget_closing  # null: the default, on
    assert row_spec({"callgate": {"key": "k", "regex": "a+b", "budget_closing": False}}) == RowSpec(
        "k", "a+b", None, None, False
    )


def test_plans_and_automata_are_kept_within_their_byte_budget() -> None:
    lru: SizedLRU[str, int] = SizedLRU(budget_bytes=10)
    lru.put("a", 1, 4)
    lru.put("b", 2, 4)
    assert lru.get("a") == 1  # now the most recently used
    lru.put("c", 3, 4)  # 12 bytes: the least recently used ("b") goes
    assert (lru.get("b"), lru.get("a"), lru.get("c"), lru.used_bytes) == (None, 1, 3, 8)
    lru.put("big", 4, 100)  # larger than the budget: kept alone, as the newest
    assert len(lru) == 1 and lru.get("big") == 4
