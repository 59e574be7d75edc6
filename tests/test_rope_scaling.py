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
from poskit.encodings.rope_scaling import RopeParameters
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
    inv, attn = rope_scaling.yarn_scaling(RopeParameters(dim, base, factor, orig))
    want_inv, want_attn = hf_yarn(dim, base, factor, orig)
    assert torch.allclose(inv.float(), want_inv, rtol=2e-6, atol=0)
    assert attn == pytest.approx(want_attn, abs=1e-12)


def test_yarn_temperatures_quoted_in_paper_001():
    assert rope_scaling.yarn_attention_factor(4) == pytest.approx(1.1386, abs=1e-4)
    assert rope_scaling.yarn_attention_factor(16) == pytest.approx(1.2773, abs=1e-4)
    assert rope_scaling.yarn_attention_factor(1) == 1.0


def theta(d, base):
    """RoFormer eq. 15: theta_i = base^(-2i/d), i = 0..d/2-1, as Python floats (float64)."""
    return [base ** (-2 * i / d) for i in range(d // 2)]


def reference_inv_freq(variant, d, base, factor, original_max, seq_len):
    """Inverse frequencies of each variant from its formula (paper 001; HF transformers' rope types), float64."""
    if variant == "linear":  # position interpolation: p / s, i.e. every frequency / s
        return [t / factor for t in theta(d, base)]
    if variant == "ntk":  # NTK-aware base change
        return theta(d, base * factor ** (d / (d - 2)))
    if variant == "dynamic":  # HF `dynamic`; seq_len = longest position of the call + 1 (poskit's documented choice)
        if seq_len > original_max:
            base = base * ((factor * seq_len / original_max) - (factor - 1)) ** (d / (d - 2))
        return theta(d, base)
    assert variant == "yarn"  # NTK-by-parts, beta_fast = 32, beta_slow = 1

    def correction_dim(rotations):  # the dimension whose wavelength fits `rotations` times in the original context
        return d * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), d - 1)
    if low == high:
        high += 0.001
    out = []
    for i, t in enumerate(theta(d, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep the frequency, 1: interpolate it by s
        out.append(t / factor * ramp + t * (1 - ramp))
    return out


def reference_attention_factor(variant, factor):
    return 0.1 * math.log(factor) + 1 if variant == "yarn" else 1.0


def rotate_ref(x, pos, inv_freq, layout, gain):
    """One vector x (D,) rotated pair by pair by pos * inv_freq; rotated channels times `gain` (HF multiplies
    cos and sin by the attention factor, so channels past rotary_dim are left alone)."""
    out = x.clone()
    half = len(inv_freq)
    for i, f in enumerate(inv_freq):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
        c, s = math.cos(pos * f), math.sin(pos * f)
        out[a] = gain * (x[a] * c - x[b] * s)
        out[b] = gain * (x[b] * c + x[a] * s)
    return out


def reference_scaled_rope_logits(q, k, qp, kp, variant, layout, rotary_dim, base, factor, original_max, causal=True):
    """Logits (B, H, Tq, Tk) of a rope scaling variant, float64, loops; k has one kv head shared by all heads."""
    q, k = q.double(), k.double()
    B, H, Tq, D = q.shape
    inv = reference_inv_freq(variant, rotary_dim, base, factor, original_max, seq_len=max(max(qp), max(kp)) + 1)
    gain = reference_attention_factor(variant, factor)
    out = torch.full((B, H, Tq, len(kp)), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(Tq):
                qt = rotate_ref(q[b, h, t], qp[t], inv, layout, gain)
                for s in range(len(kp)):
                    if not causal or kp[s] <= qp[t]:
                        out[b, h, t, s] = (qt @ rotate_ref(k[b, 0, s], kp[s], inv, layout, gain)) / math.sqrt(D)
    return out


VARIANTS = {  # name: (variant, original_max_positions); yarn's 2048 puts its ramp inside d = 32 (dims 4..11)
    "rope-linear": ("linear", None),
    "rope-ntk": ("ntk", None),
    "rope-dynamic": ("dynamic", 8),
    "rope-yarn": ("yarn", 2048),
}


def build_variant(name, D, layout="interleaved", rotary_dim=None, factor=4.0, original_max=None, dtype=torch.float64):
    orig = VARIANTS[name][1] if original_max is None else original_max
    return build(name, head_dim=D, num_heads=2, layout=layout, rotary_dim=rotary_dim, factor=factor, dtype=dtype,
                 **({"original_max_positions": orig} if orig else {}))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_scaled_rope_logits_equal_float64_reference(name, layout):
    D, factor = 32, 4.0
    enc = build_variant(name, D, layout, factor=factor)
    q = torch.randn(2, 2, 5, D, dtype=torch.float64)
    k = torch.randn(2, 1, 6, D, dtype=torch.float64)
    qp, kp = [3, 7, 8, 20, 21], [0, 2, 7, 8, 15, 21]  # longest position 21: dynamic's base grows (21 + 1 > 8)
    got = poskit.attention_scores(q, k, enc, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), is_causal=True, enable_gqa=True)
    want = reference_scaled_rope_logits(q, k, qp, kp, VARIANTS[name][0], layout, D, 10000.0, factor, VARIANTS[name][1])
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    assert torch.allclose(got[fin], want[fin], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["rope-yarn", "rope-ntk"])
def test_partial_rotary_scaling_uses_rotary_dim(name):
    # d in every formula is rotary_dim (HF: head_dim * partial_rotary_factor); pass-through channels unscaled
    D, rd = 32, 20
    enc = build_variant(name, D, "half", rotary_dim=rd, factor=8.0)
    q, k = torch.randn(1, 2, 4, D, dtype=torch.float64), torch.randn(1, 1, 4, D, dtype=torch.float64)
    qp, kp = [0, 5, 9, 40], [1, 5, 30, 40]
    got = poskit.attention_scores(q, k, enc, is_causal=False, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), enable_gqa=True)
    want = reference_scaled_rope_logits(q, k, qp, kp, VARIANTS[name][0], "half", rd, 10000.0, 8.0, VARIANTS[name][1],
                                        causal=False)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("seq_end", [6, 16, 17, 40])
def test_dynamic_ntk_base_follows_the_longest_position_of_the_call(seq_end):
    """Below original_max_positions (16) the base is unchanged; above it, it grows with max position + 1, also
    for a single decode query (q at seq_end - 1 against keys 0..seq_end - 1)."""
    D = 16
    enc = build_variant("rope-dynamic", D, factor=2.0, original_max=16)
    q = torch.randn(1, 2, 1, D, dtype=torch.float64)
    k = torch.randn(1, 1, seq_end, D, dtype=torch.float64)
    qp, kp = [seq_end - 1], list(range(seq_end))
    got = poskit.attention_scores(q, k, enc, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), is_causal=True, enable_gqa=True)
    want = reference_scaled_rope_logits(q, k, qp, kp, "dynamic", "interleaved", D, 10000.0, 2.0, 16)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    plain = reference_scaled_rope_logits(q, k, qp, kp, "linear", "interleaved", D, 10000.0, 1.0, None)  # s = 1
    assert torch.allclose(got, plain, atol=1e-12) == (seq_end <= 16)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_scaled_rope_fp32_at_a_million(name):
    """fp32 logits at positions ~1e6 equal the float64 reference there; for all but dynamic NTK (whose base depends
    on the longest position by definition) they also equal the logits at positions 0..T-1."""
    D, T, offset = 64, 6, 1_000_000
    enc = build_variant(name, D, dtype=torch.float32)
    q, k = torch.randn(1, 2, T, D), torch.randn(1, 1, T, D)
    pos = list(range(offset, offset + T))
    far = poskit.attention_scores(q, k, enc, q_positions=torch.tensor(pos), k_positions=torch.tensor(pos), is_causal=True, enable_gqa=True)
    want = reference_scaled_rope_logits(q, k, pos, pos, VARIANTS[name][0], "interleaved", D, 10000.0, 4.0, VARIANTS[name][1])
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(far), fin)
    assert torch.allclose(far[fin].double(), want[fin], atol=1e-3, rtol=0)
    if name != "rope-dynamic":
        near = poskit.attention_scores(q, k, enc, q_positions=torch.arange(T), k_positions=torch.arange(T), is_causal=True, enable_gqa=True)
        assert torch.allclose(far[fin], near[fin], atol=1e-3, rtol=0)


def test_yarn_keeps_high_and_interpolates_low_frequencies():
    inv, _ = rope_scaling.yarn_scaling(RopeParameters(128, 10000.0, 4.0, 4096))
    default = torch.tensor(theta(128, 10000.0), dtype=torch.float64)
    assert torch.allclose(inv[:20], default[:20], rtol=1e-14, atol=0)  # below the ramp: extrapolated (kept)
    assert torch.allclose(inv[46:], default[46:] / 4)  # above the ramp: interpolated


def test_yarn_attention_factor_scales_logits_by_its_square():
    # q and k both carry 0.1 ln s + 1, so at distance 0 (no rotation) the logit is (0.1 ln 4 + 1)^2 q.k / sqrt(D)
    D = 16
    x = torch.randn(1, 2, 1, D, dtype=torch.float64)
    y = torch.randn(1, 2, 1, D, dtype=torch.float64)
    yarn = build("rope-yarn", head_dim=D, num_heads=2, factor=4.0, original_max_positions=8)
    got = poskit.attention_scores(x, y, yarn, q_positions=torch.tensor([5]), k_positions=torch.tensor([5]), is_causal=True, enable_gqa=True)
    want = (0.1 * math.log(4) + 1) ** 2 * (x * y).sum(-1, keepdim=True) / math.sqrt(D)
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("seq_len", [10, 64, 65, 200, 1000])
def test_dynamic_ntk_matches_hf(seq_len):
    dim, base, factor, orig = 64, 10000.0, 2.0, 64
    inv, _ = rope_scaling.dynamic_ntk_scaling(RopeParameters(dim, base, factor, orig), seq_len)
    assert torch.allclose(inv.float(), hf_dynamic(dim, base, factor, seq_len, orig), rtol=2e-6, atol=0)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_linear_matches_hf_and_equals_divided_positions(factor):
    inv, attn = rope_scaling.linear_scaling(RopeParameters(64, 10000.0, factor))
    assert torch.allclose(inv.float(), hf_default(64, 10000.0) / factor, rtol=2e-6) and attn == 1.0
    # position interpolation: rope-linear at position p has the angles of plain rope at p / factor
    D = 8
    lin = build("rope-linear", head_dim=D, num_heads=1, factor=factor)
    pos = torch.tensor([0, 8, 16])
    qc, qs = lin.cos_sin(pos.unsqueeze(0), torch.float64)
    angles = (pos.double() / factor)[:, None] * torch.tensor(theta(D, 10000.0), dtype=torch.float64)
    assert torch.allclose(qc[0], angles.cos()) and torch.allclose(qs[0], angles.sin())


def test_ntk_aware_base_change():
    dim, base, s = 64, 10000.0, 4.0
    inv, _ = rope_scaling.ntk_aware_scaling(RopeParameters(dim, base, s))
    assert torch.allclose(inv, torch.tensor(theta(dim, base * s ** (dim / (dim - 2))), dtype=torch.float64))
    # the lowest frequency is divided by exactly s, the highest is unchanged
    assert inv[-1].item() == pytest.approx(theta(dim, base)[-1] / s, rel=1e-12)
    assert inv[0].item() == 1.0
