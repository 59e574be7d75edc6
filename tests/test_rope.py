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
    got = poskit.attention_scores(q, k, enc, causal=False, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp))
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
    a = poskit.attention_scores(q, k, build("rope", head_dim=D, num_heads=1))
    b = poskit.attention_scores(q[..., perm], k[..., perm], build("rope", head_dim=D, num_heads=1, layout="half"))
    assert torch.allclose(a, b, atol=1e-12)


def test_long_term_decay_bound_appendix_c():
    """RoFormer App. C: |sum_i h_i e^{i m theta_i}| <= max_i |h_{i+1} - h_i| sum_i |S_{i+1}|, and the
    relative upper bound (1/(d/2)) sum_i |S_i| decays with the distance m."""
    d = 128
    theta = 10000.0 ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)

    def partial_sums(m):
        return torch.cumsum(torch.exp(1j * m * theta), 0)  # S_1..S_{d/2}

    def relative_bound(m):
        return partial_sums(m).abs().mean().item()

    near = sum(relative_bound(m) for m in range(0, 8)) / 8
    mid = sum(relative_bound(m) for m in range(64, 128)) / 64
    far = sum(relative_bound(m) for m in range(1024, 2048, 8)) / 128
    assert near > mid > far
    # the Abel-summation bound holds for random q, k at many distances
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    h = torch.complex(q[0::2], q[1::2]) * torch.conj(torch.complex(k[0::2], k[1::2]))
    h_ext = torch.cat((h, torch.zeros(1, dtype=h.dtype)))
    for m in [0, 1, 5, 50, 500, 5000]:
        value = (h * torch.exp(1j * m * theta)).sum().abs().item()
        bound = (h_ext[1:] - h_ext[:-1]).abs().max().item() * partial_sums(m).abs().sum().item()
        assert value <= bound + 1e-9


def test_rope_fp32_relative_property_at_a_million():
    D = 64
    enc = build("rope", head_dim=D, num_heads=2, dtype=torch.float32)
    q = torch.randn(1, 2, 6, D)
    k = torch.randn(1, 2, 6, D)
    pos = torch.arange(6)
    base = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos)
    far = poskit.attention_scores(q, k, enc, q_positions=pos + 1_000_000, k_positions=pos + 1_000_000)
    finite = torch.isfinite(base)
    assert torch.allclose(base[finite], far[finite], atol=1e-3)


def test_rope_gradcheck():
    enc = build("rope", head_dim=8, num_heads=2, layout="half", rotary_dim=6)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: poskit.attention(q, k, v, enc, backend="reference"), (q, k, v))


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
