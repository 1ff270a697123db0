"""Plain-torch reference for `apply_token_bitmask`: obviously correct, not fast.

Knows: the bitmask layout (see launcher). Every other backend is tested against this.
"""

from __future__ import annotations

import torch

from callgate.kernels.launcher import MaskCall, Rows, check_call


def allowed_matrix(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, words] int32 bitmask -> [rows, vocab] bool, True where the token is allowed.

    Tokens beyond 32 * words are not covered by the mask and so are not allowed.
    """
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
    allowed = torch.zeros(bitmask.shape[0], vocab, dtype=torch.bool, device=bitmask.device)
    covered = min(vocab, bits.shape[1])
    allowed[:, :covered] = bits[:, :covered]
    return allowed


def apply_checked(call: MaskCall) -> None:
    """Mask an already-checked call in place."""
    logits, bitmask, rows = call.logits, call.bitmask, call.rows
    if rows is None:
        logits.masked_fill_(~allowed_matrix(bitmask, call.vocab), float("-inf"))
        return
    masked = logits[rows].masked_fill(~allowed_matrix(bitmask[rows], call.vocab), float("-inf"))
    logits[rows] = masked


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: Rows = None) -> None:
    """Set disallowed logits to -inf in place (see callgate.kernels for the contract)."""
    apply_checked(check_call(logits, bitmask, indices))
