"""A greedy row whose argmax its grammar admits is left unmasked (decoding/processor.py).

The premise: vLLM's greedy sampler takes the argmax of the logits the processor returns, so
masking a row whose argmax the mask admits changes nothing. Checked with the real C argmax
against torch's, and with real grammars driven in lockstep: a greedy batch and a batch that
masks every row see the same logits every step and must take the same token, in every mode
budget closing and the forced runs reach.
"""

from __future__ import annotations

import ctypes
import random
from types import SimpleNamespace
from typing import Any

import numpy
import pytest
import torch

import callgate.constraints as constraints
from callgate.constraints.llg import matcher
from callgate.decoding.budget import shortest_output_tokens
from callgate.decoding.rows import argmax_sampled
from callgate.formats import get_format
from callgate.kernels import argmax
from callgate.parsers import parse
from tests.llg_harness import EOS, allowed_bytes
from tests.test_decoding_processor import NAMED, WEATHER, WIDTH, ByteBatch, Update, V, allowed, of

needs_kernel = pytest.mark.skipif(not argmax.available(), reason="no C compiler for the argmax loop")


def params(spec: dict[str, Any], max_tokens: int | None = None, **sampling: Any) -> Any:
    return SimpleNamespace(extra_args={"callgate": spec}, max_tokens=max_tokens, **sampling)


def c_argmax(logits: torch.Tensor, rows: list[int]) -> list[int]:
    out = numpy.zeros(len(rows), dtype=numpy.int64)
    index = numpy.array(rows, dtype=numpy.int64)
    argmax.argmax_rows_kernel()(
        logits.data_ptr(), logits.stride(0), index.ctypes.data, len(rows), logits.shape[1], out.ctypes.data
    )
    return [int(x) for x in out]


@needs_kernel
@pytest.mark.parametrize("width", [1, 15, 16, 17, 257, 49_152, 151_936])
def test_the_c_argmax_is_torchs(width: int) -> None:
    g = torch.Generator().manual_seed(width)
    logits = torch.randn(6, width, generator=g)
    logits[1] = float("-inf")  # all banned: index 0, as torch
    logits[2, width // 2] = logits[2, width - 1] = 1e9  # a tie: the first
    logits[3] = 0.0  # all equal
    logits[4, width // 3] = float("inf")
    rows = [5, 0, 1, 2, 3, 4]
    assert c_argmax(logits, rows) == [int(torch.argmax(logits[r])) for r in rows]


@needs_kernel
def test_the_portable_loop_is_torchs_too() -> None:
    """The library built without -march=native (no AVX-512 path) answers the same."""
    from callgate.kernels.native import compile_library

    fn = compile_library("argmax-portable", argmax._SOURCE, (("-O3", "-std=c99", "-fPIC", "-shared"),))
    fn = fn.callgate_argmax_f32
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes, fn.restype = (ptr, i64, ptr, i64, i64, ptr), None
    logits = torch.randn(4, 3001, generator=torch.Generator().manual_seed(1))
    logits[1] = float("-inf")
    logits[2, 7] = logits[2, 3000] = 50.0
    logits[3, 99] = float("nan")
    out = numpy.zeros(4, dtype=numpy.int64)
    rows = numpy.arange(4, dtype=numpy.int64)
    fn(logits.data_ptr(), logits.stride(0), rows.ctypes.data, 4, logits.shape[1], out.ctypes.data)
    assert out.tolist() == [int(torch.argmax(logits[0])), 0, 7, -1]


@needs_kernel
def test_a_row_holding_a_nan_answers_minus_one() -> None:
    logits = torch.randn(2, 1000)
    logits[1, 517] = float("nan")
    assert c_argmax(logits, [1, 0]) == [-1, int(torch.argmax(logits[0]))]


def test_only_a_greedy_request_with_nothing_after_the_processor_is_argmax_sampled() -> None:
    assert argmax_sampled(SimpleNamespace(temperature=0.0))
    assert argmax_sampled(SimpleNamespace(temperature=0.0, repetition_penalty=1.0, presence_penalty=0.0))
    assert not argmax_sampled(SimpleNamespace(temperature=0.7))
    assert not argmax_sampled(SimpleNamespace())  # vLLM's default temperature is 1.0
    assert not argmax_sampled(SimpleNamespace(temperature=0.0, repetition_penalty=1.1))
    assert not argmax_sampled(SimpleNamespace(temperature=0.0, frequency_penalty=0.5))
    assert not argmax_sampled(SimpleNamespace(temperature=0.0, presence_penalty=-0.5))
    assert not argmax_sampled(SimpleNamespace(temperature=0.0, logprobs=0))
    assert not argmax_sampled(SimpleNamespace(temperature=0.0, thinking_token_budget=64))


LOCKSTEP = [
    (fmt, label, choice, max_tokens)
    for fmt in ("hermes", "qwen3-xml", "dsml-v4", "mistral")
    for label, choice in (("required", "required"), ("named", NAMED), ("auto", "auto"))
    for max_tokens in (None, 90)
]


@needs_kernel
@pytest.mark.parametrize(
    ("fmt", "label", "choice", "max_tokens"), LOCKSTEP, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in LOCKSTEP]
)
def test_a_greedy_row_takes_the_token_a_masked_row_takes(
    fmt: str, label: str, choice: Any, max_tokens: int | None
) -> None:
    """Half the steps the model "wants" a token the grammar admits (its logit raised: the
    greedy row passes unmasked), half a random one (mostly refused: it is masked); under
    `auto` the trigger's first byte is raised too, which budget closing bans near the end."""
    c = constraints.build(fmt, WEATHER, choice, fmt != "mistral", None, V)
    assert c is not None
    spec = of(c)
    if max_tokens is not None:  # a budget the shortest call fits in (else the server's 400)
        shortest = shortest_output_tokens(c.plain, fmt, V)
        max_tokens = max(max_tokens, (shortest or 0) + 30)
    greedy, full = ByteBatch(None, "cpu", False), ByteBatch(None, "cpu", False)
    out_greedy: list[int] = []
    out_full: list[int] = []
    greedy.update_state(Update(added=[(0, params(spec, max_tokens, temperature=0.0), None, out_greedy)]))
    full.update_state(Update(added=[(0, params(spec, max_tokens, temperature=1.0), None, out_full)]))
    probe = matcher(spec["grammar"], V)  # what the grammar admits, without budget closing
    rng, g = random.Random(3), torch.Generator().manual_seed(3)
    trigger = (spec.get("trigger") or "\x00").encode()[0]
    passed = masked_away = 0
    ended = False
    for n in range(max_tokens or 160):
        logits = torch.randn(1, WIDTH, generator=g)
        logits[0, EOS] -= 2
        if n % 2 == 0:
            admitted = allowed_bytes(probe)
            if admitted:
                logits[0, rng.choice(admitted)] += 8
        if n % 5 == 4:
            logits[0, trigger] += 12
        wanted = int(torch.argmax(logits[0]))
        took = int(torch.argmax(greedy.apply(logits.clone())[0]))
        assert took == int(torch.argmax(full.apply(logits.clone())[0])), (n, bytes(out_full))
        passed += greedy.passed
        masked_away += took != wanted
        assert full.passed == 0
        if took == EOS:
            ended = True
            break
        out_greedy.append(took)
        out_full.append(took)
        assert probe.consume_token(took)
    assert passed and masked_away, (passed, masked_away)
    # a whole output (EOS, or max_tokens under budget closing) with a call in it parses
    if (ended or max_tokens) and (choice != "auto" or greedy.rows[0].called):
        result = parse(fmt, bytes(out_greedy).decode() + get_format(fmt).eos, WEATHER)
        assert result.diagnostics == () and result.candidates


@needs_kernel
def test_a_greedy_rows_nan_or_padded_argmax_is_masked() -> None:
    """A NaN is torch's argmax (vLLM would take it): the row is masked as any other; so is a
    row whose argmax is a padded column past the vocabulary."""
    c = constraints.build("hermes", WEATHER, "required", True, None, V)
    assert c is not None
    batch = ByteBatch(None, "cpu", False)
    batch.update_state(
        Update(
            added=[
                (0, params(of(c), temperature=0.0), None, []),
                (1, params(of(c), temperature=0.0), None, []),
            ]
        )
    )
    logits = torch.zeros(2, WIDTH + 40)
    logits[0, ord("<")] = 5.0  # the hermes call's first byte: admitted, but a NaN elsewhere
    logits[0, 77] = float("nan")
    logits[1, WIDTH + 30] = 5.0
    admitted = set(allowed_bytes(matcher(of(c)["grammar"], V)))
    assert ord("<") in admitted and 77 not in admitted
    batch.apply(logits)
    assert batch.passed == 0
    assert allowed(logits[0]) == allowed(logits[1]) == admitted


@needs_kernel
def test_a_forced_greedy_row_passes_on_its_forced_token_and_is_masked_to_it_otherwise() -> None:
    """Forced tokens are asked only of rows the argmax check leaves: a greedy row whose
    argmax is the grammar's forced next byte passes without them; one whose argmax is
    another byte is masked to the forced byte alone."""
    from tests.test_decoding_processor import lark

    spec = lark('"abc" /x+/', "forced-abc")
    batch = ByteBatch(None, "cpu", False)
    first: list[int] = []
    second: list[int] = []
    batch.update_state(
        Update(
            added=[(0, params(spec, temperature=0.0), None, first), (1, params(spec, temperature=0.0), None, second)]
        )
    )
    for step, byte in enumerate(b"abc"):
        logits = torch.zeros(2, WIDTH)
        logits[0, byte] = 5.0  # row 0 wants the forced byte
        logits[1, ord("z")] = 5.0  # row 1 wants a refused one
        batch.apply(logits)
        assert batch.passed == 1 and batch.filled == 0, step
        assert batch.rows[0].forced == []  # never asked: its argmax passed
        assert allowed(logits[1]) == {byte}
        assert bool(torch.isfinite(logits[0]).all())  # left as it was
        first.append(byte)
        second.append(byte)
