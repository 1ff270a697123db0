"""Budget closing keeps its plan between steps (callgate.decoding.budget): a kept plan, or a
tail of it, is used while it still ends the grammar from the row's new state, a grammar's
plan from its start and its byte twin are made once. Whatever a step's plan came from, it
must end the grammar from that step's state: checked at every step of random outputs, on
the real matchers (the byte twin and the row's own)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import callgate.constraints as constraints
from callgate.constraints.llg import LlgVocabulary
from callgate.decoding.closing import format_closers
from callgate.decoding.processor import ConstrainedBatch
from callgate.decoding.rows import Row
from callgate.formats import get_format
from callgate.parsers import parse
from tests.llg_harness import EOS
from tests.test_decoding_processor import NAMED, WEATHER, WIDTH, ByteBatch, Update, V, allowed, of, params

FILES = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"enum": ["w", "a"]}},
                "required": ["path", "content", "mode"],
            },
        },
    },
    *WEATHER,
]


def ends(m: Any, tokens: list[int]) -> bool:
    """Whether `tokens` take a copy of matcher `m` to an accepting state."""
    probe = m.deep_copy()
    return bool(probe.try_consume_tokens(tokens) == len(tokens) and probe.is_accepting())


def check_plan(batch: ByteBatch, row: Row) -> bool | None:
    """The row's plan ends the grammar on its twin and on its matcher; whether it was kept
    (None: the row plans no more, it follows a committed plan or is past its grammar's end,
    or it was not looked at this step)."""
    kept = row.kept
    if kept is None or row.plan is not None or row.checked_at != len(row.output):
        return None  # (not looked at this step: a free row far from its budget)
    twin = batch.closing._twins[row.spec.key].deep_copy()
    assert twin.try_consume_tokens(list(row.text)) == len(row.text)
    assert ends(twin, list(kept.data)), (bytes(row.text), kept.data)
    assert ends(row.matcher, kept.tokens), (bytes(row.text), kept.data, kept.tokens)
    assert bytes(b for t in kept.tokens for b in batch.pieces[t]) == kept.data
    return row.kept_reused


# budgets that hold the chosen tool's shortest call (write_file's is ~150 bytes in qwen3-xml)
CASES = [
    (fmt, tools, choice, max_tokens)
    for fmt in ("hermes", "mistral", "llama3-json", "qwen3-xml")
    for tools, choice, budgets in ((WEATHER, NAMED, (90, 200)), (FILES, "required", (180, 260)))
    for max_tokens in budgets
]


@pytest.mark.parametrize(
    ("fmt", "tools", "choice", "max_tokens"),
    CASES,
    ids=[f"{c[0]}-{len(c[1])}-{c[3]}" for c in CASES],
)
def test_every_plan_ends_the_grammar_from_its_step(fmt: str, tools: list[Any], choice: Any, max_tokens: int) -> None:
    spec = of(constraints.build(fmt, tools, choice, fmt != "mistral", None, V))
    kept = free = 0
    for seed in range(3):
        batch = ByteBatch(None, "cpu", False)
        out: list[int] = []
        batch.update_state(Update(added=[(0, params(spec, max_tokens), None, out)]))
        g = torch.Generator().manual_seed(seed)
        # printable bytes likelier, so that string values run on (where a plan is kept)
        bias = torch.zeros(WIDTH)
        bias[ord("a") : ord("z") + 1] = 2.0
        for _ in range(max_tokens):
            logits = torch.randn(1, WIDTH, generator=g) + bias
            logits[0, EOS] -= 3
            batch.apply(logits)
            reused = check_plan(batch, batch.rows[0])
            free += reused is not None
            kept += bool(reused)
            t = int(torch.argmax(logits[0]))
            if t == EOS:
                break
            out.append(t)
        assert len(out) <= max_tokens
        result = parse(fmt, bytes(out).decode() + get_format(fmt).eos, tools)
        assert result.diagnostics == () and result.candidates, bytes(out)
    assert kept or free < 10, "no step kept its plan: the reuse path was not exercised"


def test_a_grammar_s_twin_and_start_plan_are_made_once() -> None:
    spec = of(constraints.build("hermes", WEATHER, "required", True, None, V))
    batch = ByteBatch(None, "cpu", False)
    outs: list[list[int]] = [[], []]
    batch.update_state(Update(added=[(0, params(spec, 128), None, outs[0])]))
    batch.apply(torch.zeros(1, WIDTH))
    first = batch.rows[0]
    assert first.kept is not None and not first.kept_reused  # planned from the start
    batch.update_state(Update(added=[(1, params(spec, 128), None, outs[1])]))
    batch.apply(torch.zeros(2, WIDTH))
    second = batch.rows[1]
    assert second.kept_reused and second.kept == batch.closing._start_plans[spec["key"]]
    assert len(batch.closing._twins) == 1 and second.twin is not first.twin


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-xml"])
def test_a_free_row_far_from_its_budget_is_looked_at_only_now_and_then(fmt: str) -> None:
    """While one margin per token could not bring the plan to the budget, the row is not
    looked at: far fewer plans than steps, and the call still closes within max_tokens."""
    spec = of(constraints.build(fmt, FILES, "required", True, None, V))
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = []
    batch.update_state(Update(added=[(0, params(spec, 500), None, out)]))
    g = torch.Generator().manual_seed(5)
    bias = torch.zeros(WIDTH)
    bias[ord("a") : ord("z") + 1] = 3.0  # a long string value: the plan stays as it is
    free = looked = 0
    for _ in range(500):
        logits = torch.randn(1, WIDTH, generator=g) + bias
        logits[0, EOS] -= 3
        batch.apply(logits)
        row = batch.rows[0]
        if row.plan is None and not row.matcher.is_accepting():
            free += 1
            looked += row.checked_at == len(out)
        t = int(torch.argmax(logits[0]))
        if t == EOS:
            break
        out.append(t)
    assert free > 300 and looked < free / 2, (free, looked)
    assert len(out) <= 500 and batch.rows[0].plan is not None  # closed by its plan
    result = parse(fmt, bytes(out).decode() + get_format(fmt).eos, FILES)
    assert result.diagnostics == () and result.candidates, bytes(out)


def marker_vocabulary(fmt: str) -> LlgVocabulary:
    """The byte vocabulary plus one token for each of `fmt`'s closers (`\\n</parameter>`
    and the like), as a real vocabulary spells them: a closing plan of a few tokens."""
    by_bytes: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256)}
    for i, text in enumerate(sorted(format_closers(fmt))):
        by_bytes.setdefault(text, [257 + i])
    return LlgVocabulary.build(by_bytes, EOS, {EOS: "<eos>"}, 257 + len(format_closers(fmt)))


@pytest.mark.parametrize(
    "fmt, head",
    [
        ("qwen3-xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOs"),
        (
            "dsml-v4",
            '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Os',
        ),
    ],
)
def test_a_raw_value_is_not_cut_because_another_call_would_not_fit(fmt: str, head: str) -> None:
    """Inside a parameter's raw value the call is not whole: its plan closes the value
    (`</parameter>`), which cuts it. Where the budget holds that plan and a margin but not
    another call, the row still writes its value; it follows the plan only where the plan
    itself needs the room."""
    vocab = marker_vocabulary(fmt)

    class MarkerBatch(ConstrainedBatch):
        def load_tokens(self) -> Any:
            return vocab

    spec = of(constraints.build(fmt, WEATHER, NAMED, True, None, vocab))
    free_without_room = 0
    for left in range(2, 120):
        batch = MarkerBatch(None, "cpu", False)
        out = list(head.encode())
        batch.update_state(Update(added=[(0, params(spec, len(out) + left), None, out)]))
        logits = torch.zeros(1, vocab.size)
        logits[0, ord("l")] = 5.0
        admitted = allowed(batch.apply(logits)[0])
        row = batch.rows[0]
        if row.plan is None:
            assert ord("l") in admitted, left
            plan = row.kept.tokens if row.kept is not None else []
            free_without_room += row.call_cost is not None and left <= row.call_cost + len(plan) + 1
        else:
            assert left <= len(row.plan) + 1 + batch.closing._margin(row), (left, row.plan)
    assert free_without_room > 0


@pytest.mark.parametrize(
    "fmt, head, closer",
    [
        ("qwen3-xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\n", "\n</parameter>"),
        (
            "dsml-v4",
            '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">',
            "</｜DSML｜parameter>",
        ),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "', '"'),
    ],
)
def test_a_row_in_its_last_value_rests_until_it_writes_the_value_s_closer(fmt: str, head: str, closer: str) -> None:
    """Where the budget could not hold another call, a row is ended as soon as its call is
    whole — but inside the call's last value (a raw value, a JSON string) the call cannot
    become whole before the row writes the value's closer: it is not looked at every step
    there, and it is still ended on the step the closer is written, before it can start
    another call."""
    vocab = marker_vocabulary(fmt)

    class MarkerBatch(ConstrainedBatch):
        def load_tokens(self) -> Any:
            return vocab

    spec = of(constraints.build(fmt, WEATHER, "required", True, None, vocab))
    probe = MarkerBatch(None, "cpu", False)
    probe.update_state(Update(added=[(0, params(spec, len(head) + 100), None, list(head.encode()))]))
    probe.apply(torch.zeros(1, vocab.size))
    cost = probe.rows[0].call_cost
    assert cost is not None and cost > 30
    # the budget holds the value, its plan and a margin, never another call on top
    value = ("a city by the fjord with a long name " * 4)[: cost - 20]
    out = list(head.encode())
    batch = MarkerBatch(None, "cpu", False)
    batch.update_state(Update(added=[(0, params(spec, len(out) + len(value) + 20), None, out)]))
    script = [*value.encode(), *vocab.tokenizer.tokenize_bytes(closer.encode())]
    looked = 0
    for t in script:
        logits = torch.zeros(1, vocab.size)
        logits[0, t] = 5.0
        admitted = allowed(batch.apply(logits)[0])
        row = batch.rows[0]
        assert row.plan is None and t in admitted, (bytes(out), row.plan)  # free: the row writes its value
        plan = row.kept.tokens if row.kept is not None else []
        assert row.remaining() <= cost + len(plan) + 1  # no room for another call
        looked += row.checked_at == len(out)
        out.append(t)
    # the closer written, the call is whole and another would not fit: the row is ended
    row = batch.rows[0]
    admitted = allowed(batch.apply(torch.zeros(1, vocab.size))[0])
    assert row.plan is not None and all(t in [*row.plan, EOS] for t in admitted), (bytes(out), row.plan, admitted)
    assert looked < len(script) * 2 / 3, (looked, len(script))
