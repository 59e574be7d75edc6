"""Inverse frequencies and attention factors of RoPE and its context-extension variants.

Each function returns ``(inv_freq, attention_factor)`` with inv_freq a float64 tensor of
rotary_dim // 2 frequencies. The formulas follow the article "Why Position Matters" (paper 001)
and are written to agree with HF transformers' rope types "default", "linear", "dynamic" and "yarn"
(``modeling_rope_utils``), which are the de-facto reference for checkpoints in the wild.
"""
from __future__ import annotations

import math

import torch


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0..d/2-1 (RoFormer eq. 15)."""
    return 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def linear_scaling(rotary_dim: int, base: float, factor: float):
    """Position interpolation: positions divided by `factor`, i.e. every frequency divided by it."""
    return default_inv_freq(rotary_dim, base) / factor, 1.0


def ntk_aware_scaling(rotary_dim: int, base: float, factor: float):
    """NTK-aware: the base grows to base * s^(d / (d - 2)), stretching low frequencies most."""
    if rotary_dim <= 2:
        raise ValueError(f"rotary_dim must be > 2 for NTK-aware scaling, got {rotary_dim}")
    return default_inv_freq(rotary_dim, base * factor ** (rotary_dim / (rotary_dim - 2))), 1.0


def dynamic_ntk_base(rotary_dim: int, base: float, factor: float, seq_len: int, original_max_positions: int) -> float:
    """HF 'dynamic': for seq_len > original_max_positions the base becomes
    base * ((s * L / L_orig) - (s - 1))^(d / (d - 2)); otherwise it is unchanged."""
    if seq_len <= original_max_positions:
        return base
    return base * ((factor * seq_len / original_max_positions) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def dynamic_ntk_scaling(rotary_dim: int, base: float, factor: float, seq_len: int, original_max_positions: int):
    return default_inv_freq(rotary_dim, dynamic_ntk_base(rotary_dim, base, factor, seq_len, original_max_positions)), 1.0


def yarn_attention_factor(factor: float) -> float:
    """YaRN's temperature: 0.1 ln(s) + 1 (1 for s <= 1), applied to both q and k."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _yarn_correction_dim(num_rotations: float, rotary_dim: int, base: float, max_positions: int) -> float:
    # the dimension index whose wavelength fits `num_rotations` times into the original context
    return (rotary_dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_scaling(
    rotary_dim: int,
    base: float,
    factor: float,
    original_max_positions: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
):
    """NTK-by-parts: high frequencies (many rotations in the original context) are kept, low
    frequencies are interpolated by `factor`, with a linear ramp between dims low..high."""
    low = math.floor(_yarn_correction_dim(beta_fast, rotary_dim, base, original_max_positions))
    high = math.ceil(_yarn_correction_dim(beta_slow, rotary_dim, base, original_max_positions))
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp, as the reference implementation does
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp  # 1 = keep the original frequency
    inv_freq = default_inv_freq(rotary_dim, base)
    inv_freq = (inv_freq / factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
    return inv_freq, yarn_attention_factor(factor)
