"""Budget closing's byte automaton, its C token walk and its file, on SmolLM2's vocabulary.

The automaton is read off the Index with one-byte tokens; what it says must be what the
Index says: every allowed token of a state, walked byte by byte through the table, reaches
the state `get_next_state` gives. Its distances must be consistent (every state short of
the end keeps an allowed token one step closer), and the C walk must group exactly as the
Python reference does. The server writes the tables beside the Index file; the engine's
closer loads them instead of building them, and a damaged file is ignored (logged).
"""

from __future__ import annotations

import io
import logging
import os
import random
from functools import cache
from pathlib import Path
from typing import Any

import numpy
import outlines_core
import pytest
import torch

import callgate.constraints as constraints
from callgate.constraints import closing_store
from callgate.constraints.automaton import (
    UNREACHABLE,
    ByteAutomaton,
    Spelling,
    automaton_bytes,
    automaton_from_bytes,
    build_automaton,
)
from callgate.constraints.budget import BudgetCloser, choose
from callgate.constraints.cache import DiskTier, write_framed
from callgate.constraints.walk import TokenBytes, Walker, group_by_need_reference
from tests.test_budget_closing import FORMATS, TOOLS, table

pytestmark = pytest.mark.slow

BFCL_LIKE = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "hourly": {"type": "boolean"},
                },
                "required": ["city"],
            },
        },
    },
    *TOOLS,
]


@cache
def spelling() -> Spelling:
    return Spelling.of(table().by_bytes)


@cache
def compiled(fmt: str, choice: str = "required", parallel: bool = True) -> constraints.Constraint:
    c = constraints.build(fmt, BFCL_LIKE, choice, parallel, None, table().vocabulary)
    assert c is not None
    return c


@cache
def automaton(fmt: str) -> ByteAutomaton:
    return build_automaton(compiled(fmt).index, spelling())


def sampled_states(index: Any, n: int, seed: int) -> list[int]:
    """Index states reached by random walks over allowed tokens (strings, numbers, markers)."""
    rng, found = random.Random(seed), []
    eos = table().vocabulary.eos_token_id
    while len(found) < n:
        state = index.get_initial_state()
        for _ in range(rng.randrange(1, 60)):
            allowed = [t for t in index.get_allowed_tokens(state) if t != eos]
            if not allowed:
                break
            state = index.get_next_state(state, rng.choice(allowed))
        found.append(int(state))
    return found


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_byte_table_walks_every_token_to_the_indexs_own_next_state(fmt: str) -> None:
    c, a = compiled(fmt), automaton(fmt)
    tokens = TokenBytes.of(table().by_bytes)
    eos = table().vocabulary.eos_token_id
    assert len(a.ids) == len(c.index.get_transitions())  # every Index state, no other
    for state in sampled_states(c.index, 12, seed=len(fmt)):
        for t in c.index.get_allowed_tokens(state):
            if t == eos:
                assert a.final[a.state(state)]
                continue
            s = a.state(state)
            for byte in tokens.data[tokens.offsets[t] : tokens.offsets[t + 1]].tolist():
                s = int(a.table[s, byte])
            assert a.ids[s] == c.index.get_next_state(state, t)


@pytest.mark.parametrize("fmt", FORMATS)
def test_distances_are_consistent_and_end_at_the_final_states(fmt: str) -> None:
    c, a = compiled(fmt), automaton(fmt)
    by_bytes = table().by_bytes
    assert (a.distance[a.final] == 0).all()
    for s in range(len(a.ids)):
        d = int(a.distance[s])
        if a.final[s] or d >= UNREACHABLE:
            continue
        # some allowed token leads one step closer: the text's first token, spelled
        nexts = {c.index.get_next_state(int(a.ids[s]), t) for t in c.index.get_allowed_tokens(int(a.ids[s]))}
        assert any(n is not None and a.distance[a.dense[int(n)]] == d - 1 for n in nexts), (s, d)
    text = a.shortest_text(0)
    assert text is not None and int(a.distance[0]) <= len(text)
    assert all(piece in by_bytes for piece in (text[:1], text[-1:]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_c_walk_groups_exactly_as_the_python_reference(fmt: str) -> None:
    c, a = compiled(fmt), automaton(fmt)
    t = table()
    walker = Walker(TokenBytes.of(t.by_bytes), t.vocabulary.eos_token_id, 514)
    n_words = (t.vocabulary.size + 31) // 32
    sizes = []
    widest = sorted(a.ids.tolist(), key=lambda s: len(c.index.get_allowed_tokens(s)))
    for state in [*sampled_states(c.index, 8, seed=7), widest[0], widest[-1]]:
        row = torch.zeros(n_words, dtype=torch.int32)
        guide = _guide_at(c.index, state)
        guide.write_mask_into(row.data_ptr(), row.numel(), 4)
        fast = walker.groups(a, a.state(state), row.numpy())
        slow = group_by_need_reference(a, walker.tokens, a.state(state), row.numpy(), walker.eos, walker.cap)
        assert fast.needs == slow.needs
        assert numpy.array_equal(fast.single, slow.single)
        union = fast.single[0].copy()
        for g in fast.single[1:]:
            assert not (union & g).any()  # groups are disjoint
            union |= g
        assert numpy.array_equal(union, row.numpy())  # and cover the grammar's mask
        sizes.append(int(numpy.unpackbits(row.numpy().view(numpy.uint8)).sum()))
    assert max(sizes) > 10_000 and min(sizes) < 100  # free strings and markers both walked


def _guide_at(index: Any, state: int) -> Any:
    """A Guide standing at `state` (found by a breadth-first search over allowed tokens)."""
    start = index.get_initial_state()
    paths: dict[int, list[int]] = {start: []}
    frontier = [start]
    while state not in paths:
        nxt = []
        for s in frontier:
            for t in index.get_allowed_tokens(s):
                n = index.get_next_state(s, t)
                if n is not None and n not in paths:
                    paths[n] = [*paths[s], t]
                    nxt.append(n)
        frontier = nxt
    guide = outlines_core.Guide(index)
    for t in paths[state]:
        guide.advance(t, return_tokens=False)
    return guide


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_allowed_token_needs_more_than_its_states_reach_and_skipping_changes_no_mask(fmt: str) -> None:
    """reach + 2 bounds every need the C walk finds (EOS aside), and the closer's per-state
    skip returns what the plan would: every remaining count gives the same bits."""
    c, a = compiled(fmt), automaton(fmt)
    t = table()
    closer = BudgetCloser(t.by_bytes, t.vocabulary.eos_token_id)
    closer.automata.put(c.key, a, a.nbytes)
    n_words = (t.vocabulary.size + 31) // 32
    skipped = 0
    widest = sorted(a.ids.tolist(), key=lambda s: len(c.index.get_allowed_tokens(s)))
    for state in [*sampled_states(c.index, 12, seed=11), widest[0], widest[-1]]:
        row = torch.zeros(n_words, dtype=torch.int32)
        _guide_at(c.index, state).write_mask_into(row.data_ptr(), row.numel(), 4)
        plan = closer.plan(c.key, c.index, state, row)
        dense = a.state(state)
        assert max(n for n in plan.needs if n < closer.walker.cap) <= max(int(a.reach[dense]) + 2, 1)
        for remaining in range(1, a.farthest + 3):
            chosen = choose(plan, remaining)
            planned = None if chosen is None else torch.from_numpy(chosen)
            got = closer.mask(c.key, c.index, state, remaining, row)
            skipped += remaining >= a.reach[dense] + 2  # the grammar-wide skip says no, the state says yes
            assert torch.equal(row if got is None else got, row if planned is None else planned), (state, remaining)
    assert skipped  # the per-state skip is taken, and changes nothing


def test_reach_is_the_largest_distance_within_one_token_of_bytes() -> None:
    """Against a breadth-first search over the byte table, bounded by the longest token."""
    a = automaton("qwen3-xml")
    longest = max(map(len, spelling().tokens))
    for s in random.Random(3).sample(range(len(a.ids)), 40):
        seen, frontier, best = set(), {s}, -1
        for _ in range(longest):
            frontier = {int(n) for f in frontier for n in a.table[f] if n >= 0} - seen
            if not frontier:
                break
            seen |= frontier
            best = max(best, *(int(a.distance[n]) for n in frontier))
        assert a.reach[s] == best, s


def test_the_tables_survive_their_round_trip() -> None:
    a = automaton("hermes")
    back = automaton_from_bytes(automaton_bytes(a))
    for name in ("ids", "table", "final", "distance", "to_end", "reach"):
        assert numpy.array_equal(getattr(back, name), getattr(a, name))
    assert back.dense == a.dense


@pytest.mark.parametrize(
    "damage",
    [
        lambda arrays: arrays.update(table=arrays["table"] + 10_000),  # points outside its states
        lambda arrays: arrays.update(distance=arrays["distance"].astype(numpy.int64)),  # wrong dtype
        lambda arrays: arrays.pop("final"),  # missing array
        lambda arrays: arrays.pop("reach"),  # a file of the first version
    ],
)
def test_malformed_tables_are_refused(damage: Any) -> None:
    a = automaton("hermes")
    arrays = {n: getattr(a, n) for n in ("ids", "table", "final", "distance", "to_end", "reach")}
    damage(arrays)
    out = io.BytesIO()
    numpy.savez(out, **arrays)
    with pytest.raises(ValueError):
        automaton_from_bytes(out.getvalue())
    with pytest.raises(ValueError):
        automaton_from_bytes(b"not an archive")


def test_build_writes_the_tables_beside_the_index_and_the_closer_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constraints.CACHE, "disk", DiskTier(tmp_path, max_bytes=1 << 30))
    c = constraints.build("hermes", BFCL_LIKE, "required", False, None, table().vocabulary)
    assert c is not None and c.index_path is not None
    written = closing_store.path_for(c.index_path)
    assert written.exists() and written.parent == tmp_path

    def no_build(*_: Any, **__: Any) -> None:
        raise AssertionError("the closer built tables the server had written")

    monkeypatch.setattr("callgate.constraints.budget.build_automaton", no_build)
    closer = BudgetCloser(table().by_bytes, table().vocabulary.eos_token_id)
    loaded = closer.automaton(c.key, c.index, c.index_path)
    expected = build_automaton(c.index, spelling())
    assert numpy.array_equal(loaded.distance, expected.distance) and loaded.dense == expected.dense


def test_a_damaged_tables_file_is_ignored_and_the_closer_builds_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(constraints.CACHE, "disk", DiskTier(tmp_path, max_bytes=1 << 30))
    c = constraints.build("qwen3-xml", TOOLS, "required", False, None, table().vocabulary)
    assert c is not None and c.index_path is not None
    path = closing_store.path_for(c.index_path)
    path.write_bytes(path.read_bytes()[:-5])  # truncated
    closer = BudgetCloser(table().by_bytes, table().vocabulary.eos_token_id)
    with caplog.at_level(logging.WARNING):
        found = closer.automaton(c.key, c.index, c.index_path)
    assert "corrupt" in caplog.text
    assert numpy.array_equal(found.distance, build_automaton(c.index, spelling()).distance)
    write_framed(path, closing_store.MAGIC, b"garbage")  # framed well, not an archive
    with caplog.at_level(logging.WARNING):
        assert closing_store.load(c.index_path) is None
    assert "did not load" in caplog.text


def test_tables_of_an_older_version_are_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constraints.CACHE, "disk", DiskTier(tmp_path, max_bytes=1 << 30))
    c = constraints.build("hermes", TOOLS, "required", False, None, table().vocabulary)
    assert c is not None and c.index_path is not None
    path = closing_store.path_for(c.index_path)
    write_framed(path, b"callgate-closing/1\n", b"whatever the first version wrote")
    assert closing_store.load(c.index_path) is None
    assert closing_store.persist(c.index_path, c.index, table().vocabulary) == path
    loaded = closing_store.load(c.index_path)
    assert loaded is not None and numpy.array_equal(loaded.reach, automaton_of(c).reach)


def automaton_of(c: constraints.Constraint) -> ByteAutomaton:
    return build_automaton(c.index, spelling())


def test_evicting_an_index_file_removes_its_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskTier(tmp_path, max_bytes=1 << 30)
    monkeypatch.setattr(constraints.CACHE, "disk", disk)
    first = constraints.build("hermes", TOOLS, "required", False, None, table().vocabulary)
    second = constraints.build("hermes", BFCL_LIKE, "required", False, None, table().vocabulary)
    assert first is not None and second is not None and first.index_path and second.index_path
    old, new = Path(first.index_path), Path(second.index_path)
    os.utime(old, (1, 1))  # the least recently used
    disk.max_bytes = new.stat().st_size + closing_store.path_for(new).stat().st_size
    disk.evict(keep=new)
    assert not old.exists() and not closing_store.path_for(old).exists()
    assert new.exists() and closing_store.path_for(new).exists()


def test_a_grammar_larger_than_the_state_bound_is_refused() -> None:
    with pytest.raises(LookupError, match="byte states"):
        build_automaton(compiled("hermes").index, spelling(), max_states=10)
