"""ConstrainedBatch with a tiny vocabulary and fake vLLM batch updates (no vllm import).

The fakes mirror vLLM v1's BatchUpdate: removed indices, added (index, params,
prompt ids, live output list) and moved (a, b, direction) with directions named
UNIDIRECTIONAL / SWAP; the output lists are appended to in place, as vLLM does.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.constraints.processor import ConstrainedBatch, TokenTable, mask_time_summary, row_spec

PIECES: dict[bytes, list[int]] = {
    b"a": [0], b"b": [1], b"c": [2], b"<": [3], b"call": [4], b">": [5], b"{": [6], b"}": [7],
    b"x": [8], b"<call>": [9], b"ab": [10], b">{": [13], b"[": [14], b"T": [15], b"]": [16], b">x": [17], b"l": [18],
}  # fmt: skip
EOS = 11
SPECIAL = 12  # "[T]", a special token: not in the grammar's vocabulary, but it can be a trigger
VOCAB = 40  # logits width: ids 19..39 are padding and never allowed in a constrained row
TEXT = {i: data for data, ids in PIECES.items() for i in ids} | {SPECIAL: b"[T]", EOS: b""}
TABLE = TokenTable.build(PIECES, EOS, {SPECIAL: b"[T]"})


class Direction(enum.Enum):
    UNIDIRECTIONAL = enum.auto()
    SWAP = enum.auto()


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None


@dataclass(frozen=True)
class Update:
    batch_size: int
    removed: list[int] = field(default_factory=list)
    added: list[tuple[int, Params, list[int] | None, list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, Direction]] = field(default_factory=list)


class TinyBatch(ConstrainedBatch):
    def load_tokens(self) -> TokenTable:
        return TABLE


def constrained(regex: str, key: str | None = None, trigger: str | None = None) -> Params:
    return Params({"callgate": {"key": key or f"test:{regex}:{trigger}", "regex": regex, "trigger": trigger}})


def new_batch() -> TinyBatch:
    return TinyBatch(None, "cpu", False)


def allowed(logits: torch.Tensor, row: int) -> set[int]:
    return set(torch.isfinite(logits[row]).nonzero().flatten().tolist())


def step(batch: TinyBatch, n_rows: int, seed: int = 0) -> torch.Tensor:
    logits = torch.randn(n_rows, VOCAB, generator=torch.Generator().manual_seed(seed))
    batch.update_state(None)
    return batch.apply(logits)


def test_unconstrained_batch_is_left_alone() -> None:
    batch = new_batch()
    batch.update_state(Update(2, added=[(0, Params(), [], []), (1, Params({"other": 1}), [], [])]))
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    assert torch.equal(batch.apply(logits), before)
    assert not batch.is_argmax_invariant()


def test_masks_follow_the_guide_as_tokens_arrive() -> None:
    batch = new_batch()
    out: list[int] = []
    batch.update_state(Update(2, added=[(1, constrained("a+b"), [5, 5], out), (0, Params(), [], [])]))
    first = step(batch, 2)
    assert allowed(first, 1) == {0, 10}  # "a" or "ab"
    assert len(allowed(first, 0)) == VOCAB  # the unconstrained row is untouched
    out.append(0)
    assert allowed(step(batch, 2), 1) == {0, 1, 10}
    out.append(1)
    assert allowed(step(batch, 2), 1) == {EOS}


def test_async_placeholders_are_read_once_filled_in() -> None:
    batch = new_batch()
    out = [0, -1]
    batch.update_state(Update(1, added=[(0, constrained("a+b"), None, out)]))
    assert allowed(step(batch, 1), 0) == {0, 1, 10}
    out[1] = 1
    assert allowed(step(batch, 1), 0) == {EOS}


def test_a_re_added_request_replays_its_earlier_output() -> None:
    batch = new_batch()
    batch.update_state(Update(1, added=[(0, constrained("a+b"), None, [0, 0, 1])]))
    assert allowed(step(batch, 1), 0) == {EOS}


def test_moves_swaps_and_removals_keep_each_guide_with_its_request() -> None:
    batch = new_batch()
    ab, cx = [0], [2]
    batch.update_state(Update(3, added=[(0, constrained("a+b"), None, ab), (2, constrained("c+x"), None, cx)]))
    assert allowed(step(batch, 3), 2) == {2, 8}
    batch.update_state(Update(3, moved=[(0, 2, Direction.SWAP)]))
    logits = step(batch, 3)
    assert allowed(logits, 0) == {2, 8} and allowed(logits, 2) == {0, 1, 10}
    assert len(allowed(logits, 1)) == VOCAB
    batch.update_state(Update(2, removed=[1], moved=[(2, 1, Direction.UNIDIRECTIONAL)]))
    logits = step(batch, 2)
    assert allowed(logits, 1) == {0, 1, 10} and allowed(logits, 0) == {2, 8}
    batch.update_state(Update(2, added=[(0, Params(), None, [])]))  # a new request takes slot 0
    logits = step(batch, 2)
    assert len(allowed(logits, 0)) == VOCAB and allowed(logits, 1) == {0, 1, 10}
    batch.update_state(Update(0, removed=[0, 1]))
    assert batch.rows == {}


def test_unidirectional_move_onto_a_constrained_slot_drops_the_old_request() -> None:
    batch = new_batch()
    batch.update_state(Update(2, added=[(0, constrained("a+b"), None, []), (1, constrained("c+x"), None, [])]))
    batch.update_state(Update(1, removed=[0], moved=[(1, 0, Direction.UNIDIRECTIONAL)]))
    assert list(batch.rows) == [0]
    assert allowed(step(batch, 1), 0) == {2}


def test_requests_with_one_key_share_the_compiled_index() -> None:
    batch = new_batch()
    same = constrained("a+b", key="k1")
    batch.update_state(Update(2, added=[(0, same, None, []), (1, same, None, [])]))
    assert batch.rows[0].index is batch.rows[1].index


def test_lazy_row_is_free_until_the_trigger_then_follows_the_grammar() -> None:
    batch = new_batch()
    out: list[int] = []
    batch.update_state(Update(1, added=[(0, constrained(r"<call>\{x+\}", trigger="<call>"), None, out)]))
    for token in (0, 1, 3, 2, 3, 4):  # "ab<c<call": free text, the trigger not yet complete
        assert len(allowed(step(batch, 1), 0)) == VOCAB
        out.append(token)
    assert len(allowed(step(batch, 1), 0)) == VOCAB
    out.append(5)  # ">" completes "<call>" across three tokens
    assert allowed(step(batch, 1), 0) == {6}  # only "{"
    out.append(6)
    assert allowed(step(batch, 1), 0) == {8}
    out.extend([8, 7])
    assert allowed(step(batch, 1), 0) == {EOS}


@pytest.mark.parametrize(
    ("tokens", "then"),
    [
        ([9], {6}),  # the whole trigger in one token
        ([3, 4, 13], {8}),  # the trigger ends inside ">{": the guide starts past the "{"
        ([0, 9, 6, 8], {7, 8}),
    ],
)
def test_trigger_split_or_glued_across_tokens(tokens: list[int], then: set[int]) -> None:
    batch = new_batch()
    batch.update_state(Update(1, added=[(0, constrained(r"<call>\{x+\}", trigger="<call>"), None, tokens)]))
    assert allowed(step(batch, 1), 0) == then


def test_a_special_token_trigger_is_walked_as_text() -> None:
    batch = new_batch()
    batch.update_state(Update(1, added=[(0, constrained(r"\[T\]a+b", trigger="[T]"), None, [2, SPECIAL])]))
    assert allowed(step(batch, 1), 0) == {0, 10}


def test_text_glued_to_the_trigger_outside_the_grammar_leaves_the_row_free() -> None:
    batch = new_batch()
    out = [3, 4, 17]  # "<call" + ">x": the grammar wants "{" after the trigger
    batch.update_state(Update(1, added=[(0, constrained(r"<call>\{x+\}", trigger="<call>"), None, out)]))
    assert len(allowed(step(batch, 1), 0)) == VOCAB
    assert batch.failed_rows == [0]


def test_malformed_extra_args_are_rejected() -> None:
    assert row_spec(None) is None and row_spec({"x": 1}) is None
    for bad in ("regex", {"key": "k"}, {"key": "", "regex": "a"}, {"key": "k", "regex": "a", "trigger": ""}):
        with pytest.raises(ValueError):
            ConstrainedBatch.validate_params(Params({"callgate": bad}))
    ConstrainedBatch.validate_params(constrained("a+b"))


def test_mask_times_are_recorded_per_step_and_token() -> None:
    batch = new_batch()
    before = mask_time_summary()["steps"]
    batch.update_state(Update(2, added=[(0, constrained("a+b"), None, []), (1, constrained("c+x"), None, [])]))
    for seed in range(5):
        step(batch, 2, seed)
    summary = batch.timings.summary()
    assert summary["steps"] == 5
    assert 0 < summary["p50_token_us"] <= summary["p50_step_us"] <= summary["p99_step_us"]
    assert mask_time_summary()["steps"] == before + 5


GRAMMARS = [r"(ab|c)+x", r"a{2,4}(b|c)?x", r"\{(a|b)*\}", r"x|c+"]


@settings(max_examples=40, deadline=None)
@given(regex=st.sampled_from(GRAMMARS), seed=st.integers(0, 2**16))
def test_sampling_under_the_mask_only_produces_grammar_text(regex: str, seed: int) -> None:
    batch = new_batch()
    out: list[int] = []
    batch.update_state(Update(1, added=[(0, constrained(regex), None, out)]))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(12):
        batch.update_state(None)
        logits = batch.apply(torch.randn(1, VOCAB, generator=gen))
        token = int(torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen))
        out.append(token)
        if token == EOS:
            break
    text = b"".join(TEXT[t] for t in out).decode()
    if out[-1] == EOS:
        assert re.fullmatch(regex, text), text
    else:
        assert any(re.fullmatch(regex, text + tail) for tail in ("", "x", "bx", "}", "abx")), text


def test_the_mask_backend_is_chosen_when_the_batch_is_built() -> None:
    assert new_batch().backend == "cpu"


def test_state_masks_are_reused_and_bounded() -> None:
    batch = new_batch()
    batch.masks.budget_bytes = 2 * 8  # two rows of two words
    rows = [constrained("a+b", key="s1"), constrained("a+b", key="s1"), constrained("c+x", key="s2")]
    batch.update_state(Update(3, added=[(i, p, None, []) for i, p in enumerate(rows)]))
    logits = step(batch, 3)
    assert allowed(logits, 0) == allowed(logits, 1) == {0, 10} and allowed(logits, 2) == {2}
    assert list(batch.masks.entries) == [
        ("s1", batch.rows[0].guide.get_state(), 2),
        ("s2", batch.rows[2].guide.get_state(), 2),
    ]
    batch.rows[2].output.append(2)
    assert allowed(step(batch, 3), 2) == {2, 8}
    assert batch.masks.used_bytes <= 16 and len(batch.masks.entries) == 2


@dataclass
class LimitedParams(Params):
    max_tokens: int | None = None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_cpu_pointer_lane_masks_exactly_as_the_host_rows_do(dtype: torch.dtype) -> None:
    """On a CPU the kernel reads each row's kept mask in place; the same steps through the
    host-row copy and the checked kernel give the same bits (grammar rows, a row closing
    within its budget, a lazy row held back from its trigger, a free row between them)."""
    lanes, buffered = new_batch(), new_batch()
    assert lanes.pointer_lane is not None and dtype in lanes.pointer_lane
    buffered.pointer_lane = None
    outs: dict[str, tuple[list[int], ...]] = {}
    for name, batch in (("lanes", lanes), ("buffered", buffered)):
        outs[name] = ([0], [], [2], [], [])
        ab, free, cx, late, closing = outs[name]
        lazy = LimitedParams(constrained(r"<call>\{x+\}", trigger="<call>").extra_args, 6)
        budget = LimitedParams(constrained("a(?:bbbbbb)?c").extra_args, 5)
        added = [(0, constrained("(ab|a)+b"), None, ab), (1, Params(), None, free), (2, constrained("c+x"), None, cx)]
        batch.update_state(Update(5, added=[*added, (3, lazy, None, late), (4, budget, None, closing)]))
    gen = torch.Generator().manual_seed(3)
    masked = set()
    for n in range(5):
        logits = torch.randn(5, VOCAB, generator=gen).to(dtype)
        want = buffered.apply(logits.clone())
        got = lanes.apply(logits.clone())
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(got.view(bits), want.view(bits)), n
        masked |= {r for r in range(5) if not torch.isfinite(want[r]).all()}
        for name in ("lanes", "buffered"):
            for out, token in zip(outs[name], want.float().argmax(-1).tolist(), strict=True):
                out.append(token)
        for batch in (lanes, buffered):
            batch.update_state(None)
    assert masked == {0, 2, 3, 4}  # every constrained row was masked at some step; the free one never


def test_logits_without_unit_stride_are_refused_as_before() -> None:
    batch = new_batch()
    batch.update_state(Update(1, added=[(0, constrained("a+b"), None, [])]))
    with pytest.raises(ValueError, match="unit stride"):
        batch.apply(torch.zeros(1, 2 * VOCAB)[:, ::2])


def test_a_vocabulary_wider_than_the_logits_is_a_programming_error() -> None:
    batch = new_batch()
    batch.update_state(Update(1, added=[(0, constrained("a+b"), None, [])]))
    with pytest.raises(ValueError, match="columns"):
        batch.apply(torch.zeros(1, 8))


def test_a_grammar_that_cannot_compile_here_leaves_only_that_row_free(caplog: pytest.LogCaptureFixture) -> None:
    batch = new_batch()
    bad = Params({"callgate": {"key": "bad", "regex": "q+"}})  # "q" is no token of the vocabulary
    batch.update_state(Update(2, added=[(0, bad, None, []), (1, constrained("a+b"), None, [])]))
    logits = step(batch, 2)
    assert len(allowed(logits, 0)) == VOCAB and allowed(logits, 1) == {0, 10}
    assert "constrained decoding disabled" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_on_a_gpu_the_batch_masks_exactly_as_on_the_cpu() -> None:
    """Pinned host rows copied asynchronously, then Triton: the same bits as the C loop,
    step after step, with unconstrained rows between constrained ones and a swap midway."""
    on_cpu, on_gpu = new_batch(), TinyBatch(None, "cuda", True)
    assert on_gpu.backend == "triton"
    outs = {name: ([0], [], [2]) for name in ("cpu", "gpu")}
    for name, batch in (("cpu", on_cpu), ("gpu", on_gpu)):
        ab, free, cx = outs[name]
        added = [(0, constrained("(ab|a)+b"), None, ab), (1, Params(), None, free), (2, constrained("c+x"), None, cx)]
        batch.update_state(Update(3, added=added))
    gen = torch.Generator().manual_seed(7)
    for n in range(6):
        if n == 3:
            for batch in (on_cpu, on_gpu):
                batch.update_state(Update(3, moved=[(0, 2, Direction.SWAP)]))
        logits = torch.randn(3, VOCAB, generator=gen)
        want = on_cpu.apply(logits.clone())
        got = on_gpu.apply(logits.cuda()).cpu()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), n
        picks = want.argmax(-1).tolist()
        for name in ("cpu", "gpu"):
            rows = outs[name] if n < 3 else (outs[name][2], outs[name][1], outs[name][0])
            for out, token in zip(rows, picks, strict=True):
                out.append(token)
        for batch in (on_cpu, on_gpu):
            batch.update_state(None)
