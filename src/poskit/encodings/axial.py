"""Axial positions for the rotary families (rope, pope): one frequency band per coordinate.

An image patch (row, column) or a video patch (frame, row, column) has a position with n coordinates. Built
with `axial_dims=(d_1, ..., d_n)`, an encoding splits its channels into n consecutive groups; group a is
encoded by coordinate a alone, with the frequencies the encoding would use at head dim d_a (RoPE:
base^(-2i/d_a), i < d_a/2, one per channel pair; PoPE: base^(-c/d_a), c < d_a, one per channel). Each group
is then an ordinary 1-d encoding of its own coordinate, so the logit of a pair depends on the positions only
through the per-axis offsets (s_a - t_a): relative invariance holds along every axis separately.
(Vision models with axial RoPE and PoPE-pytorch's AxialPoPE split the channels the same way.)

Angles are computed directly in float64 (position times frequency) and only cos/sin are cast, as the 1-d
tables do (encodings/angles.py); there is no table to cache because the coordinates index different
frequency groups.
"""
from __future__ import annotations

import torch


def check_axial_dims(axial_dims, total: int, *, channels_per_frequency: int, total_name: str) -> tuple[int, ...]:
    """axial_dims as a tuple of ints >= channels_per_frequency, each a multiple of it, summing to `total`.

    channels_per_frequency: 2 for RoPE (a frequency rotates a channel pair), 1 for PoPE (one per channel)."""
    if isinstance(axial_dims, (str, bytes)) or not isinstance(axial_dims, (list, tuple)) or not axial_dims:
        raise ValueError(f"axial_dims must be a non-empty list of ints (channels per coordinate) summing to "
                         f"{total_name}={total}, got {axial_dims!r}")
    for d in axial_dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < channels_per_frequency or d % channels_per_frequency:
            need = "an even int >= 2" if channels_per_frequency == 2 else "an int >= 1"
            raise ValueError(f"axial_dims entries must each be {need} (channels of one coordinate), got "
                             f"{list(axial_dims)!r}")
    if sum(axial_dims) != total:
        raise ValueError(f"axial_dims must sum to {total_name}={total} (every channel belongs to one coordinate), "
                         f"got {list(axial_dims)} summing to {sum(axial_dims)}")
    return tuple(axial_dims)


def axial_frequencies(axial_dims: tuple[int, ...], per_axis) -> tuple[torch.Tensor, torch.Tensor]:
    """(inv_freq float64 (F,), axis int64 (F,)): the frequencies of every group concatenated, and the
    coordinate each one reads. per_axis(d_a) -> float64 frequencies of a group of d_a channels."""
    freqs = [per_axis(d) for d in axial_dims]
    axis = torch.cat([torch.full((len(f),), a, dtype=torch.long) for a, f in enumerate(freqs)])
    return torch.cat(freqs), axis


def axial_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, axis: torch.Tensor, dtype: torch.dtype,
                  gain: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions[..., axis[f]] * inv_freq[f]: positions (..., n) -> each (..., F) in `dtype`."""
    angles = positions.double()[..., axis.to(positions.device)] * inv_freq.to(positions.device)
    return (angles.cos() * gain).to(dtype), (angles.sin() * gain).to(dtype)
