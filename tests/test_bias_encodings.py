"""ALiBi and learned relative encodings against their definitions (loops, float64)."""
import math

import pytest
import torch

import poskit
from poskit.encodings.alibi import alibi_slopes
from conftest import build


def test_alibi_slopes_power_of_two():
    for H in (1, 2, 4, 8, 16):
        assert alibi_slopes(H) == pytest.approx([2 ** (-8 * h / H) for h in range(1, H + 1)], rel=1e-15)


def test_alibi_slopes_interpolated_like_press_et_al():
    # Press et al.'s reference: slopes of the nearest smaller power of two, then every other slope of the next one.
    # H = 6: [2^-2, 2^-4, 2^-6, 2^-8] + [2^-1, 2^-3]; H = 12: 8-head slopes + 16-head slopes 1, 3 (0-based 0, 2, ...)
    assert alibi_slopes(6) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    assert alibi_slopes(12) == pytest.approx([2 ** (-h) for h in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5])


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_logits(causal):
    H, D = 3, 4
    enc = build("alibi", head_dim=D, num_heads=H)
    q = torch.randn(1, H, 4, D, dtype=torch.float64)
    k = torch.randn(1, H, 5, D, dtype=torch.float64)
    qp, kp = [1, 2, 3, 4], [0, 1, 2, 3, 4]
    got = poskit.attention_scores(q, k, enc, causal=causal, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp))
    slopes = alibi_slopes(H)
    for h in range(H):
        for t in range(4):
            for s in range(5):
                if causal and kp[s] > qp[t]:
                    assert got[0, h, t, s] == float("-inf")
                    continue
                want = (q[0, h, t] @ k[0, h, s]).item() / 2 - slopes[h] * abs(qp[t] - kp[s])
                assert got[0, h, t, s].item() == pytest.approx(want, abs=1e-12)


def test_relative_logits_match_definition():
    H, D, M = 2, 4, 5
    enc = build("relative", head_dim=D, num_heads=H, max_distance=M)
    e = enc.embeddings.detach()
    q = torch.randn(2, H, 4, D, dtype=torch.float64)
    k = torch.randn(2, 1, 6, D, dtype=torch.float64)
    qp, kp = [2, 3, 4, 5], [0, 1, 2, 3, 4, 5]
    got = poskit.attention_scores(q, k, enc, causal=False, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp))
    for b in range(2):
        for h in range(H):
            for t in range(4):
                for s in range(6):
                    off = qp[t] - kp[s]
                    want = q[b, h, t] @ (k[b, 0, s] + e[off + M]) / math.sqrt(D)
                    assert got[b, h, t, s].item() == pytest.approx(want.item(), abs=1e-12)


def test_relative_rejects_offsets_beyond_table_and_capped_uses_last_embedding():
    D, M = 4, 3
    q = torch.randn(1, 1, 8, D, dtype=torch.float64)
    k = torch.randn(1, 1, 8, D, dtype=torch.float64)
    with pytest.raises(ValueError, match="max_distance=3"):
        poskit.attention_scores(q, k, build("relative", head_dim=D, num_heads=1, max_distance=M))
    capped = build("relative", head_dim=D, num_heads=1, max_distance=M, cap=True)
    got = poskit.attention_scores(q, k, capped)
    e = capped.embeddings.detach()
    for t, s in [(7, 0), (7, 3), (5, 1), (2, 1)]:
        off = min(t - s, M)
        want = q[0, 0, t] @ (k[0, 0, s] + e[off + M]) / 2
        assert got[0, 0, t, s].item() == pytest.approx(want.item(), abs=1e-12)
    alias = build("relative-capped", head_dim=D, num_heads=1, max_distance=M)
    alias.load_state_dict(capped.state_dict())
    assert torch.equal(poskit.attention_scores(q, k, alias), got)


@pytest.mark.parametrize("name", ["relative", "alibi"])
def test_bias_encodings_gradcheck(name):
    enc = build(name, head_dim=4, num_heads=2, **({"max_distance": 4} if name == "relative" else {}))
    q = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: poskit.attention(q, k, v, enc, backend="reference"), (q, k, v))
    if name == "relative":
        e0 = enc.embeddings.detach().clone().requires_grad_(True)

        def f(e):
            enc.embeddings.data = e.detach()
            del enc.embeddings
            enc.embeddings = e
            try:
                return poskit.attention(q.detach(), k.detach(), v.detach(), enc, backend="reference")
            finally:
                del enc.embeddings
                enc.embeddings = torch.nn.Parameter(e0.detach())

        assert torch.autograd.gradcheck(f, (e0,))
