"""xPos against its paper's formula written out pair by pair (float64 loops), on the reference and default paths,
and its scales far from position 0."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.attention import KVCache, cached_attention
from pair_reference import assert_matches_reference


def xpos_pair_logit(D, base=10000.0, scale_base=512.0, gamma=0.4, layout="interleaved"):
    """The logit of Sun et al.: q'_t = zeta^(t/B) R(t theta) q_t, k'_s = zeta^(-s/B) R(s theta) k_s per channel
    pair i, theta_i = base^(-2i/d), zeta_i = (2i/d + gamma) / (1 + gamma); logit = q'_t . k'_s / sqrt(d)."""
    def rotated(x, pos, i, sign):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + D // 2)
        angle = pos * base ** (-2 * i / D)
        zeta = (2 * i / D + gamma) / (1 + gamma)
        c, s = math.cos(angle), math.sin(angle)
        factor = zeta ** (sign * pos / scale_base)
        return factor * (x[a] * c - x[b] * s), factor * (x[b] * c + x[a] * s)

    def pair_logit(h, q_t, k_s, t, s):
        total = 0.0
        for i in range(D // 2):
            q0, q1 = rotated(q_t, t, i, +1)
            k0, k1 = rotated(k_s, s, i, -1)
            total = total + q0 * k0 + q1 * k1
        return total / math.sqrt(D)
    return pair_logit


OPTIONS = st.sampled_from([{}, dict(scale_base=8.0, gamma=0.2), dict(layout="half", scale_base=16.0),
                           dict(base=100.0, gamma=1.5)])


@settings(max_examples=12, deadline=None)
@given(options=OPTIONS, B=st.integers(1, 2), Hkv=st.integers(1, 2), groups=st.sampled_from([1, 2]),
       Tk=st.integers(1, 7), n_new=st.integers(1, 7), causal=st.booleans(), padding=st.booleans(),
       offset=st.integers(0, 60), seed=st.integers(0, 2**16))
def test_xpos_equals_the_papers_formula(options, B, Hkv, groups, Tk, n_new, causal, padding, offset, seed):
    D, H, Tq = 8, Hkv * groups, min(n_new, Tk)
    enc = poskit.build_encoding("xpos", head_dim=D, num_heads=H, **options).double()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    kp = [offset + 2 * s for s in range(Tk)]  # gaps: positions are not indices
    qp = kp[Tk - Tq:]
    mask = (torch.rand(B, Tk, generator=g) > 0.3) if padding else None
    assert_matches_reference(xpos_pair_logit(D, **options), enc, q, k, v, qp, kp, causal=causal, key_mask=mask)


def test_the_decay_is_zeta_to_the_distance_over_the_scale_base():
    # one pair, q = k = (1, 0): logit(t, s) = zeta_0^((t - s)/B) cos((s - t) theta_0) / sqrt(2), zeta_0 = gamma/(1+gamma)
    enc = poskit.build_encoding("xpos", head_dim=2, num_heads=1, scale_base=4.0, gamma=0.5).double()
    x = torch.tensor([1.0, 0.0], dtype=torch.float64).reshape(1, 1, 1, 2)
    k = x.expand(1, 1, 9, 2)
    got = poskit.attention_scores(x, k, enc, q_positions=torch.tensor([8]), k_positions=torch.arange(9), is_causal=True)
    zeta = 0.5 / 1.5
    want = [zeta ** ((8 - s) / 4.0) * math.cos(8 - s) / math.sqrt(2) for s in range(9)]
    torch.testing.assert_close(got[0, 0, 0], torch.tensor(want, dtype=torch.float64), atol=1e-15, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("start", [0, 10**5, 10**9])
def test_logits_are_finite_and_shift_invariant_far_from_zero(dtype, start):
    # 64 tokens at positions start..start+63: written from position 0, zeta^(-s/B) would overflow float32 past
    # s ~ 36k; measured from the call's centre every scale stays within zeta^(+-32/B)
    enc = poskit.build_encoding("xpos", head_dim=16, num_heads=2, scale_base=64.0).to(dtype)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 64, 16, generator=g, dtype=dtype) for _ in range(2))
    pos = torch.arange(64) + start
    far = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos, is_causal=True)
    near = poskit.attention_scores(q.double(), k.double(), enc.double(), is_causal=True)
    visible = torch.isfinite(near)
    assert torch.equal(torch.isfinite(far), visible)
    # float64 angles of positions near 1e9 are exact to ~1e-7 rad (as RoPE's)
    atol = {torch.float32: 1e-4, torch.float64: 1e-5 if start == 10**9 else 1e-10}[dtype]
    torch.testing.assert_close(far.double()[visible], near[visible], atol=atol, rtol=0)


def test_float32_decode_far_along_a_long_cache_matches_float64():
    # one query at position 100000 against every earlier key: the query is the centre (factor 1) and each key
    # gets zeta^((n - m)/B) <= 1, which underflows to 0 only where the logit's own decay does
    T, D = 100_001, 8
    enc = poskit.build_encoding("xpos", head_dim=D, num_heads=1)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 1, D, generator=g)
    k, v = (torch.randn(1, 1, T, D, generator=g) for _ in range(2))
    kw = dict(q_positions=torch.tensor([T - 1]), k_positions=torch.arange(T), is_causal=True)
    got = poskit.attention(q, k, v, enc, **kw)
    want = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference", **kw)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("offset", [0, 10**6])
def test_kv_cache_keeps_raw_keys_and_decoding_equals_the_full_forward(offset):
    enc = poskit.build_encoding("xpos", head_dim=16, num_heads=4, scale_base=32.0).double()
    assert enc.cache_form == "raw"  # the centre moves with each call: keys are scaled per step
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 10, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 10, 16, generator=g, dtype=torch.float64) for _ in range(2))
    pos = torch.arange(10) + offset
    full = poskit.attention(q, k, v, enc, q_positions=pos, k_positions=pos, is_causal=True, enable_gqa=True)
    cache = KVCache(1)
    steps = [cached_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache, 0, pos[:4])]
    steps += [cached_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0, pos[t:t + 1])
              for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 2), full, atol=1e-10 if offset else 1e-12, rtol=0)
    assert not cache.layer(0).encoded and torch.equal(cache.layer(0).keys, k)


def test_fp32_default_path_matches_the_float64_reference():
    enc = poskit.build_encoding("xpos", head_dim=32, num_heads=4)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 150, 32, generator=g)
    k, v = (torch.randn(2, 2, 150, 32, generator=g) for _ in range(2))
    out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference", is_causal=True,
                           enable_gqa=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("options, match", [
    (dict(gamma=0.0), "gamma must be a finite number > 0"),
    (dict(scale_base=-1.0), "scale_base must be a finite number > 0"),
    (dict(scale_base=float("inf")), "scale_base must be a finite number > 0"),
    (dict(layout="pairs"), "layout must be one of"),
    (dict(base=1.0), "base must be"),
])
def test_bad_options_are_refused_naming_the_option(options, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding("xpos", head_dim=8, num_heads=2, **options)
    with pytest.raises(ValueError, match="head_dim must be even for xpos"):
        poskit.build_encoding("xpos", head_dim=7, num_heads=2)
