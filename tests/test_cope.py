"""CoPE against a straightforward re-implementation of the paper's Appendix B listing."""
import math

import pytest
import torch

import poskit
from conftest import build
from grad_helpers import assert_same_gradients, call_with_params


class ListingCoPE(torch.nn.Module):
    """Appendix B, Listing 1, lines 1-20 (per head, batch x seq_len x head_dim)."""

    def __init__(self, npos_max, head_dim, pos_emb):
        super().__init__()
        self.npos_max = npos_max
        self.pos_emb = pos_emb.reshape(1, head_dim, npos_max)

    def forward(self, query, attn_logits):
        gates = torch.sigmoid(attn_logits)
        pos = gates.flip(-1).cumsum(dim=-1).flip(-1)
        pos = pos.clamp(max=self.npos_max - 1)
        pos_ceil = pos.ceil().long()
        pos_floor = pos.floor().long()
        logits_int = torch.matmul(query, self.pos_emb)
        logits_ceil = logits_int.gather(-1, pos_ceil)
        logits_floor = logits_int.gather(-1, pos_floor)
        w = pos - pos_floor
        return logits_ceil * w + logits_floor * (1 - w)


def listing_self_attn(query, key, val, mask, cope):
    """Listing lines 28-36, returning the logits too."""
    attn_logits = torch.bmm(query, key.transpose(-1, -2))
    attn_logits = attn_logits / math.sqrt(query.shape[-1])
    attn_logits += mask.log()
    attn_logits += cope(query, attn_logits)
    attn = torch.softmax(attn_logits, dim=-1)
    return torch.bmm(attn, val), attn_logits


@pytest.mark.parametrize("p_max", [3, 6, 20])
def test_cope_equals_listing(p_max):
    B, H, T, D = 2, 3, 9, 8
    enc = build("cope", head_dim=D, num_heads=H, p_max=p_max, init_std=1.0)
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    cope = ListingCoPE(p_max, D, enc.pos_emb.detach())
    mask = torch.ones(T, T, dtype=torch.float64).tril().expand(B * H, T, T)
    want_out, want_logits = listing_self_attn(q.reshape(B * H, T, D), k.reshape(B * H, T, D), v.reshape(B * H, T, D), mask, cope)
    got_logits = poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True)
    assert torch.allclose(got_logits.reshape(B * H, T, T), want_logits, atol=1e-12)
    got_out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    assert torch.allclose(got_out.reshape(B * H, T, D), want_out, atol=1e-12)


def test_cope_gqa_and_decode_rows_equal_listing():
    B, H, Hkv, T, D = 1, 4, 2, 7, 4
    enc = build("cope", head_dim=D, num_heads=H, p_max=5, init_std=1.0)
    q = torch.randn(B, H, T, D, dtype=torch.float64)
    k = torch.randn(B, Hkv, T, D, dtype=torch.float64)
    v = torch.randn(B, Hkv, T, D, dtype=torch.float64)
    full = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    cope = ListingCoPE(5, D, enc.pos_emb.detach())
    mask = torch.ones(T, T, dtype=torch.float64).tril().expand(B * H, T, T)
    want, _ = listing_self_attn(q.reshape(-1, T, D), kr.reshape(-1, T, D), vr.reshape(-1, T, D), mask, cope)
    assert torch.allclose(full.reshape(-1, T, D), want, atol=1e-12)
    # decoding query t against keys 0..t reproduces row t: gates are recomputed per query
    for t in (0, 3, 6):
        row = poskit.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc, q_positions=torch.tensor([t]),
                               k_positions=torch.arange(t + 1), is_causal=True, enable_gqa=True)
        assert torch.allclose(row[:, :, 0], full[:, :, t], atol=1e-12)


def test_cope_value_gates_and_separate_gate_keys():
    B, H, T, D = 1, 2, 6, 4
    q, k, v, gk = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(4))
    values = build("cope", head_dim=D, num_heads=H, gates="values", init_std=1.0)
    separate = build("cope", head_dim=D, num_heads=H, gates="separate", init_std=1.0)
    separate.load_state_dict(values.state_dict())
    a = poskit.attention_scores(q, k, values, v=v, is_causal=True, enable_gqa=True)
    b = poskit.attention_scores(q, k, separate, gate_keys=v, is_causal=True, enable_gqa=True)
    assert torch.allclose(a, b)
    # manual: gates from q . v, logits from q . k
    logits = q @ k.transpose(-1, -2) / 2
    vis = torch.ones(T, T, dtype=torch.bool).tril()
    gates = torch.sigmoid(q @ v.transpose(-1, -2) / 2) * vis
    p = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=values.p_max - 1)
    z = q @ values.pos_emb.detach()
    w = p - p.floor()
    bias = z.gather(-1, p.ceil().long()) * w + z.gather(-1, p.floor().long()) * (1 - w)
    assert torch.allclose(a, (logits + bias).masked_fill(~vis, float("-inf")), atol=1e-12)
    with pytest.raises(ValueError, match="gate_keys"):
        poskit.attention_scores(q, k, separate, is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="gates='values' needs v"):
        poskit.attention_scores(q, k, values, v=torch.randn(B, H, T, 3, dtype=torch.float64), is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("learned", [False, True])
def test_cope_alibi_eq10(learned):
    B, H, T, D = 1, 4, 6, 4
    enc = build("cope-alibi", head_dim=D, num_heads=H, learned_slopes=learned, p_max=4)
    if learned:
        assert torch.equal(enc.slopes.detach(), torch.zeros(H, dtype=torch.float64))
        with torch.no_grad():
            enc.slopes.copy_(torch.tensor([0.5, -0.25, 1.0, 2.0]))
    q, k = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(2))
    got = poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True)
    vis = torch.ones(T, T, dtype=torch.bool).tril()
    logits = q @ k.transpose(-1, -2) / 2
    p = (torch.sigmoid(logits) * vis).flip(-1).cumsum(-1).flip(-1).clamp(max=3)
    slopes = enc.slopes.detach() if learned else torch.tensor([2 ** (-8 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
    want = (logits - slopes[:, None, None] * p).masked_fill(~vis, float("-inf"))
    assert torch.allclose(got, want, atol=1e-12)


def test_cope_gradcheck():
    enc = build("cope", head_dim=4, num_heads=2, p_max=3, init_std=1.0)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True), (q, k, v))
    e = enc.pos_emb.detach().clone().requires_grad_(True)
    attend = lambda: poskit.attention(q.detach(), k.detach(), v.detach(), enc, backend="reference", is_causal=True, enable_gqa=True)
    assert torch.autograd.gradcheck(lambda e: call_with_params(enc, {"pos_emb": e}, attend), (e,))


def test_cope_alibi_learned_slopes_gradcheck():
    enc = build("cope-alibi", head_dim=4, num_heads=3, p_max=4, learned_slopes=True)
    q, k, v = (torch.randn(1, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor([0.5, -0.3, 1.2], dtype=torch.float64, requires_grad=True)
    attend = lambda: poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    assert torch.autograd.gradcheck(lambda m: call_with_params(enc, {"slopes": m}, attend), (slopes,))


@pytest.mark.parametrize("gqa", [False, True])
def test_cope_gradients_equal_listing_gradients(gqa):
    """Gradients for q, k, v and pos_emb through poskit equal those through the Appendix B listing."""
    B, H, T, D, p_max = 1, 2, 7, 4, 4
    Hkv = 1 if gqa else H
    enc = build("cope", head_dim=D, num_heads=H, p_max=p_max, init_std=1.0)
    mask = torch.ones(T, T, dtype=torch.float64).tril().expand(B * H, T, T)

    def listing(q, k, v, e):
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        out, _ = listing_self_attn(q.reshape(B * H, T, D), k.reshape(B * H, T, D), v.reshape(B * H, T, D), mask,
                                   ListingCoPE(p_max, D, e))
        return out.reshape(B, H, T, D)

    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    assert_same_gradients(
        lambda q, k, v, e: call_with_params(enc, {"pos_emb": e}, lambda: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)),
        listing,
        [q.double(), k.double(), v.double(), enc.pos_emb.detach()],
    )


def test_cope_alibi_learned_slope_gradients_equal_reference_gradients():
    B, H, T, D, p_max = 1, 3, 6, 4, 4
    enc = build("cope-alibi", head_dim=D, num_heads=H, p_max=p_max, learned_slopes=True)
    vis = torch.ones(T, T, dtype=torch.bool).tril()

    def reference(q, k, v, m):  # eq. 10 with the slope penalising contextual distance: logit - m_h p_ts
        logits = q @ k.transpose(-1, -2) / math.sqrt(D)
        p = (torch.sigmoid(logits) * vis).flip(-1).cumsum(-1).flip(-1).clamp(max=p_max - 1)
        return torch.softmax((logits - m[:, None, None] * p).masked_fill(~vis, float("-inf")), -1) @ v

    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    assert_same_gradients(
        lambda q, k, v, m: call_with_params(enc, {"slopes": m}, lambda: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)),
        reference,
        [q.double(), k.double(), v.double(), torch.tensor([0.5, -0.3, 1.2], dtype=torch.float64)],
    )


FLIP_FLOP_SLOPES = [  # CoPE paper §5.1, the three fixed slope sets of the 4-head Flip-Flop models
    [1, 1 / 2, 1 / 2**2, 1 / 2**3],
    [1 / 2**2, 1 / 2**3, 1 / 2**4, 1 / 2**5],
    [1 / 2**4, 1 / 2**5, 1 / 2**6, 1 / 2**7],
]


@pytest.mark.parametrize("slopes", FLIP_FLOP_SLOPES)
def test_cope_alibi_fixed_slopes_option(slopes):
    B, H, T, D = 1, 4, 6, 4
    enc = build("cope-alibi", head_dim=D, num_heads=H, p_max=4, slopes=slopes)
    assert not any(p.requires_grad for p in enc.parameters())  # fixed: nothing to train
    q, k = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(2))
    got = poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True)
    vis = torch.ones(T, T, dtype=torch.bool).tril()
    logits = q @ k.transpose(-1, -2) / 2
    p = (torch.sigmoid(logits) * vis).flip(-1).cumsum(-1).flip(-1).clamp(max=3)
    m = torch.tensor(slopes, dtype=torch.float64)
    assert torch.allclose(got, (logits - m[:, None, None] * p).masked_fill(~vis, float("-inf")), atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(slopes=[1.0, 0.5]), r"slopes must be a sequence of num_heads=4 finite numbers"),
        (dict(slopes=[1.0, 0.5, 0.25, float("nan")]), r"slopes must be a sequence of num_heads=4"),
        (dict(slopes="1248"), r"slopes must be a sequence of num_heads=4"),
        (dict(slopes=0.5), r"slopes must be a sequence of num_heads=4"),
        (dict(slopes=[1.0] * 4, learned_slopes=True), r"slopes \(fixed\) and learned_slopes=True exclude each other"),
    ],
)
def test_cope_alibi_bad_slopes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding("cope-alibi", head_dim=4, num_heads=4, **kwargs)


def test_cope_bad_options():
    with pytest.raises(ValueError, match="gates must be one of"):
        poskit.build_encoding("cope", head_dim=8, num_heads=2, gates="queries")
    with pytest.raises(ValueError, match="p_max must be an int >= 1"):
        poskit.build_encoding("cope", head_dim=8, num_heads=2, p_max=0)


def test_cope_rejects_unordered_keys():
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64) for _ in range(3))
    with pytest.raises(ValueError, match="k_positions must be non-decreasing"):
        poskit.attention(q, k, v, build("cope", head_dim=4, num_heads=2), k_positions=torch.tensor([0, 2, 1]), is_causal=False, enable_gqa=True)
