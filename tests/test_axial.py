"""Axial positions (B, T, n) for rope and pope (`axial_dims`): float64 formulas written here, relative
invariance per axis, the paths that serve them, and the refusals."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import poskit
from poskit.attention.engine import cached_attention, route
from poskit.attention.kv_cache import KVCache
from poskit.attention.linear import linear_attention
from cpu_kernel_helpers import kernel_off


def rope_axial_logits(q, k, qp, kp, dims, base, scale):
    """scale * sum_a (R_a(t_a) q_a) . (R_a(s_a) k_a): channel group a rotated by coordinate a with
    frequencies base^(-2i/d_a) (interleaved pairs), pair by pair in float64."""
    B, H, Tq, D = q.shape
    out = torch.zeros(B, H, Tq, k.shape[2], dtype=torch.float64)
    for t in range(Tq):
        for s in range(k.shape[2]):
            lo = 0
            for a, d in enumerate(dims):
                for i in range(d // 2):
                    theta = base ** (-2 * i / d)
                    c0, c1 = lo + 2 * i, lo + 2 * i + 1
                    # (R(x) u) . (R(y) w) = u . R(y - x) w for a 2-d rotation
                    ang = (int(kp[s, a]) - int(qp[t, a])) * theta
                    qa, qb, ka, kb = q[:, :, t, c0], q[:, :, t, c1], k[:, :, s, c0], k[:, :, s, c1]
                    out[:, :, t, s] += qa * (math.cos(ang) * ka - math.sin(ang) * kb) + qb * (
                        math.sin(ang) * ka + math.cos(ang) * kb)
                lo += d
    return scale * out


def pope_axial_logits(q, k, qp, kp, dims, delta, base, scale):
    """scale * sum_c softplus(q_c) softplus(k_c) cos((s_a - t_a) theta_c + delta_c), channel c in group a with
    theta_c = base^(-c'/d_a), c' its index inside the group."""
    B, H, Tq, D = q.shape
    axis = [a for a, d in enumerate(dims) for _ in range(d)]
    theta = torch.tensor([base ** (-c / d) for d in dims for c in range(d)], dtype=torch.float64)
    mq, mk = F.softplus(q), F.softplus(k)
    out = torch.zeros(B, H, Tq, k.shape[2], dtype=torch.float64)
    for t in range(Tq):
        for s in range(k.shape[2]):
            offset = torch.tensor([int(kp[s, a]) - int(qp[t, a]) for a in axis], dtype=torch.float64)
            out[:, :, t, s] = (mq[:, :, t] * mk[:, :, s] * torch.cos(offset * theta + delta)).sum(-1)
    return scale * out


def grid(h, w):
    """(h * w, 2) (row, column) of a raster-scanned h x w grid."""
    return torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)


def qk(T=6, D=12, H=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, T, D, generator=g, dtype=torch.float64) for _ in range(3)]


def test_rope_axial_equals_per_axis_rotation():
    dims = [4, 8]
    enc = poskit.build_encoding("rope", head_dim=12, num_heads=2, axial_dims=dims, base=100.0)
    q, k, _ = qk()
    qp, kp = torch.tensor([[0, 0], [0, 1], [2, 3], [5, 1], [7, 7], [1, 9]]), grid(2, 3)
    got = poskit.attention_scores(q, k, enc, q_positions=qp, k_positions=kp)
    assert torch.allclose(got, rope_axial_logits(q, k, qp, kp, dims, 100.0, 12 ** -0.5), atol=1e-12)


def test_pope_axial_equals_polar_formula():
    dims = [5, 3, 4]  # video: (frame, row, column)
    enc = poskit.build_encoding("pope", head_dim=12, num_heads=2, axial_dims=dims, delta_init="uniform").double()
    q, k, _ = qk(seed=1)
    qp = torch.tensor([[0, 0, 0], [0, 1, 2], [3, 0, 1], [1, 1, 1], [2, 5, 0], [9, 9, 9]])
    kp = qp.flip(0) + 1
    got = poskit.attention_scores(q, k, enc, q_positions=qp, k_positions=kp)
    want = pope_axial_logits(q, k, qp, kp, dims, enc.delta.detach().double(), 10000.0, 12 ** -0.5)
    assert torch.allclose(got, want, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["rope", "pope"]), shifts=st.lists(st.integers(-50, 10**4), min_size=2, max_size=2),
       seed=st.integers(0, 2**16))
def test_relative_invariance_per_axis(name, shifts, seed):
    # shifting each coordinate by its own constant leaves every logit unchanged: only per-axis offsets count
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2, axial_dims=[4, 4])
    q, k, _ = qk(T=6, D=8, seed=seed)
    pos = grid(2, 3) + 60
    a = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos)
    shifted = pos + torch.tensor(shifts)
    b = poskit.attention_scores(q, k, enc, q_positions=shifted, k_positions=shifted)
    assert torch.allclose(a, b, atol=1e-8)


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(["rope", "pope"]), axis=st.integers(0, 1), shift=st.integers(1, 7),
       seed=st.integers(0, 2**16))
def test_each_axis_is_seen(name, axis, shift, seed):
    # moving only the keys along one axis changes the logits: both coordinates are encoded
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2, axial_dims=[4, 4])
    q, k, _ = qk(T=6, D=8, seed=seed)
    pos = grid(2, 3)
    moved = pos.clone()
    moved[:, axis] += shift
    a = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos)
    b = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=moved)
    assert not torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("name", ["rope", "pope"])
@pytest.mark.parametrize("Tq", [1, 12])  # 1: the grouped-query decode branch of the blocked path
def test_fast_paths_equal_reference(name, Tq):
    enc = poskit.build_encoding(name, head_dim=8, num_heads=4, axial_dims=[2, 6])
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, Tq, 8, generator=g)
    k, v = torch.randn(2, 2, 12, 8, generator=g), torch.randn(2, 2, 12, 8, generator=g)
    kp = grid(3, 4)
    qp = kp[:Tq]
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[1, :3] = False
    for mask in (None, keep[:, None, None, :]):
        fast = poskit.attention(q, k, v, enc, q_positions=qp, k_positions=kp, enable_gqa=True, attn_mask=mask)
        ref = poskit.attention(q, k, v, enc, q_positions=qp, k_positions=kp, enable_gqa=True, attn_mask=mask,
                               backend="reference")
        assert torch.allclose(fast, ref, atol=1e-5)


def test_pope_gradients_on_the_blocked_path_match_the_reference(monkeypatch):
    kernel_off(monkeypatch)  # (the kernel with axial PoPE: test_cpu_flash.py)
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, axial_dims=[4, 4], delta_init="uniform")
    pos = grid(2, 3)  # axial positions: attention() needs them, and so does route()
    assert route(enc, torch.zeros(1, 2, 6, 8), q_positions=pos, k_positions=pos) == "blocked"
    q, k, v = (t.float().requires_grad_() for t in qk(T=6, D=8, seed=4))
    grads = []
    for backend in ("auto", "reference"):
        for t in (q, k, v, enc.delta):
            t.grad = None
        poskit.attention(q, k, v, enc, q_positions=pos, k_positions=pos, backend=backend).pow(2).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v, enc.delta)])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_triton_is_never_chosen_and_refused_by_name():
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, axial_dims=[4, 4])
    assert enc.fused_kernel == "triton_pope" and enc.position_coords == 2
    q, k, v = qk(T=6, D=8)
    with pytest.raises(ValueError, match="backend='triton' takes scalar positions only"):
        poskit.attention(q, k, v, enc, q_positions=grid(2, 3), k_positions=grid(2, 3), backend="triton")


@pytest.mark.parametrize("name", ["rope", "pope"])
def test_linear_attention_takes_axial_positions(name):
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2, axial_dims=[4, 4])
    q, k, v = qk(T=6, D=8, seed=5)
    pos = grid(2, 3)
    a = linear_attention(q, k, v, enc, is_causal=False, q_positions=pos, k_positions=pos)
    b = linear_attention(q, k, v, enc, is_causal=False, q_positions=pos + 11, k_positions=pos + 11)
    assert torch.allclose(a, b, atol=1e-10)


def test_encode_api_takes_axial_positions():
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, axial_dims=[4, 4])
    q, k, v = qk(T=6, D=8, seed=6)
    qe, ke = enc(q, k, grid(2, 3))
    want = poskit.attention(q, k, v, enc, q_positions=grid(2, 3), k_positions=grid(2, 3), backend="reference")
    got = F.scaled_dot_product_attention(qe, ke, v, scale=enc.sdpa_scale())
    assert torch.allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("name, dims, match", [
    ("rope", [4, 6], r"axial_dims must sum to rotary_dim=8"),
    ("rope", [3, 5], r"axial_dims entries must each be an even int >= 2"),
    ("pope", [8, 0], r"axial_dims entries must each be an int >= 1"),
    ("pope", [4, 5], r"axial_dims must sum to head_dim=8"),
    ("pope", "44", r"axial_dims must be a non-empty list"),
    ("pope", [], r"axial_dims must be a non-empty list"),
])
def test_bad_axial_dims(name, dims, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding(name, head_dim=8, num_heads=2, axial_dims=dims)


def test_axial_dims_refused_with_a_scaling():
    with pytest.raises(ValueError, match="axial_dims is accepted by plain rope only"):
        poskit.build_encoding("rope-linear", head_dim=8, num_heads=2, factor=2.0, axial_dims=[4, 4])


def test_positions_not_matching_axial_dims_name_the_argument():
    enc = poskit.build_encoding("rope", head_dim=8, num_heads=2, axial_dims=[2, 2, 4])
    q, k, v = qk(T=6, D=8)
    with pytest.raises(ValueError, match=r"^k_positions must have shape \(6, 3\) or \(1, 6, 3\): the encoding's "
                                         r"axial_dims has 3 entries"):
        poskit.attention(q, k, v, enc, q_positions=torch.zeros(6, 3, dtype=torch.long), k_positions=grid(2, 3))
    with pytest.raises(ValueError, match=r"^q_positions must be given for an encoding with axial_dims"):
        poskit.attention(q, k, v, enc)
    with pytest.raises(ValueError, match=r"^q_positions must have shape"):
        poskit.attention(q, k, v, enc, q_positions=torch.arange(6), k_positions=torch.arange(6))
    with pytest.raises(ValueError, match=r"^is_causal must be False with axial positions"):
        poskit.attention(q, k, v, enc, q_positions=grid(2, 3), k_positions=grid(2, 3), is_causal=True)
    with pytest.raises(ValueError, match=r"^positions must have shape"):
        enc(q, k, torch.zeros(6, 2, dtype=torch.long))


def test_axial_positions_given_to_a_scalar_encoding_name_axial_dims():
    enc = poskit.build_encoding("rope", head_dim=8, num_heads=2)
    q, k, v = qk(T=6, D=8)
    with pytest.raises(ValueError, match=r"^q_positions must have shape .* need an encoding built with axial_dims"):
        poskit.attention(q, k, v, enc, q_positions=grid(2, 3)[None], k_positions=grid(2, 3)[None])


def test_kv_cache_refuses_axial_positions_before_touching_the_cache():
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, axial_dims=[4, 4])
    q, k, v = (t.float() for t in qk(T=6, D=8))
    cache = KVCache(num_layers=1)
    with pytest.raises(ValueError, match="^is_causal must be False with axial positions"):
        cached_attention(q, k, v, enc, cache, 0, grid(2, 3))
    assert cache.length == 0


def test_linear_attention_step_needs_axial_positions():
    from poskit.attention.linear import linear_attention_step

    enc = poskit.build_encoding("rope", head_dim=8, num_heads=2, axial_dims=[4, 4])
    q, k, v = qk(T=2, D=8)
    with pytest.raises(ValueError, match=r"^positions must be given for an encoding with axial_dims"):
        linear_attention_step(q, k, v, enc)
    out, state = linear_attention_step(q, k, v, enc, positions=torch.tensor([[0, 1], [1, 0]]))
    assert out.shape == (1, 2, 2, 8) and state.length == 2
