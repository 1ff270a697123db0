"""Triton backend for `apply_token_bitmask` (CUDA tensors; CPU tensors in interpreter mode).

Knows: the bitmask layout. Imported lazily by callgate.kernels, so the package loads
without triton. One program masks BLOCK tokens of one selected row; the body is
branch-free: it never reads the logits, it only stores -inf where the bit is clear
(or where the token lies beyond the mask), under a store mask.

`build_kernel()` returns a fresh `triton.jit` of the body; triton reads TRITON_INTERPRET
when it is called, so with TRITON_INTERPRET=1 it is the interpreter (CPU, for tests).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl

from callgate.kernels.launcher import MaskCall, Rows, check_call

BLOCK = 4096


def _mask_body(  # type: ignore[no-untyped-def]
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    logits_stride,
    bitmask_stride,
    vocab,
    n_words,
    HAS_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    if HAS_ROWS:
        row = tl.load(rows_ptr + tl.program_id(0))
    else:
        row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offs < vocab
    word = offs // 32
    bits = tl.load(bitmask_ptr + row * bitmask_stride + word, mask=in_vocab & (word < n_words), other=0)
    allowed = ((bits >> (offs % 32)) & 1) != 0
    tl.store(logits_ptr + row * logits_stride + offs, -float("inf"), mask=in_vocab & ~allowed)


def build_kernel() -> Any:
    """A new jitted kernel (interpreted when TRITON_INTERPRET=1 is set at this call)."""
    return triton.jit(_mask_body)


@functools.cache
def _kernel() -> Any:
    return build_kernel()


def apply_checked(call: MaskCall, kernel: Any = None, block: int = BLOCK) -> None:
    """Mask an already-checked call in place with `kernel` (default: the cached jit)."""
    if call.n_rows == 0 or call.vocab == 0:
        return
    rows = call.rows
    grid = (call.n_rows, triton.cdiv(call.vocab, block))
    (kernel or _kernel())[grid](
        call.logits,
        call.bitmask,
        call.bitmask if rows is None else rows,
        call.logits.stride(0),
        call.bitmask.stride(0),
        call.vocab,
        call.n_words,
        HAS_ROWS=rows is not None,
        BLOCK=block,
    )


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: Rows = None, *, kernel: Any = None, block: int = BLOCK
) -> None:
    """Set disallowed logits to -inf in place (see callgate.kernels for the contract)."""
    apply_checked(check_call(logits, bitmask, indices), kernel, block)
