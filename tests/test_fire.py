"""FIRE against its paper's formula evaluated pair by pair (float64 loops, the MLP written out), on the reference
and the default (blocked learned-bias) paths; its thresholded normaliser."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from pair_reference import assert_matches_reference


def fire_pair_logit(enc, D):
    """b(i, j) = f(psi(|i - j|) / (psi(max(L, i)) + eps)), psi(x) = log(|c x| + 1), L = |l * L0|,
    f(u)_h = sum_n W2[h, n] relu(W1[n] u + b1[n]) + b2[h]; logit = q . k / sqrt(d) + b."""
    w1, w2 = enc.mlp.weights
    b1, b2 = enc.mlp.biases

    def psi(x):
        return torch.log(torch.abs(enc.c * x) + 1)

    def pair_logit(h, q_t, k_s, i, j):
        L = torch.abs(enc.threshold_scale * enc.threshold_init)
        u = psi(abs(i - j)) / (psi(torch.maximum(torch.tensor(float(i), dtype=torch.float64), L)) + enc.eps)
        hidden = [torch.relu(w1[n, 0] * u + b1[n]) for n in range(w1.shape[0])]
        return q_t @ k_s / math.sqrt(D) + sum(w2[h, n] * hidden[n] for n in range(len(hidden))) + b2[h]
    return pair_logit


@settings(max_examples=10, deadline=None)
@given(options=st.sampled_from([{}, dict(c_init=1.0, threshold_init=6.0), dict(mlp_width=3, threshold_init=0.0),
                                dict(c_init=0.02, threshold_init=20.0, eps=0.5)]),
       B=st.integers(1, 2), Hkv=st.integers(1, 2), groups=st.sampled_from([1, 2]), Tk=st.integers(1, 6),
       n_new=st.integers(1, 6), step=st.integers(1, 9), causal=st.booleans(), padding=st.booleans(),
       offset=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_fire_equals_the_papers_formula(options, B, Hkv, groups, Tk, n_new, step, causal, padding, offset, seed):
    D, H, Tq = 8, Hkv * groups, min(n_new, Tk)
    torch.manual_seed(seed)
    enc = poskit.build_encoding("fire", head_dim=D, num_heads=H, **options).double()
    with torch.no_grad():  # a multiplier away from 1, so that a wrong L shows
        enc.threshold_scale.fill_(-1.25)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    kp = [offset + step * s for s in range(Tk)]
    qp = kp[Tk - Tq:]
    mask = (torch.rand(B, Tk, generator=g) > 0.3) if padding else None
    assert_matches_reference(fire_pair_logit(enc, D), enc, q, k, v, qp, kp, causal=causal, key_mask=mask,
                             params=[enc.c, enc.threshold_scale, *enc.mlp.parameters()])


@settings(max_examples=30, deadline=None)
@given(i=st.integers(0, 10**9), back=st.integers(0, 10**9), c=st.floats(1e-3, 10.0), L=st.floats(0.0, 1e4))
def test_causal_inputs_stay_in_the_unit_interval(i, back, c, L):
    # progressive interpolation: for keys at or before the query (j = i - back >= 0), |i - j| <= max(L, i), so the
    # MLP only ever sees inputs in [0, 1], however long the sequence
    j = max(i - back, 0)
    enc = poskit.build_encoding("fire", head_dim=4, num_heads=2, c_init=c, threshold_init=L).double()
    u = enc.normalised_distance(torch.tensor([[i]]), torch.tensor([[j]]), torch.float64)
    assert 0.0 <= u.item() <= 1.0
    b = enc.bias(torch.zeros(1, 2, 1, 4, dtype=torch.float64), torch.tensor([[i]]), torch.tensor([[j]]), 1.0)
    assert torch.isfinite(b).all()


def test_before_the_threshold_the_distance_alone_counts_and_past_it_the_query_position_too():
    enc = poskit.build_encoding("fire", head_dim=4, num_heads=2, threshold_init=100.0, c_init=0.5).double()
    u = lambda i, j: enc.normalised_distance(torch.tensor([[i]]), torch.tensor([[j]]), torch.float64).item()
    assert u(10, 3) == u(60, 53) == u(100, 93) == pytest.approx(math.log(1 + 3.5) / (math.log(1 + 50) + 1e-6),
                                                                 rel=1e-15)
    assert u(200, 193) == pytest.approx(math.log(1 + 3.5) / (math.log(1 + 100) + 1e-6), rel=1e-15)
    assert u(200, 193) < u(100, 93)  # the same distance reads as nearer from further along


def test_the_threshold_and_c_are_learned():
    enc = poskit.build_encoding("fire", head_dim=4, num_heads=2, threshold_init=4.0).double()
    assert {n for n, p in enc.named_parameters()} >= {"c", "threshold_scale"}
    q = torch.randn(1, 2, 10, 4, dtype=torch.float64)
    out = poskit.attention(q, q, q, enc, is_causal=True)
    out.square().sum().backward()
    assert enc.c.grad.abs() > 0 and enc.threshold_scale.grad.abs() > 0  # queries before and past L = 4


@pytest.mark.parametrize("options, match", [
    (dict(mlp_width=0), "mlp_width must be an int >= 1"),
    (dict(c_init=0.0), "c_init must be a finite number > 0"),
    (dict(threshold_init=-1.0), "threshold_init must be a finite number >= 0"),
    (dict(eps=0.0), "eps must be a finite number > 0"),
])
def test_bad_options_are_refused_naming_the_option(options, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding("fire", head_dim=8, num_heads=2, **options)
