"""The dynamic position bias against its definition evaluated pair by pair (float64 loops, the MLP written out),
on the reference and the default (blocked learned-bias) paths."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from pair_reference import assert_matches_reference


def dynamic_pair_logit(enc, D):
    """logit = q . k / sqrt(d) + f(x)_h with x = t - s (or sign(t - s) log(1 + |t - s|)) and
    f = Linear, SiLU, ..., Linear, written as one matrix-vector product per layer."""
    def pair_logit(h, q_t, k_s, t, s):
        x = float(t - s)
        if enc.log_distance:
            x = math.copysign(math.log(1 + abs(x)), x) if x else 0.0
        a = torch.tensor([x], dtype=torch.float64)
        layers = list(zip(enc.mlp.weights, enc.mlp.biases))
        for w, b in layers[:-1]:
            z = w @ a + b
            a = z * torch.sigmoid(z)  # SiLU
        w, b = layers[-1]
        return q_t @ k_s / math.sqrt(D) + (w @ a + b)[h]
    return pair_logit


@settings(max_examples=12, deadline=None)
@given(options=st.sampled_from([{}, dict(log_distance=True), dict(hidden=5, depth=1), dict(hidden=3, depth=3,
                                                                                              log_distance=True)]),
       B=st.integers(1, 2), Hkv=st.integers(1, 2), groups=st.sampled_from([1, 2]), Tk=st.integers(1, 6),
       n_new=st.integers(1, 6), step=st.sampled_from([1, 3, 10**6]), causal=st.booleans(), padding=st.booleans(),
       offset=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_dynamic_bias_equals_its_definition(options, B, Hkv, groups, Tk, n_new, step, causal, padding, offset, seed):
    # step 10**6 spreads the distances over more values than there are pairs: the MLP then runs per pair
    # instead of once per distance of the range
    D, H, Tq = 8, Hkv * groups, min(n_new, Tk)
    torch.manual_seed(seed)
    enc = poskit.build_encoding("dynamic", head_dim=D, num_heads=H, **options).double()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    kp = [offset + step * s for s in range(Tk)]
    qp = kp[Tk - Tq:]
    mask = (torch.rand(B, Tk, generator=g) > 0.3) if padding else None
    # the MLP's outputs grow with the raw distance (10^6): an absolute tolerance scaled to them
    atol = 1e-12 if step < 10**6 or options.get("log_distance") else 1e-7
    assert_matches_reference(dynamic_pair_logit(enc, D), enc, q, k, v, qp, kp, causal=causal, key_mask=mask,
                             params=list(enc.mlp.parameters()), atol=atol)


def test_hidden_width_defaults_to_a_quarter_of_the_model_width():
    enc = poskit.build_encoding("dynamic", head_dim=16, num_heads=8)
    assert enc.hidden == 32 and [w.shape for w in enc.mlp.weights] == [(32, 1), (32, 32), (8, 32)]
    assert poskit.build_encoding("dynamic", head_dim=1, num_heads=2).hidden == 1


@pytest.mark.parametrize("options, match", [
    (dict(hidden=0), "hidden must be an int >= 1"),
    (dict(depth=0), "depth must be an int >= 1"),
    (dict(log_distance=1), "log_distance must be true or false"),
])
def test_bad_options_are_refused_naming_the_option(options, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding("dynamic", head_dim=8, num_heads=2, **options)


def test_sparse_positions_take_the_per_pair_mlp_with_the_same_values():
    # distances {-10^6, 0, 10^6} over 4 pairs: the range path would run the MLP 2 * 10^6 + 1 times; per pair
    # it runs 4 times, and each value equals the one-pair call (which takes the range path)
    enc = poskit.build_encoding("dynamic", head_dim=4, num_heads=2, log_distance=True).double()
    q = torch.zeros(1, 2, 2, 4, dtype=torch.float64)
    pos = torch.tensor([[0, 10**6]])
    both = enc.bias(q, pos, pos, 1.0)
    for t in range(2):
        for s in range(2):
            one = enc.bias(q[:, :, :1], pos[:, t:t + 1], pos[:, s:s + 1], 1.0)
            torch.testing.assert_close(both[..., t:t + 1, s:s + 1], one, atol=1e-15, rtol=0)
