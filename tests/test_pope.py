"""PoPE against the paper's eq. 5 (loops, float64) and the Cartesian form of eq. 6-9."""
import math

import pytest
import torch
import torch.nn.functional as F

import poskit
from conftest import build
from grad_helpers import assert_same_gradients, call_with_params


def reference_pope_logits(q, k, q_pos, k_pos, delta, base, scale, softplus=True):
    """eq. 5: a_ts = sum_c mu_q mu_k cos((s - t) theta_c + delta_c), theta_c = base^(-c/d), loops over c."""
    B, H, Tq, d = q.shape
    groups = H // k.shape[1]
    mu_q = F.softplus(q) if softplus else q
    mu_k = F.softplus(k) if softplus else k
    out = torch.zeros(B, H, Tq, k.shape[2], dtype=torch.float64)
    for h in range(H):
        for c in range(d):
            theta = base ** (-c / d)
            rel = (torch.tensor(k_pos, dtype=torch.float64)[None, :] - torch.tensor(q_pos, dtype=torch.float64)[:, None])
            phase = torch.cos(rel * theta + delta[h, c])
            out[:, h] += mu_q[:, h, :, c, None] * mu_k[:, h // groups, None, :, c] * phase
    return scale * out


@pytest.mark.parametrize("softplus, phase_bias", [(True, True), (False, True), (True, False), (False, False)])
def test_pope_logits_equal_eq5(softplus, phase_bias):
    d, H = 8, 4
    enc = build("pope", head_dim=d, num_heads=H, softplus=softplus, phase_bias=phase_bias, base=100.0)
    q = torch.randn(2, H, 5, d, dtype=torch.float64)
    k = torch.randn(2, 2, 6, d, dtype=torch.float64)
    qp, kp = [2, 3, 9, 10, 11], [0, 1, 2, 3, 9, 11]
    got = poskit.attention_scores(q, k, enc, is_causal=False, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), enable_gqa=True)
    delta = enc.delta.detach().clamp(-2 * math.pi, 0) if phase_bias else torch.zeros(H, d, dtype=torch.float64)
    want = reference_pope_logits(q, k, qp, kp, delta, 100.0, 1 / math.sqrt(d), softplus)
    assert torch.allclose(got, want, atol=1e-12)


def test_eq5_equals_cartesian_eq6_to_9():
    """q' = [mu cos phi_q, mu sin phi_q], k' = [mu cos(phi_k + delta), mu sin(phi_k + delta)] (the paper puts
    delta on the key), Re[q^H k] = ordinary dot product of width 2d."""
    d, H = 6, 2
    enc = build("pope", head_dim=d, num_heads=H)
    q = torch.randn(1, H, 4, d, dtype=torch.float64)
    k = torch.randn(1, H, 4, d, dtype=torch.float64)
    pos = torch.arange(4, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(d, dtype=torch.float64) / d)
    delta = enc.delta.detach()
    mu_q, mu_k = F.softplus(q), F.softplus(k)
    phi_q = pos[:, None] * theta
    phi_k = pos[:, None] * theta + delta[:, None, :]  # (H, T, d)
    qx, qy = mu_q * torch.cos(phi_q), mu_q * torch.sin(phi_q)
    kx, ky = mu_k * torch.cos(phi_k), mu_k * torch.sin(phi_k)
    cart = torch.cat((qx, qy), -1) @ torch.cat((kx, ky), -1).transpose(-1, -2) / math.sqrt(d)
    complex_form = (torch.conj(torch.complex(qx, qy)) @ torch.complex(kx, ky).transpose(-1, -2)).real / math.sqrt(d)
    got = poskit.attention_scores(q, k, enc, is_causal=False, enable_gqa=True)
    assert torch.allclose(cart, complex_form, atol=1e-12)
    assert torch.allclose(got, cart, atol=1e-12)


def test_pope_frequencies_are_one_per_channel():
    enc = build("pope", head_dim=8, num_heads=1, base=10000.0)
    assert enc.inv_freq.shape == (8,)
    assert torch.allclose(enc.inv_freq, 10000.0 ** (-torch.arange(8, dtype=torch.float64) / 8))


def test_delta_is_clamped_in_forward_and_initialised_in_range():
    enc = build("pope", head_dim=8, num_heads=2, delta_init="uniform")
    assert enc.delta.shape == (2, 8)
    assert (enc.delta >= -2 * math.pi).all() and (enc.delta <= 0).all() and enc.delta.std() > 0.5
    assert torch.equal(build("pope", head_dim=8, num_heads=2, delta_init="zero").delta, torch.zeros(2, 8, dtype=torch.float64))
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        enc.delta.fill_(1.0)  # outside [-2 pi, 0]: behaves as 0
    zero = build("pope", head_dim=8, num_heads=2, delta_init="zero")
    assert torch.allclose(poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True), poskit.attention_scores(q, k, zero, is_causal=True, enable_gqa=True))
    with torch.no_grad():
        enc.delta.fill_(-10.0)  # behaves as -2 pi, i.e. as 0 again (a full turn)
    assert torch.allclose(poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True), poskit.attention_scores(q, k, zero, is_causal=True, enable_gqa=True), atol=1e-12)


def test_zero_initialised_delta_still_gets_gradient():
    enc = build("pope", head_dim=8, num_heads=2, delta_init="zero")
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True).square().sum().backward()
    assert enc.delta.grad is not None and enc.delta.grad.abs().sum() > 0


def test_pope_gradcheck_q_k_v_delta():
    enc = build("pope", head_dim=4, num_heads=2, delta_init="uniform")
    q = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)

    delta = (enc.delta.detach() * 0.9 - 0.1).requires_grad_(True)  # away from the clamp boundaries
    attend = lambda q, k, v, dl: call_with_params(enc, {"delta": dl}, lambda: poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True))
    assert torch.autograd.gradcheck(attend, (q, k, v, delta))


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_pope_gradients_equal_eq5_gradients(backend):
    """Gradients for q, k, v and delta through poskit (reference and, on CPU, the blocked path with its own
    backward) equal those through eq. 5 written with loops."""
    d, H, T = 4, 2, 6
    enc = build("pope", head_dim=d, num_heads=H, delta_init="uniform")
    pos = list(range(T))
    vis = torch.ones(T, T, dtype=torch.bool).tril()

    def reference(q, k, v, delta):
        logits = reference_pope_logits(q, k, pos, pos, delta.clamp(-2 * math.pi, 0), 10000.0, 1 / math.sqrt(d))
        return torch.softmax(logits.masked_fill(~vis, float("-inf")), -1) @ v.repeat_interleave(H // k.shape[1], dim=1)

    delta = enc.delta.detach() * 0.9 - 0.1  # inside (-2 pi, 0): the clamp passes gradients
    q, k, v = torch.randn(2, H, T, d), torch.randn(2, 1, T, d), torch.randn(2, 1, T, 3)
    assert_same_gradients(
        lambda q, k, v, dl: call_with_params(enc, {"delta": dl}, lambda: poskit.attention(q, k, v, enc, backend=backend, is_causal=True, enable_gqa=True)),
        reference,
        [q.double(), k.double(), v.double(), delta],
    )


def test_pope_fp32_relative_property_at_a_million():
    d = 64
    enc = build("pope", head_dim=d, num_heads=2, dtype=torch.float32, delta_init="uniform")
    q, k = torch.randn(1, 2, 6, d), torch.randn(1, 2, 6, d)
    pos = torch.arange(6)
    a = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos, is_causal=True, enable_gqa=True)
    b = poskit.attention_scores(q, k, enc, q_positions=pos + 1_000_000, k_positions=pos + 1_000_000, is_causal=True, enable_gqa=True)
    fin = torch.isfinite(a)
    assert torch.allclose(a[fin], b[fin], atol=1e-3)


def test_pope_bad_options():
    with pytest.raises(ValueError, match="delta_init must be one of"):
        poskit.build_encoding("pope", head_dim=8, num_heads=2, delta_init="normal")
    with pytest.raises(ValueError, match="unknown option"):
        poskit.build_encoding("pope", head_dim=8, num_heads=2, layout="half")
