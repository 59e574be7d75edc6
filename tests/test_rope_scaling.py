"""RoPE scaling variants against HF transformers' numbers.

The expected values are computed here the way HF transformers' `modeling_rope_utils` computes them
(`_compute_linear_scaling_rope_parameters`, `_compute_dynamic_ntk_parameters`, `_compute_yarn_parameters`,
in float32 as HF does) without importing transformers, plus the YaRN temperatures quoted in paper 001.
"""
import math

import pytest
import torch

import poskit
from poskit.encodings import rope_scaling
from conftest import build


def hf_default(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def hf_yarn(dim, base, factor, original_max, beta_fast=32, beta_slow=1):
    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    def find_correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(find_correction_dim(beta_fast)), 0)
    high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation_factor = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_factor) + (1.0 / pos_freqs) * extrapolation_factor
    return inv, get_mscale(factor)


def hf_dynamic(dim, base, factor, seq_len, original_max):
    if seq_len > original_max:
        base = base * ((factor * seq_len / original_max) - (factor - 1)) ** (dim / (dim - 2))
    return hf_default(dim, base)


@pytest.mark.parametrize("dim, base, factor, orig", [(128, 10000.0, 4.0, 4096), (64, 10000.0, 16.0, 2048), (128, 500000.0, 8.0, 8192), (32, 10000.0, 2.0, 64)])
def test_yarn_inv_freq_and_attention_factor_match_hf(dim, base, factor, orig):
    inv, attn = rope_scaling.yarn_scaling(dim, base, factor, orig)
    want_inv, want_attn = hf_yarn(dim, base, factor, orig)
    assert torch.allclose(inv.float(), want_inv, rtol=2e-6, atol=0)
    assert attn == pytest.approx(want_attn, abs=1e-12)


def test_yarn_temperatures_quoted_in_paper_001():
    assert rope_scaling.yarn_attention_factor(4) == pytest.approx(1.1386, abs=1e-4)
    assert rope_scaling.yarn_attention_factor(16) == pytest.approx(1.2773, abs=1e-4)
    assert rope_scaling.yarn_attention_factor(1) == 1.0


def test_yarn_keeps_high_and_interpolates_low_frequencies():
    inv, _ = rope_scaling.yarn_scaling(128, 10000.0, 4.0, 4096)
    default = rope_scaling.default_inv_freq(128, 10000.0)
    assert torch.equal(inv[:20], default[:20])  # below the ramp: extrapolated (kept)
    assert torch.allclose(inv[46:], default[46:] / 4)  # above the ramp: interpolated


def test_yarn_attention_factor_scales_logits_by_its_square():
    D = 16
    q = torch.randn(1, 2, 5, D, dtype=torch.float64)
    k = torch.randn(1, 2, 5, D, dtype=torch.float64)
    yarn = build("rope-yarn", head_dim=D, num_heads=2, factor=4.0, original_max_positions=8)
    # the same frequencies without temperature
    plain = build("rope", head_dim=D, num_heads=2)
    plain.inv_freq = yarn.inv_freq.clone()
    ratio = poskit.attention_scores(q, k, yarn) / poskit.attention_scores(q, k, plain)
    finite = torch.isfinite(ratio)
    assert torch.allclose(ratio[finite], torch.full_like(ratio[finite], (0.1 * math.log(4) + 1) ** 2))


@pytest.mark.parametrize("seq_len", [10, 64, 65, 200, 1000])
def test_dynamic_ntk_matches_hf(seq_len):
    dim, base, factor, orig = 64, 10000.0, 2.0, 64
    inv, _ = rope_scaling.dynamic_ntk_scaling(dim, base, factor, seq_len, orig)
    assert torch.allclose(inv.float(), hf_dynamic(dim, base, factor, seq_len, orig), rtol=2e-6, atol=0)


def test_dynamic_ntk_uses_the_longest_position_of_the_call():
    D = 16
    enc = build("rope-dynamic", head_dim=D, num_heads=1, factor=2.0, original_max_positions=8)
    q = torch.randn(1, 1, 1, D, dtype=torch.float64)
    k = torch.randn(1, 1, 20, D, dtype=torch.float64)
    got = poskit.attention_scores(q, k, enc, q_positions=torch.tensor([19]), k_positions=torch.arange(20))
    manual = build("rope", head_dim=D, num_heads=1)
    manual.inv_freq = rope_scaling.dynamic_ntk_scaling(D, 10000.0, 2.0, 20, 8)[0]
    want = poskit.attention_scores(q, k, manual, q_positions=torch.tensor([19]), k_positions=torch.arange(20))
    assert torch.allclose(got, want)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_linear_matches_hf_and_equals_divided_positions(factor):
    inv, attn = rope_scaling.linear_scaling(64, 10000.0, factor)
    assert torch.allclose(inv.float(), hf_default(64, 10000.0) / factor, rtol=2e-6) and attn == 1.0
    # position interpolation: rope-linear at position p equals plain rope at p / factor
    D = 8
    lin = build("rope-linear", head_dim=D, num_heads=1, factor=factor)
    x = torch.randn(1, 1, 3, D, dtype=torch.float64)
    pos = torch.tensor([0, 8, 16])
    qc, qs = lin.cos_sin(pos.unsqueeze(0), torch.float64)
    plain = build("rope", head_dim=D, num_heads=1)
    angles = (pos.double() / factor)[:, None] * plain.inv_freq
    assert torch.allclose(qc[0], angles.cos()) and torch.allclose(qs[0], angles.sin())


def test_ntk_aware_base_change():
    dim, base, s = 64, 10000.0, 4.0
    inv, _ = rope_scaling.ntk_aware_scaling(dim, base, s)
    assert torch.allclose(inv, rope_scaling.default_inv_freq(dim, base * s ** (dim / (dim - 2))))
    # the lowest frequency is divided by exactly s, the highest is unchanged
    assert inv[-1].item() == pytest.approx(rope_scaling.default_inv_freq(dim, base)[-1].item() / s, rel=1e-12)
    assert inv[0].item() == 1.0
