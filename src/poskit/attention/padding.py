"""Padded batches in Hugging Face's convention: an `attention_mask` (B, T) with 1 (or True) for a real token
and 0 for padding, and the positions that make a padded sequence look like the sequence alone."""
from __future__ import annotations

import torch


def real_token_mask(attention_mask, batch: int, length: int, device) -> torch.Tensor:
    """(batch, length) bool, True = real token, from an attention_mask of bools or the ints 0 and 1."""
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (batch, length):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must be a ({batch}, {length}) tensor, 1/True = real token and 0 = padding, "
                         f"got {shape}")
    if attention_mask.dtype == torch.bool:
        return attention_mask.to(device)
    if attention_mask.dtype.is_floating_point or attention_mask.is_complex() or not bool(
            ((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError(f"attention_mask must hold bools or the ints 0 and 1 (1 = real token), got dtype "
                         f"{attention_mask.dtype}" + ("" if attention_mask.dtype.is_floating_point else " with other values"))
    return (attention_mask == 1).to(device)


def padded_positions(real: torch.Tensor, start=None) -> torch.Tensor:
    """(B, T) int64 positions for a padded batch: a real token's position is `start` plus the number of real
    tokens before it in its row, so a left- or right-padded sequence gets the positions it has alone. A pad
    takes the position of the last real token before it (`start` when there is none): pads are masked out as
    keys, and this keeps every row's positions non-decreasing, as CoPE requires.

    real: (B, T) bool, True = real token; start: None (0), an int, or (B,) / (1,) ints per row (e.g.
    `KVCache.next_positions()` when continuing a cached sequence).
    """
    counted = (real.long().cumsum(-1) - 1).clamp(min=0)  # real tokens before each token, pads not counted
    if start is None:
        return counted
    start = torch.as_tensor(start, device=real.device).long()
    return counted + (start[:, None] if start.dim() == 1 else start)
