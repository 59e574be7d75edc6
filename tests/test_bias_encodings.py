"""ALiBi and learned relative encodings against their definitions (loops, float64)."""
import math

import pytest
import torch

import poskit
from poskit.encodings.alibi import alibi_slopes
from conftest import build
from grad_helpers import assert_same_gradients, call_with_params


def test_alibi_slopes_power_of_two():
    for H in (1, 2, 4, 8, 16):
        assert alibi_slopes(H) == pytest.approx([2 ** (-8 * h / H) for h in range(1, H + 1)], rel=1e-15)


# Press et al.'s rule for H not a power of two, written out by hand: n = the largest power of two below H gives
# the n-head slopes 2^(-8h/n), h = 1..n; the remaining H - n slopes are every other slope (the 1st, 3rd, ...)
# of the 2n-head set 2^(-8h/2n).
PRESS_SLOPES = {
    # n = 2: 2^-4, 2^-8; 4-head set 2^-2, 2^-4, 2^-6, 2^-8 -> every other: 2^-2 (1 needed)
    3: [2**-4, 2**-8, 2**-2],
    # n = 4: 2^-2 .. 2^-8; 8-head set 2^-1 .. 2^-8 -> every other: 2^-1, 2^-3 (2 needed)
    6: [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3],
    # n = 8: 2^-1 .. 2^-8; 16-head set 2^-0.5, 2^-1, 2^-1.5, ... -> every other: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    12: [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8, 2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5],
}


@pytest.mark.parametrize("H", sorted(PRESS_SLOPES))
def test_alibi_slopes_interpolated_like_press_et_al(H):
    assert alibi_slopes(H) == pytest.approx(PRESS_SLOPES[H], rel=1e-15)
    enc = build("alibi", head_dim=4, num_heads=H)
    assert torch.allclose(enc.slopes, torch.tensor(PRESS_SLOPES[H], dtype=torch.float64), rtol=1e-15, atol=0)


def alibi_reference_logits(q, k, qp, kp, slopes, causal):
    """scale q_t . k_s - m_h |t - s| (-inf where masked), loops, float64; autograd flows through q and k."""
    B, H, Tq, D = q.shape
    groups = H // k.shape[1]
    rows = []
    for b in range(B):
        for h in range(H):
            for t in range(Tq):
                for s in range(len(kp)):
                    if causal and kp[s] > qp[t]:
                        rows.append(torch.tensor(float("-inf"), dtype=torch.float64))
                    else:
                        rows.append(q[b, h, t] @ k[b, h // groups, s] / math.sqrt(D) - slopes[h] * abs(qp[t] - kp[s]))
    return torch.stack(rows).reshape(B, H, Tq, len(kp))


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_logits(causal):
    H, D = 3, 4
    enc = build("alibi", head_dim=D, num_heads=H)
    q = torch.randn(1, H, 4, D, dtype=torch.float64)
    k = torch.randn(1, H, 5, D, dtype=torch.float64)
    qp, kp = [1, 2, 3, 4], [0, 1, 2, 3, 4]
    got = poskit.attention_scores(q, k, enc, is_causal=causal, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), enable_gqa=True)
    want = alibi_reference_logits(q, k, qp, kp, PRESS_SLOPES[3], causal)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    assert torch.allclose(got[fin], want[fin], atol=1e-12, rtol=0)


def softmax_attention(logits, v):
    """softmax over the keys (masked = -inf) times v, kv heads repeated for grouped queries."""
    return torch.softmax(logits, dim=-1) @ v.repeat_interleave(logits.shape[1] // v.shape[1], dim=1)


@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_alibi_gradients_equal_reference_gradients(backend):
    H, T, D = 6, 5, 4
    enc = build("alibi", head_dim=D, num_heads=H)
    q, k, v = torch.randn(2, H, T, D), torch.randn(2, 3, T, D), torch.randn(2, 3, T, D)
    pos = list(range(T))
    assert_same_gradients(
        lambda q, k, v: poskit.attention(q, k, v, enc, backend=backend, is_causal=True, enable_gqa=True),
        lambda q, k, v: softmax_attention(alibi_reference_logits(q, k, pos, pos, PRESS_SLOPES[6], True), v),
        [q.double(), k.double(), v.double()],
    )


def relative_reference_logits(q, k, qp, kp, e, max_distance, causal, cap=False):
    """scale q_t . (k_s + e[t - s]) (-inf where masked), e row o + M for offset o, loops, float64."""
    B, H, Tq, D = q.shape
    groups = H // k.shape[1]
    M = max_distance
    rows = []
    for b in range(B):
        for h in range(H):
            for t in range(Tq):
                for s in range(len(kp)):
                    off = qp[t] - kp[s]
                    if causal and off < 0:
                        rows.append(torch.tensor(float("-inf"), dtype=torch.float64))
                        continue
                    if cap:
                        off = max(-M, min(off, M))
                    rows.append(q[b, h, t] @ (k[b, h // groups, s] + e[off + M]) / math.sqrt(D))
    return torch.stack(rows).reshape(B, H, Tq, len(kp))


def test_relative_logits_match_definition():
    H, D, M = 2, 4, 5
    enc = build("relative", head_dim=D, num_heads=H, max_distance=M)
    e = enc.embeddings.detach()
    q = torch.randn(2, H, 4, D, dtype=torch.float64)
    k = torch.randn(2, 1, 6, D, dtype=torch.float64)
    qp, kp = [2, 3, 4, 5], [0, 1, 2, 3, 4, 5]
    got = poskit.attention_scores(q, k, enc, is_causal=False, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp), enable_gqa=True)
    assert torch.allclose(got, relative_reference_logits(q, k, qp, kp, e, M, causal=False), atol=1e-12, rtol=0)


@pytest.mark.parametrize("cap", [False, True])
def test_relative_gradients_equal_reference_gradients(cap):
    H, T, D, M = 2, 6, 4, 3 if cap else 6  # capped: offsets 4, 5 share the last embedding
    enc = build("relative", head_dim=D, num_heads=H, max_distance=M, cap=cap, init_std=0.5)
    q, k, v = torch.randn(1, H, T, D), torch.randn(1, 1, T, D), torch.randn(1, 1, T, D)
    pos = list(range(T))
    assert_same_gradients(
        lambda q, k, v, e: call_with_params(enc, {"embeddings": e}, lambda: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)),
        lambda q, k, v, e: softmax_attention(relative_reference_logits(q, k, pos, pos, e, M, True, cap), v),
        [q.double(), k.double(), v.double(), enc.embeddings.detach()],
    )


def test_relative_rejects_offsets_beyond_table_and_capped_uses_last_embedding():
    D, M = 4, 3
    q = torch.randn(1, 1, 8, D, dtype=torch.float64)
    k = torch.randn(1, 1, 8, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="max_distance=3"):
        poskit.attention_scores(q, k, build("relative", head_dim=D, num_heads=1, max_distance=M), is_causal=True, enable_gqa=True)
    capped = build("relative", head_dim=D, num_heads=1, max_distance=M, cap=True)
    got = poskit.attention_scores(q, k, capped, is_causal=True, enable_gqa=True)
    e = capped.embeddings.detach()
    for t, s in [(7, 0), (7, 3), (5, 1), (2, 1)]:
        off = min(t - s, M)
        want = q[0, 0, t] @ (k[0, 0, s] + e[off + M]) / 2
        assert got[0, 0, t, s].item() == pytest.approx(want.item(), abs=1e-12)
    alias = build("relative-capped", head_dim=D, num_heads=1, max_distance=M)
    alias.load_state_dict(capped.state_dict())
    assert torch.equal(poskit.attention_scores(q, k, alias, is_causal=True, enable_gqa=True), got)


@pytest.mark.parametrize("name", ["relative", "alibi"])
def test_bias_encodings_gradcheck(name):
    enc = build(name, head_dim=4, num_heads=2, **({"max_distance": 4} if name == "relative" else {}))
    q = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True), (q, k, v))
    if name == "relative":
        e = enc.embeddings.detach().clone().requires_grad_(True)
        attend = lambda: poskit.attention(q.detach(), k.detach(), v.detach(), enc, backend="reference", is_causal=True, enable_gqa=True)
        assert torch.autograd.gradcheck(lambda e: call_with_params(enc, {"embeddings": e}, attend), (e,))
