"""Every token-mask backend against the plain-torch reference.

Shapes cover the three vocabularies (SmolLM2/Llama-3/Qwen) and batches 1, 8, 64; the
Triton body also runs in Triton's interpreter on the CPU, and on a GPU when present.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate import kernels
from callgate.kernels import cpu, reference

VOCABS = (49152, 128256, 151936)
BATCHES = (1, 8, 64)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def words(vocab: int) -> int:
    return (vocab + 31) // 32


def random_case(batch: int, vocab: int, dtype: torch.dtype, seed: int, n_words: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen).to(dtype)
    n = words(vocab) if n_words is None else n_words
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, n), generator=gen, dtype=torch.int32)
    # Realistic rows too: a grammar state allows a handful of tokens, or almost all.
    if batch > 1 and n > 3:
        bitmask[0] = 0
        bitmask[0, 3] = 0b1011
    if batch > 2 and n > 0:
        bitmask[1] = -1
        bitmask[1, -1] = 0x7FFF
    return logits, bitmask


def expected(logits: torch.Tensor, bitmask: torch.Tensor, indices=None) -> torch.Tensor:
    out = logits.clone()
    reference.apply_token_bitmask(out, bitmask, indices)
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN == NaN, -0.0 != 0.0)."""
    width = torch.int32 if a.element_size() == 4 else torch.int16
    return a.dtype == b.dtype and torch.equal(a.view(width), b.view(width))


def test_reference_unpacks_bits_in_token_order() -> None:
    logits = torch.zeros(1, 70)
    bitmask = torch.tensor([[0b101, -(2**31), 0b10]], dtype=torch.int32)
    reference.apply_token_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 2, 63, 65]


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
def test_cpu_matches_reference_float32(vocab: int, batch: int) -> None:
    logits, bitmask = random_case(batch, vocab, torch.float32, seed=vocab + batch)
    want = expected(logits, bitmask)
    cpu.apply_token_bitmask(logits, bitmask)
    assert same_bits(logits, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("vocab", "batch"), [(49152, 64), (128256, 8), (151936, 1)])
def test_cpu_matches_reference_half_dtypes(vocab: int, batch: int, dtype: torch.dtype) -> None:
    logits, bitmask = random_case(batch, vocab, dtype, seed=batch)
    want = expected(logits, bitmask)
    cpu.apply_token_bitmask(logits, bitmask)
    assert same_bits(logits, want)


@pytest.mark.parametrize("vocab", VOCABS)
def test_cpu_masks_only_the_selected_rows(vocab: int) -> None:
    logits, bitmask = random_case(8, vocab, torch.float32, seed=7)
    rows = torch.tensor([6, 1, 3])
    want = expected(logits, bitmask, rows)
    before = logits.clone()
    cpu.apply_token_bitmask(logits, bitmask, rows)
    assert same_bits(logits, want)
    untouched = [0, 2, 4, 5, 7]
    assert same_bits(logits[untouched], before[untouched])


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 4),
    vocab=st.integers(0, 200),
    word_delta=st.integers(-2, 2),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_cpu_matches_reference_on_odd_shapes(batch, vocab, word_delta, dtype, data) -> None:
    n_words = max(0, words(vocab) + word_delta)
    logits, bitmask = random_case(batch, vocab, dtype, seed=vocab, n_words=n_words)
    rows = data.draw(st.none() | st.lists(st.integers(0, batch - 1), unique=True))
    want = expected(logits, bitmask, rows)
    cpu.apply_token_bitmask(logits, bitmask, rows)
    assert same_bits(logits, want)


def test_tokens_beyond_the_mask_are_disallowed_and_extra_bits_ignored() -> None:
    logits = torch.zeros(1, 40)
    cpu.apply_token_bitmask(logits, torch.full((1, 1), -1, dtype=torch.int32))
    assert torch.isfinite(logits[0]).sum() == 32
    wide = torch.zeros(1, 40)
    cpu.apply_token_bitmask(wide, torch.full((1, 3), -1, dtype=torch.int32))
    assert torch.isfinite(wide).all()


def test_allowed_logits_keep_their_exact_bits() -> None:
    logits = torch.tensor([[float("nan"), -0.0, float("inf"), 1e-40, 3.0]])
    want = logits.clone()
    cpu.apply_token_bitmask(logits, torch.tensor([[0b01111]], dtype=torch.int32))
    assert same_bits(logits[:, :4], want[:, :4])
    assert logits[0, 4] == float("-inf")


# The C source has an AVX-512 body and a portable one; -march=native picks one per machine,
# so both are built here: AVX-512 explicitly (where the CPU runs it) and without it.
_BODIES = {
    "avx512": ("-O3", "-mavx512f", "-mavx512bw", "-std=c99", "-fPIC", "-shared"),
    "portable": ("-O3", "-mno-avx512f", "-std=c99", "-fPIC", "-shared"),
}


def _cpu_has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


@pytest.mark.parametrize("body", sorted(_BODIES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("vocab", "n_words"), [(49152, None), (151936, None), (128256, 4000), (1000, 40)])
def test_each_c_body_matches_reference(body: str, dtype: torch.dtype, vocab: int, n_words: int | None) -> None:
    from callgate.kernels.native import compile_library

    if body == "avx512" and not _cpu_has_avx512():
        pytest.skip("this CPU has no AVX-512")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the -m flags that pick a body are x86's")
    library = compile_library(f"mask-{body}", cpu._SOURCE, (_BODIES[body],))  # a build error fails here
    fn = cpu.entry_points(library)[dtype]
    logits, bitmask = random_case(6, vocab, dtype, seed=vocab, n_words=n_words)
    # blocks of 16 words all banned, all allowed and mixed, as grammar states give
    if bitmask.shape[1] >= 64:
        bitmask[2, :32] = 0
        bitmask[2, 40] = 1 << 7
        bitmask[3, :48] = -1
        bitmask[3, 20] = 0x7FFFFFFF
    want = expected(logits, bitmask)
    rows = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int64)
    fn(
        logits.data_ptr(),
        logits.stride(0),
        bitmask.data_ptr(),
        bitmask.stride(0),
        rows.data_ptr(),
        6,
        logits.shape[1],
        bitmask.shape[1],
    )
    assert same_bits(logits, want)


@pytest.mark.parametrize("rows", [[2, 5], (5, 2), torch.tensor([5, 2], dtype=torch.int32), np.array([2, 5])])
def test_dispatch_uses_the_compiled_cpu_loop_and_matches(rows) -> None:
    assert cpu.available()
    assert kernels.backend_for(torch.device("cpu")) == "cpu"
    logits, bitmask = random_case(8, 49152, torch.bfloat16, seed=3)
    want = expected(logits, bitmask, [2, 5])
    kernels.apply_token_bitmask(logits, bitmask, rows)
    assert same_bits(logits, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trusted_rows_mask_exactly_what_the_checked_call_masks(dtype: torch.dtype) -> None:
    logits, bitmask = random_case(8, 49152, dtype, seed=4)
    want = logits.clone()
    kernels.apply_token_bitmask(want, bitmask, [1, 3, 6])
    kernels.apply_token_bitmask_rows(logits, bitmask, torch.tensor([1, 3, 6], dtype=torch.int64))
    assert same_bits(logits, want)
    with pytest.raises(TypeError, match="bitmask dtype"):  # the tensors are still checked
        kernels.apply_token_bitmask_rows(logits, bitmask.to(torch.int64), torch.tensor([1]))


def test_strided_rows_are_masked_in_place() -> None:
    base = torch.randn(4, 200)
    logits = base[:, :100]  # row stride 200, unit stride along the vocabulary
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 4), dtype=torch.int32)
    want = expected(logits.contiguous(), bitmask)
    right = base[:, 100:].clone()
    kernels.apply_token_bitmask(logits, bitmask)
    assert same_bits(base[:, :100].contiguous(), want)
    assert same_bits(base[:, 100:], right)


@pytest.mark.parametrize(
    ("logits", "bitmask", "indices", "error"),
    [
        (torch.zeros(2, 64, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int32), None, TypeError),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), None, TypeError),
        (torch.zeros(64), torch.zeros(2, dtype=torch.int32), None, ValueError),
        (torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32), None, ValueError),
        (torch.zeros(64, 2).t(), torch.zeros(2, 2, dtype=torch.int32), None, ValueError),
        (torch.zeros(2, 64), torch.zeros(2, 4, dtype=torch.int32)[:, ::2], None, ValueError),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), [2], ValueError),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), [-1], ValueError),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0.0]), TypeError),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), [True], TypeError),
    ],
)
def test_misuse_is_rejected_before_any_write(logits, bitmask, indices, error) -> None:
    before = logits.clone()
    with pytest.raises(error):
        kernels.apply_token_bitmask(logits, bitmask, indices)
    assert torch.equal(logits, before)


# --- Triton: interpreter on the CPU, compiled on a GPU --------------------------------

INTERPRETER_CASES = [(49152, 64, torch.float32), (128256, 8, torch.bfloat16), (151936, 1, torch.float16)]


@pytest.fixture
def interpreted_kernel(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("triton", reason="triton is not installed")
    from callgate.kernels import triton_kernel

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = triton_kernel.build_kernel()
    assert type(kernel).__name__ == "InterpretedFunction"
    return kernel


@pytest.mark.parametrize(("vocab", "batch", "dtype"), INTERPRETER_CASES)
def test_triton_body_in_interpreter_matches_reference(interpreted_kernel, vocab, batch, dtype) -> None:
    from callgate.kernels import triton_kernel

    logits, bitmask = random_case(batch, vocab, dtype, seed=11)
    want = expected(logits, bitmask)
    triton_kernel.apply_token_bitmask(logits, bitmask, kernel=interpreted_kernel, block=32768)
    assert same_bits(logits, want)


@pytest.mark.parametrize(("vocab", "n_words"), [(100, 4), (100, 3), (100, 5), (0, 0)])
def test_triton_body_in_interpreter_on_odd_shapes_and_rows(interpreted_kernel, vocab, n_words) -> None:
    from callgate.kernels import triton_kernel

    logits, bitmask = random_case(5, vocab, torch.float32, seed=vocab, n_words=n_words)
    want = expected(logits, bitmask, [4, 0, 2])
    triton_kernel.apply_token_bitmask(logits, bitmask, [4, 0, 2], kernel=interpreted_kernel, block=64)
    assert same_bits(logits, want)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("batch", BATCHES)
def test_triton_on_gpu_matches_reference(batch: int, vocab: int) -> None:
    assert kernels.backend_for(torch.device("cuda")) == "triton"
    for dtype in DTYPES:
        check_on_gpu(batch, vocab, dtype)


def check_on_gpu(batch: int, vocab: int, dtype: torch.dtype) -> None:
    logits, bitmask = random_case(batch, vocab, dtype, seed=batch * vocab)
    want = expected(logits, bitmask)
    rows = [0, batch - 1]
    want_rows = expected(logits, bitmask, rows)
    gpu_logits, gpu_mask = logits.cuda(), bitmask.cuda()
    kernels.apply_token_bitmask(gpu_logits, gpu_mask)
    assert same_bits(gpu_logits.cpu(), want)
    gpu_logits = logits.cuda()
    kernels.apply_token_bitmask(gpu_logits, gpu_mask, rows)
    assert same_bits(gpu_logits.cpu(), want_rows)
