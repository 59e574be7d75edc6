"""ALiBi (Press et al.; paper 001): a head-specific linear penalty on distance, bias = -m_h * (t - s).

Slopes are the geometric sequence 2^(-8h/H), h = 1..H, for H a power of two, and Press et al.'s
interpolation otherwise (the powers of the nearest smaller power of two, then every other slope of
the next power of two). Without a causal mask the distance is |t - s|.
"""
from __future__ import annotations

import math

import torch

from .base import PositionalEncoding, register
from .kernel_bias import KernelBias


def alibi_slopes(num_heads: int) -> list[float]:
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def bias_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype position biases are computed in: fp32 for half inputs, float64 kept for references."""
    return torch.promote_types(dtype, torch.float32)


def distance(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """t - s for every query/key pair: (1|B, 1, Tq, Tk) int64."""
    return (q_positions[:, None, :, None] - k_positions[:, None, None, :])


@register("alibi")
class ALiBiEncoding(PositionalEncoding):
    """ALiBi: no change to q or k; a per-head linear penalty on distance is added to the logits.

    bias(t, s) = -m_h |t - s| with slopes m_h = 2^(-8h/H), h = 1..H (interpolated between powers of two
    otherwise, as Press et al. do).

    Paper: Press et al., "Train Short, Test Long" (ALiBi), as presented in "Why Position Matters" (paper 001).

    Options (defaults): none besides head_dim and num_heads (the slopes follow from num_heads).
    """
    kind = "bias"
    bias_reads_q = False  # -m_h |t - s|: positions alone

    def __init__(self, *, head_dim: int, num_heads: int):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(num_heads), dtype=torch.float64), persistent=False)

    def bias(self, q, q_positions, k_positions, scale):
        # |t - s| equals t - s on every visible pair of a causal mask, and is the symmetric choice otherwise.
        # fp32 (float64 for float64 q) whatever q's dtype: an fp16 distance overflows past 65504 and a bf16 one
        # keeps 3 significant digits; the attention paths add the bias to fp32 logits for half inputs
        dtype = bias_dtype(q.dtype)
        dist = distance(q_positions, k_positions).abs().to(dtype)
        return -self.slopes.to(dtype)[:, None, None] * dist  # (1|B, H, Tq, Tk)

    def kernel_bias(self, q_positions, k_positions):
        """-m_h |t - s| from the slopes (encodings/kernel_bias.py): the compiled CPU kernel computes it per tile."""
        return KernelBias("slopes", self.slopes)
