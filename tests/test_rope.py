"""RoPE against RoFormer's rotation-matrix form (eq. 15) and element-wise form (eq. 34), float64."""
import math

import pytest
import torch

import poskit
from poskit.encodings.rotary import rotate
from conftest import build


def rotation_matrix(pos: float, d: int, rotary_dim: int, base: float, layout: str) -> torch.Tensor:
    """R_{Theta, m} of eq. 15: block-diagonal 2x2 rotations, identity on channels past rotary_dim."""
    R = torch.eye(d, dtype=torch.float64)
    for i in range(rotary_dim // 2):
        theta = base ** (-2 * i / rotary_dim)
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + rotary_dim // 2)
        c, s = math.cos(pos * theta), math.sin(pos * theta)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def reference_rope_logits(q, k, q_pos, k_pos, rotary_dim, base, layout, scale):
    B, H, Tq, D = q.shape
    out = torch.empty(B, H, Tq, k.shape[2], dtype=torch.float64)
    for t in range(Tq):
        Rt = rotation_matrix(q_pos[t], D, rotary_dim, base, layout)
        for s in range(k.shape[2]):
            Rs = rotation_matrix(k_pos[s], D, rotary_dim, base, layout)
            # (R_t q)^T (R_s k) = q^T R_{s-t} k  (eq. 16)
            out[:, :, t, s] = scale * ((q[:, :, t] @ Rt.T) * (k[:, :, s] @ Rs.T)).sum(-1)
    return out


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rope_logits_equal_rotation_matrix_form(layout, rotary_dim):
    D = 12
    enc = build("rope", head_dim=D, num_heads=2, layout=layout, rotary_dim=rotary_dim, base=500.0)
    q = torch.randn(1, 2, 5, D, dtype=torch.float64)
    k = torch.randn(1, 2, 6, D, dtype=torch.float64)
    qp, kp = [3, 7, 8, 20, 21], [0, 2, 7, 8, 15, 21]
    got = poskit.attention_scores(q, k, enc, is_causal=False, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), enable_gqa=True)
    want = reference_rope_logits(q, k, qp, kp, rotary_dim or D, 500.0, layout, 1 / math.sqrt(D))
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_elementwise_eq34_equals_matrix_eq15(layout):
    D, pos, base = 10, 13, 10000.0
    x = torch.randn(3, D, dtype=torch.float64)
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    got = rotate(x, torch.cos(pos * inv), torch.sin(pos * inv), layout)
    assert torch.allclose(got, x @ rotation_matrix(pos, D, D, base, layout).T, atol=1e-13)


def test_half_layout_is_a_permutation_of_interleaved():
    D = 8
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # half-layout channel j holds interleaved channel perm[j]
    q = torch.randn(1, 1, 4, D, dtype=torch.float64)
    k = torch.randn(1, 1, 4, D, dtype=torch.float64)
    a = poskit.attention_scores(q, k, build("rope", head_dim=D, num_heads=1), is_causal=True, enable_gqa=True)
    b = poskit.attention_scores(q[..., perm], k[..., perm], build("rope", head_dim=D, num_heads=1, layout="half"), is_causal=True, enable_gqa=True)
    assert torch.allclose(a, b, atol=1e-12)


def logits_by_distance(enc, q_vec, k_vec, max_distance):
    """poskit's logit between q_vec at position max_distance and k_vec at positions 0..max_distance,
    returned by relative distance m = t - s = 0..max_distance, divided by the scale."""
    d = q_vec.shape[-1]
    q = q_vec.reshape(1, 1, 1, d)
    k = k_vec.reshape(1, 1, 1, d).expand(1, 1, max_distance + 1, d)
    row = poskit.attention_scores(q, k, enc, q_positions=torch.tensor([max_distance]),
                                  k_positions=torch.arange(max_distance + 1), scale=1.0, is_causal=True, enable_gqa=True)[0, 0, 0]
    return row.flip(0)  # key s sits at distance max_distance - s


def test_long_term_decay_appendix_c():
    """RoFormer App. C, measured through poskit's RoPE (d = 128, base 10000, Fig. 3's setting).

    With q = k = all ones every pair contributes h_i = (1 + 1j)(1 - 1j) = 2, so the logit at distance m is
    2 Re S_{d/2}(m), S_j(m) = sum_{i<j} e^{i m theta_i}: it is large near m = 0 and decays with m.
    For random q, k the Abel-summation bound |logit(m)| <= max_i |h_{i+1} - h_i| sum_i |S_{i+1}(m)| holds, with
    S from poskit's own inv_freq, and the relative upper bound mean_i |S_i(m)| decays with m.
    """
    d, far_end = 128, 2048
    enc = build("rope", head_dim=d, num_heads=1)
    theta = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert torch.allclose(enc.inv_freq, theta, rtol=1e-14, atol=0)

    ones = logits_by_distance(enc, torch.ones(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64), far_end)
    m = torch.arange(far_end + 1, dtype=torch.float64)
    assert torch.allclose(ones, 2 * torch.cos(m[:, None] * theta).sum(-1), atol=1e-9)  # 2 Re S_{d/2}(m)
    assert ones[0].item() == pytest.approx(d, abs=1e-9)
    near, mid, far = ones[1:8].abs().mean(), ones[64:128].abs().mean(), ones[1024:2048].abs().mean()
    assert near > mid > 2 * far  # decays with the distance

    def partial_sums(dist):
        return torch.cumsum(torch.exp(1j * dist * enc.inv_freq), 0)  # S_1..S_{d/2}

    def relative_bound(dist):
        return partial_sums(dist).abs().mean().item()

    assert relative_bound(0) > sum(relative_bound(j) for j in range(64, 128)) / 64 > sum(
        relative_bound(j) for j in range(1024, 2048, 8)) / 128

    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    h = torch.complex(q[0::2], q[1::2]) * torch.conj(torch.complex(k[0::2], k[1::2]))
    h_ext = torch.cat((h, torch.zeros(1, dtype=h.dtype)))  # h_{d/2 + 1} = 0 closes the Abel sum
    logits = logits_by_distance(enc, q, k, far_end)
    for dist in [0, 1, 5, 50, 500, 2000]:
        assert logits[dist].item() == pytest.approx((h * torch.exp(1j * dist * theta)).sum().real.item(), abs=1e-9)
        bound = (h_ext[1:] - h_ext[:-1]).abs().max().item() * partial_sums(dist).abs().sum().item()
        assert abs(logits[dist].item()) <= bound + 1e-9


def test_rope_fp32_relative_property_at_a_million():
    D = 64
    enc = build("rope", head_dim=D, num_heads=2, dtype=torch.float32)
    q = torch.randn(1, 2, 6, D)
    k = torch.randn(1, 2, 6, D)
    pos = torch.arange(6)
    base = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos, is_causal=True, enable_gqa=True)
    far = poskit.attention_scores(q, k, enc, q_positions=pos + 1_000_000, k_positions=pos + 1_000_000, is_causal=True, enable_gqa=True)
    finite = torch.isfinite(base)
    assert torch.allclose(base[finite], far[finite], atol=1e-3)


def test_rope_gradcheck():
    enc = build("rope", head_dim=8, num_heads=2, layout="half", rotary_dim=6)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True), (q, k, v))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(head_dim=7), "head_dim must be even"),
        (dict(layout="diagonal"), "layout must be one of"),
        (dict(rotary_dim=3), "rotary_dim must be an even int"),
        (dict(rotary_dim=32), "rotary_dim must be an even int"),
        (dict(factor=2.0), "factor and original_max_positions apply only"),
    ],
)
def test_rope_bad_options(kwargs, match):
    kwargs = dict(dict(head_dim=16, num_heads=2), **kwargs)
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding("rope", **kwargs)


@pytest.mark.parametrize("name", ["rope-linear", "rope-ntk", "rope-dynamic", "rope-yarn"])
def test_scaling_variants_require_factor(name):
    with pytest.raises(ValueError, match="factor must be"):
        poskit.build_encoding(name, head_dim=16, num_heads=2)
