"""Token-mask kernels: `apply_token_bitmask(logits, bitmask, indices=None)`.

Contract (every backend):
* logits: [batch, vocab] float32 / float16 / bfloat16, unit stride along the vocabulary;
  modified in place, nothing returned.
* bitmask: [batch, ceil(vocab/32)] int32 in outlines-core / xgrammar layout: bit j of
  word i of row r set = token 32*i + j allowed in logits row r. A token the mask does
  not cover (column >= 32 * words, e.g. padded vocabulary columns) is disallowed; bits
  past the vocabulary are ignored.
* indices: optional rows (int tensor or sequence) to mask; rows of both tensors share
  the index (xgrammar convention); unlisted rows are untouched. None = every row.
* disallowed logits become -inf; allowed logits keep their exact bits.
Misuse raises TypeError / ValueError (see launcher.check_call).

Backends, chosen by device: CUDA -> Triton (triton_kernel), CPU -> compiled C loop
(cpu) when a C compiler is present, anything else -> plain torch (reference). Each
backend module is imported on first use, so this package loads without triton.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch

from callgate.kernels.launcher import MaskCall, Rows, check_call

__all__ = ["apply_token_bitmask", "apply_token_bitmask_rows", "backend_for", "cpu_row_kernels"]


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: Rows = None) -> None:
    """Set the logits of disallowed tokens to -inf in place (contract above)."""
    call = check_call(logits, bitmask, indices)
    _backend(call.logits.device.type)[1](call)


def apply_token_bitmask_rows(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """`apply_token_bitmask` for a caller that built `rows` itself: an int64, 1-D,
    contiguous tensor on the logits' device of distinct rows, each below the batch size.
    The tensors are checked as always; the rows are trusted (no torch ops on them: a
    constraint processor calls this once per decoding step)."""
    call = check_call(logits, bitmask, None)
    _backend(call.logits.device.type)[1](MaskCall(call.logits, call.bitmask, rows))


def cpu_row_kernels() -> dict[torch.dtype, Callable[..., None]]:
    """Per logits dtype, the compiled CPU loop's unchecked entry

        fn(logits_ptr, row_stride, mask_ptr, mask_stride, rows_ptr, n_rows, vocab, n_words)

    (strides in elements; rows_ptr: n_rows int64 rows, each below both tensors' rows), for a
    caller that owns its mask buffer and row list and checks the logits itself (dtype, 2-D,
    unit stride). Empty where the loop is not available (no C compiler)."""
    from callgate.kernels import cpu

    return cpu.row_kernels() if cpu.available() else {}


def backend_for(device: torch.device) -> str:
    """Name of the backend used for tensors on `device`: "triton", "cpu" or "reference"."""
    return _backend(device.type)[0]


@functools.cache
def _backend(device_type: str) -> tuple[str, Callable[[MaskCall], None]]:
    # Resolved once per device type: the choice costs microseconds, a CPU call about three.
    if device_type == "cuda" and importlib.util.find_spec("triton") is not None:
        from callgate.kernels import triton_kernel

        return "triton", triton_kernel.apply_checked
    if device_type == "cpu":
        from callgate.kernels import cpu

        if cpu.available():
            return "cpu", cpu.apply_checked
    from callgate.kernels import reference

    return "reference", reference.apply_checked
