"""Argument checks shared by every token-mask backend.

Knows: the bitmask layout (outlines-core / xgrammar: bit j of word i of row r allows
token 32*i + j of logits row r), which dtypes and shapes are accepted, and how the
optional row selection is normalised. Does not know: how any backend writes -inf.

Misuse (wrong dtype, shape, device, an out-of-range row) raises ValueError or
TypeError before a backend touches memory, so backend bodies need no checks.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

Rows = torch.Tensor | Sequence[int] | None


@dataclass(frozen=True, slots=True)
class MaskCall:
    """A checked call: the tensors to use, and the selected rows (None = every row)."""

    logits: torch.Tensor
    bitmask: torch.Tensor
    rows: torch.Tensor | None  # int64, 1-D, contiguous, on the logits' device

    @property
    def n_rows(self) -> int:
        return self.logits.shape[0] if self.rows is None else int(self.rows.numel())

    @property
    def vocab(self) -> int:
        return int(self.logits.shape[1])

    @property
    def n_words(self) -> int:
        return int(self.bitmask.shape[1])


def check_call(logits: torch.Tensor, bitmask: torch.Tensor, indices: Rows = None) -> MaskCall:
    """Validate one `apply_token_bitmask` call and normalise its row selection.

    logits: [batch, vocab] float32/float16/bfloat16, unit stride along the vocabulary.
    bitmask: [batch, words] int32, contiguous, on the same device; words may be fewer
    than ceil(vocab/32) (uncovered tokens are disallowed) or more (extra bits ignored).
    indices: rows of both tensors to mask (others are left untouched); None means all.
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(bitmask, torch.Tensor):
        raise TypeError("logits and bitmask must be torch tensors")
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits dtype must be float32, float16 or bfloat16, got {logits.dtype}")
    if bitmask.dtype != torch.int32:
        raise TypeError(f"bitmask dtype must be int32, got {bitmask.dtype}")
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(f"logits and bitmask must be 2-D, got {logits.dim()}-D and {bitmask.dim()}-D")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows but logits has {logits.shape[0]}")
    if logits.device != bitmask.device:
        raise ValueError(f"logits on {logits.device} but bitmask on {bitmask.device}")
    if logits.shape[1] > 0 and logits.stride(1) != 1:
        raise ValueError("logits must have unit stride along the vocabulary (use .contiguous())")
    if not bitmask.is_contiguous():
        raise ValueError("bitmask must be contiguous")
    return MaskCall(logits, bitmask, _rows(indices, logits))


def _rows(indices: Rows, logits: torch.Tensor) -> torch.Tensor | None:
    """Rows as int64 on the logits' device; checked on the host first (a CUDA index
    tensor costs one device sync here, so hot paths pass a host list or tensor)."""
    if indices is None:
        return None
    if isinstance(indices, torch.Tensor):
        if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
            raise TypeError(f"indices must be an integer tensor, got {indices.dtype}")
        host = indices.reshape(-1).to(device="cpu", dtype=torch.int64)
    else:
        values = list(indices)
        if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in values):
            raise TypeError("indices must be integers")
        host = torch.tensor(values, dtype=torch.int64)
    if host.numel() and (int(host.min()) < 0 or int(host.max()) >= logits.shape[0]):
        raise ValueError(f"indices must lie in [0, {logits.shape[0]}), got {host.tolist()}")
    return host.to(logits.device, non_blocking=True).contiguous()
