"""Shared checks for absolute encodings, which act on token embeddings rather than inside attention."""
from __future__ import annotations

import torch


def check_embed_positions(positions, argname: str = "positions") -> torch.Tensor:
    """Integer, non-negative positions of shape (T,) or (B, T), as int64."""
    positions = torch.as_tensor(positions)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
        raise ValueError(f"{argname} must be an integer tensor, got dtype {positions.dtype}")
    if positions.dim() not in (1, 2):
        raise ValueError(f"{argname} must have shape (T,) or (B, T), got {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"{argname} must be >= 0, got minimum {int(positions.min())}")
    return positions.long()


def check_even_dim(dim: int, name: str) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be an even int >= 2 for the {name} encoding, got {dim!r}")
