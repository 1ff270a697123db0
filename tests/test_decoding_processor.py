"""callgate.decoding.processor.ConstrainedBatch driven as vLLM drives it, over a byte vocabulary.

Batch updates are vLLM v1's shapes (removed, then added with a live output list, then moved
with a direction), the logits random or zeros; every grammar is a real llguidance grammar
(callgate.constraints.build or a Lark text), every output is judged by the real parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import callgate.constraints as constraints
from callgate.constraints.llg import LlgVocabulary, matcher
from callgate.decoding.budget import shortest_output_tokens
from callgate.decoding.closing import closing_plan, format_closers
from callgate.decoding.processor import ConstrainedBatch
from callgate.decoding.timings import STEP_TIMINGS
from callgate.formats import get_format
from callgate.parsers import parse
from tests.llg_harness import EOS, byte_vocabulary, consume_text

V = byte_vocabulary()
WIDTH = 257
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class ByteBatch(ConstrainedBatch):
    def load_tokens(self) -> Any:
        return V


@dataclass
class Update:
    removed: list[int] = field(default_factory=list)
    added: list[tuple[int, Any, list[int] | None, list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, Any]] = field(default_factory=list)


SWAP, ONE_WAY = SimpleNamespace(name="SWAP"), SimpleNamespace(name="UNIDIRECTIONAL")


def lark(body: str, key: str) -> dict[str, Any]:
    """extra_args["callgate"] of a Lark grammar `start: body`."""
    text = f"%llguidance {{}}\nstart: {body}\n"
    return {"key": key, "grammar": text, "plain": text, "mode": "required", "trigger": None}


def of(c: constraints.Constraint | None) -> dict[str, Any]:
    assert c is not None
    ref = c.ref()
    return {f: getattr(ref, f) for f in ref.__dataclass_fields__}


def params(spec: dict[str, Any] | None, max_tokens: int | None = None) -> Any:
    return SimpleNamespace(extra_args=None if spec is None else {"callgate": spec}, max_tokens=max_tokens)


def allowed(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def step(batch: ConstrainedBatch, rows: int) -> torch.Tensor:
    return batch.apply(torch.zeros(rows, WIDTH))


def test_masks_land_on_their_rows_and_leave_others_alone() -> None:
    batch = ByteBatch(None, "cpu", False)
    batch.update_state(
        Update(
            added=[
                (0, params(lark("/a+b/", "ab")), None, []),
                (1, params(None), None, []),
                (2, params(lark('"c"', "c")), None, []),
            ]
        )
    )
    logits = step(batch, 3)
    assert allowed(logits[0]) == {ord("a")}
    assert allowed(logits[1]) == set(range(WIDTH))
    assert allowed(logits[2]) == {ord("c")}
    assert batch.masked == 2


def test_added_removed_moved_and_swapped_rows_keep_their_grammars() -> None:
    batch = ByteBatch(None, "cpu", False)
    a_out: list[int] = []
    c_out: list[int] = []
    batch.update_state(
        Update(added=[(0, params(lark("/a+b/", "ab")), None, a_out), (1, params(lark('"c"', "c")), None, c_out)])
    )
    a_out.append(ord("a"))  # row 0 has written "a": "a" or "b" next
    batch.update_state(Update(moved=[(1, 3, ONE_WAY)]))  # row 1 moves to the empty slot 3
    logits = step(batch, 4)
    assert allowed(logits[0]) == {ord("a"), ord("b")} and allowed(logits[3]) == {ord("c")}
    assert allowed(logits[1]) == set(range(WIDTH))  # the slot it left is free
    batch.update_state(Update(moved=[(0, 3, SWAP)]))
    logits = step(batch, 4)
    assert allowed(logits[3]) == {ord("a"), ord("b")} and allowed(logits[0]) == {ord("c")}
    d_out: list[int] = []
    batch.update_state(Update(removed=[3], added=[(3, params(lark('"d"', "d")), None, d_out)]))
    logits = step(batch, 4)
    assert allowed(logits[3]) == {ord("d")} and allowed(logits[0]) == {ord("c")}
    batch.update_state(Update(removed=[0, 3]))
    assert not batch.rows and allowed(step(batch, 4)[0]) == set(range(WIDTH))


def test_a_refused_token_leaves_the_row_unconstrained() -> None:
    """Another processor changed the sampled token: the row is not masked any more (the
    strict parser judges the output), and the other rows go on."""
    batch = ByteBatch(None, "cpu", False)
    bad: list[int] = []
    good: list[int] = []
    batch.update_state(
        Update(added=[(0, params(lark("/a+b/", "ab")), None, bad), (1, params(lark("/a+b/", "ab")), None, good)])
    )
    step(batch, 2)
    bad.append(ord("z"))
    good.append(ord("a"))
    logits = step(batch, 2)
    assert batch.rows[0].failed and allowed(logits[0]) == set(range(WIDTH))
    assert not batch.rows[1].failed and allowed(logits[1]) == {ord("a"), ord("b")}


def test_a_stopped_grammar_admits_only_eos() -> None:
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = [ord("a"), ord("b")]
    batch.update_state(Update(added=[(0, params(lark('"ab"', "ab-literal")), None, out)]))
    assert allowed(step(batch, 1)[0]) == {EOS}


def run(spec: dict[str, Any], max_tokens: int, seed: int, bias: dict[int, float] | None = None) -> tuple[str, Any]:
    """Random logits (EOS made less likely) sampled by argmax until EOS or `max_tokens`."""
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = []
    batch.update_state(Update(added=[(0, params(spec, max_tokens), None, out)]))
    g = torch.Generator().manual_seed(seed)
    for _ in range(max_tokens):
        logits = torch.randn(1, WIDTH, generator=g)
        logits[0, EOS] -= 3
        for t, v in (bias or {}).items():
            logits[0, t] += v
        batch.apply(logits)
        t = int(torch.argmax(logits[0]))
        if t == EOS:
            break
        out.append(t)
    return bytes(out).decode(), batch.rows[0]


CLOSING = [
    (fmt, label, choice, max_tokens)
    for fmt in ("hermes", "mistral", "llama3-json")
    for label, choice in (("required", "required"), ("named", NAMED))
    for max_tokens in (100, 160, 400)
]


@pytest.mark.parametrize(
    ("fmt", "label", "choice", "max_tokens"), CLOSING, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CLOSING]
)
def test_budget_closing_closes_a_call_within_max_tokens(fmt: str, label: str, choice: Any, max_tokens: int) -> None:
    """Parallel calls allowed, except mistral's (see the xfail below)."""
    spec = of(constraints.build(fmt, WEATHER, choice, fmt != "mistral", None, V))
    for seed in range(3):
        check_closed(fmt, spec, max_tokens, seed=max_tokens * 10 + seed)


def check_closed(fmt: str, spec: dict[str, Any], max_tokens: int, seed: int) -> None:
    text, row = run(spec, max_tokens, seed)
    result = parse(fmt, text + get_format(fmt).eos, WEATHER)
    assert len(text.encode()) <= max_tokens and not row.failed
    assert result.diagnostics == (), (text, result.diagnostics)
    assert result.candidates and all(c.name == "get_weather" for c in result.candidates), text
    assert all(isinstance(c.arguments.get("city"), str) for c in result.candidates), text


SHORTEST = [
    (fmt, label, choice)
    for fmt in ("hermes", "qwen3-xml", "dsml-v4", "mistral", "llama3-json")
    for label, choice in (("required", "required"), ("named", NAMED))
]


@pytest.mark.parametrize(("fmt", "label", "choice"), SHORTEST, ids=[f"{c[0]}-{c[1]}" for c in SHORTEST])
def test_a_budget_of_the_shortest_output_still_gets_a_whole_call(fmt: str, label: str, choice: Any) -> None:
    """The server refuses a max_tokens below `shortest_output_tokens` (a 400); at exactly
    that budget budget closing follows its plan from the first token and the call is whole."""
    c = constraints.build(fmt, WEATHER, choice, fmt != "mistral", None, V)
    assert c is not None
    shortest = shortest_output_tokens(c.plain, fmt, V)
    assert shortest is not None and shortest > len(b'{"city": ""}')
    for seed in range(2):
        check_closed(fmt, of(c), shortest, seed=seed)


@pytest.mark.parametrize("fmt", ["hermes", "dsml-v4"])
def test_a_step_whose_token_is_discarded_does_not_advance_the_plan(fmt: str) -> None:
    """vLLM keeps a row that is still in chunked prefill in the batch: `apply` runs on its
    row, and the token sampled there is thrown away. Budget closing, committed from the
    first step (the budget is the shortest call), must force the same token again, not
    the plan's next one (which the matcher then refused: the row ran unconstrained)."""
    c = constraints.build(fmt, WEATHER, "required", True, None, V)
    assert c is not None
    budget = shortest_output_tokens(c.plain, fmt, V)
    assert budget is not None
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = []
    batch.update_state(Update(added=[(0, params(of(c), budget), None, out)]))
    g = torch.Generator().manual_seed(7)
    for step in range(budget + 3):
        for _ in range(3 if step < 2 else 1):  # the first two steps in prefill twice more
            logits = torch.randn(1, WIDTH, generator=g)
            batch.apply(logits)
        t = int(torch.argmax(logits[0]))
        if t == EOS or len(out) == budget:
            break
        out.append(t)
    row = batch.rows[0]
    assert not row.failed
    result = parse(fmt, bytes(out).decode() + get_format(fmt).eos, WEATHER)
    assert result.diagnostics == () and [x.name for x in result.candidates] == ["get_weather"]


def test_the_shortest_output_is_counted_in_the_vocabularys_longest_tokens() -> None:
    pieces = [bytes([b]) for b in range(256)] + [b"<tool_call>", b"</tool_call>", b"get_weather"]
    words = LlgVocabulary.build({p: [i] for i, p in enumerate(pieces)}, len(pieces), {len(pieces): "<eos>"})
    c = constraints.build("hermes", WEATHER, "required", False, None, V)
    assert c is not None
    in_bytes, in_words = shortest_output_tokens(c.plain, "hermes", V), shortest_output_tokens(c.plain, "hermes", words)
    assert in_bytes is not None and in_words is not None
    assert in_words == in_bytes - (len("<tool_call>") - 1) - (len("</tool_call>") - 1) - (len("get_weather") - 1)


def test_budget_closing_starts_no_second_mistral_call_it_cannot_finish() -> None:
    spec = of(constraints.build("mistral", WEATHER, "required", True, None, V))
    check_closed("mistral", spec, 160, seed=1601)


@pytest.mark.parametrize("seed", range(2))
def test_budget_closing_plans_no_reasoning_block_it_does_not_need(seed: int) -> None:
    spec = of(constraints.build("hermes", WEATHER, "required", True, None, V))
    text, _ = run(spec, 80, seed)
    result = parse("hermes", text + "<|im_end|>", WEATHER)
    assert result.diagnostics == () and result.candidates, text


def test_budget_closing_plans_an_end_for_a_patterned_string() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "code",
            "parameters": {
                "type": "object",
                "properties": {"c": {"type": "string", "pattern": "^a+b$"}},
                "required": ["c"],
            },
        },
    }
    c = constraints.build("hermes", [tool], "required", True, None, V)
    assert c is not None
    m = matcher(c.plain, V)
    head = '<tool_call>\n{"name": "code", "arguments": {"c": "a'
    assert consume_text(m, head) == len(head.encode())
    assert closing_plan(m, {b: b for b in range(256)}, EOS, format_closers("hermes")) is not None


@pytest.mark.parametrize("parallel", [True, False])
def test_a_second_call_follows_only_when_parallel(parallel: bool) -> None:
    spec = of(constraints.build("hermes", [*WEATHER, TIME], "required", parallel, None, V))
    first = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    batch = ByteBatch(None, "cpu", False)
    out = list(first.encode())
    batch.update_state(Update(added=[(0, params(spec), None, out)]))
    mask = allowed(step(batch, 1)[0])
    assert EOS in mask
    assert (ord("\n") in mask) is parallel  # the separator before another <tool_call>
    if parallel:
        out += list(b'\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
        assert allowed(step(batch, 1)[0]) >= {EOS} and not batch.rows[0].failed
        result = parse("hermes", bytes(out).decode() + "<|im_end|>", [*WEATHER, TIME])
        assert [c.name for c in result.candidates] == ["get_time", "get_weather"] and not result.diagnostics


@pytest.mark.parametrize("seed", range(4))
def test_auto_text_ends_without_a_call_it_could_not_finish(seed: int) -> None:
    """20 tokens cannot hold a call: in auto the row writes text, never a trigger it would
    have to cut short, even when `<` is the likeliest token."""
    spec = of(constraints.build("hermes", WEATHER, "auto", True, None, V))
    text, row = run(spec, 20, seed, bias={ord("<"): 2.0})
    result = parse("hermes", text + "<|im_end|>", WEATHER)
    assert len(text.encode()) <= 20 and not row.failed
    assert result.diagnostics == () and not result.candidates, text
    assert "<tool_call>" not in text


def test_auto_without_a_budget_may_write_free_text() -> None:
    spec = of(constraints.build("hermes", WEATHER, "auto", True, None, V))
    batch = ByteBatch(None, "cpu", False)
    out = list(b"Hello there.")
    batch.update_state(Update(added=[(0, params(spec), None, out)]))
    mask = allowed(step(batch, 1)[0])
    assert {EOS, ord(" "), ord("<")} <= mask  # end, more text, or a call


def test_each_masked_step_records_its_time() -> None:
    batch = ByteBatch(None, "cpu", False)
    before = STEP_TIMINGS.summary()["steps"]
    out: list[int] = []
    batch.update_state(Update(added=[(0, params(lark("/a+b/", "ab")), None, out), (1, params(None), None, [])]))
    for t in (ord("a"), ord("a")):
        step(batch, 2)
        out.append(t)
    batch.update_state(Update(removed=[0]))
    step(batch, 2)  # nothing constrained: not recorded
    summary = batch.timings.summary()
    assert summary["steps"] == 2 and summary["p50_step_us"] > 0 and summary["p99_token_us"] > 0
    assert STEP_TIMINGS.summary()["steps"] >= before + 2


def test_random_rows_in_one_batch_each_end_as_their_grammar() -> None:
    """Four constrained rows of different formats in one batch, random logits, each within
    its own max_tokens: every output parses into a call."""
    fmts = ["hermes", "mistral", "llama3-json", "hermes"]
    batch = ByteBatch(None, "cpu", False)
    outs: list[list[int]] = [[] for _ in fmts]
    batch.update_state(
        Update(
            added=[
                (i, params(of(constraints.build(f, WEATHER, "required", True, None, V)), 100 + 40 * i), None, outs[i])
                for i, f in enumerate(fmts)
            ]
        )
    )
    g = torch.Generator().manual_seed(5)
    done = [False] * len(fmts)
    for _ in range(400):
        logits = torch.randn(len(fmts), WIDTH, generator=g)
        logits[:, EOS] -= 3
        batch.apply(logits)
        for i in range(len(fmts)):
            if done[i]:
                continue
            t = int(torch.argmax(logits[i]))
            if t == EOS or len(outs[i]) >= 100 + 40 * i:
                done[i] = True
            else:
                outs[i].append(t)
        if all(done):
            break
    for f, out in zip(fmts, outs, strict=True):
        result = parse(f, bytes(out).decode() + get_format(f).eos, WEATHER)
        assert result.diagnostics == () and result.candidates, (f, bytes(out))


def test_a_grammar_start_mask_is_filled_once_and_copied_alike() -> None:
    batch = ByteBatch(None, "cpu", False)
    spec = of(constraints.build("hermes", WEATHER, "auto", True, None, V))
    first_out: list[int] = []
    batch.update_state(Update(added=[(0, params(spec), None, first_out)]))
    first = allowed(step(batch, 1)[0])
    assert set(batch.first_masks) == {spec["key"]}
    first_out.append(ord("H"))  # the first row moves on; a second row of the same grammar starts
    batch.update_state(Update(added=[(1, params(spec), None, [])]))
    logits = step(batch, 2)
    assert allowed(logits[1]) == first  # the start mask, copied
    fresh = ByteBatch(None, "cpu", False)  # filled from its matcher, not copied
    fresh.update_state(Update(added=[(0, params(spec), None, [])]))
    assert allowed(step(fresh, 1)[0]) == first


def test_parallel_fill_follows_the_setting_else_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from callgate.decoding import processor

    monkeypatch.setenv("CALLGATE_PARALLEL_FILL", "on")
    assert processor.parallel_fill_default() is True
    monkeypatch.setenv("CALLGATE_PARALLEL_FILL", "off")
    assert processor.parallel_fill_default() is False
    monkeypatch.delenv("CALLGATE_PARALLEL_FILL")
    monkeypatch.setattr(processor.os, "cpu_count", lambda: 2)
    assert processor.parallel_fill_default() is False
    monkeypatch.setattr(processor.os, "cpu_count", lambda: 64)
    assert processor.parallel_fill_default() is True


@pytest.mark.parametrize("fmt", ["hermes", "qwen3-xml", "dsml-v4"])
def test_forced_tokens_are_taken_without_a_fill_and_mask_as_llguidance_does(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row in a run of forced tokens (the call's markup, a key's name) is masked to the
    next of them without llguidance filling its mask; at every step its mask is the one
    llguidance fills for a matcher fed the same tokens."""
    import llguidance.torch

    from tests.llg_harness import allowed_bytes
    from tests.test_agreement import completion

    fills = 0
    real_fill = llguidance.torch.fill_next_token_bitmask

    def counted(m: Any, host: torch.Tensor, i: int) -> None:
        nonlocal fills
        fills += 1
        real_fill(m, host, i)

    monkeypatch.setattr(llguidance.torch, "fill_next_token_bitmask", counted)
    script = [*completion(fmt, WEATHER, [("get_weather", {"city": "Paris"})]).encode(), EOS]
    spec = of(constraints.build(fmt, WEATHER, "required", True, None, V))
    reference = matcher(spec["grammar"], V)
    batch = ByteBatch(None, "cpu", False)
    out: list[int] = []
    batch.update_state(Update(added=[(0, params(spec), None, out)]))
    g = torch.Generator().manual_seed(1)
    for want in script:
        logits = torch.randn(1, WIDTH, generator=g)
        logits[0, want] += 100
        batch.apply(logits)
        assert allowed(logits[0]) == set(allowed_bytes(reference)), bytes(out)
        assert int(torch.argmax(logits[0])) == want, bytes(out)
        if want != EOS:
            assert reference.consume_token(want)
            out.append(want)
    assert fills < len(script) / 2, (fills, len(script))  # most of a call's bytes are markup the grammar forces
