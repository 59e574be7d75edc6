"""poskit against x-transformers 2.31.10 (extra `poskit[peers]`): PoPE (PolarEmbedding), ALiBi, CoPE, RoPE.

The peer's attention core (`Attend`) computes the logits and outputs from the peer's own encodings, with
parameters copied from poskit. Matched: ALiBi's slopes and symmetric -m|t - s| bias; CoPE's gates, suffix-sum
positions clamped to p_max - 1 and interpolated embeddings (both follow the paper's Appendix B listing, which
scales the content logits, and so the gates, by 1/sqrt(d) but not the position term q . e[p]; eq. 3 and 9 are
written unscaled); PoPE's logits; RoPE with interpolation_factor (= rope-linear) and base_rescale_factor
(= rope-ntk). Differences, each asserted below:
- PolarEmbedding casts q and k to float32 before softplus (`apply_polar_pos_emb`): the peer equals poskit
  exactly once poskit is given the same float32-rounded magnitudes (softplus=False on softplus(q.float())).
- Attend's softmax is float32 (`softmax(..., dtype=torch.float32)`); the outputs are compared through its
  custom_attn_fn hook with a float64 softmax.
- the peer builds its frequencies and ALiBi slopes in float32; they equal poskit's at float32 rounding, and
  the logits are compared in float64 with the float64 values copied into the peer's buffers.
"""
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from extras import need

xt = need("x_transformers.x_transformers", "peers", "x-transformers")
from x_transformers.attend import Attend  # noqa: E402

import poskit  # noqa: E402
from peer_checks import FLOAT32_RTOL, assert_visible_close, last_query_output, poskit_logits, rand  # noqa: E402

D, H, T = 16, 4, 10


def qkv(seed, tq=T):
    return rand(2, H, tq, D, seed=seed), rand(2, H, T, D, seed=seed + 1), rand(2, H, T, D, seed=seed + 2)


def attend(q, k, v, **kw):
    """The peer's causal attention (queries aligned to the last positions): (output, pre-softmax logits).
    Attend's own softmax runs in float32 whatever the input; its custom_attn_fn hook gives it a float64 one."""
    core = Attend(causal=True, scale=D**-0.5, cope=kw.pop("cope", None), custom_attn_fn=partial(torch.softmax, dim=-1))
    out, inter = core(q, k, v, **kw)
    return out, inter.pre_softmax_attn


# -- PoPE ----------------------------------------------------------------------------------------------------


def polar_pair(seed):
    enc = poskit.build_encoding("pope", head_dim=D, num_heads=H).double()
    with torch.no_grad():
        enc.delta.copy_(rand(H, D, seed=seed) * 4 - 3)  # partly outside [-2 pi, 0]: both sides clamp
    peer = xt.PolarEmbedding(D, H).double()
    with torch.no_grad():
        peer.inv_freq.copy_(enc.inv_freq)
        peer.learned_bias.copy_(enc.delta[:, None, :])  # (heads, 1, d)
    return enc, peer


def polar_peer(q, k, v, peer):
    freqs, bias = peer(torch.arange(T))
    return attend(xt.apply_polar_pos_emb(q, freqs), xt.apply_polar_pos_emb(k, freqs + bias), v)


def test_polar_frequencies_are_the_papers_at_float32_rounding():
    peer = xt.PolarEmbedding(D, H)
    assert peer.inv_freq.dtype == torch.float32
    paper = torch.tensor([10000.0 ** (-c / D) for c in range(D)], dtype=torch.float64)
    torch.testing.assert_close(peer.inv_freq.double(), paper, rtol=FLOAT32_RTOL, atol=0)


def test_polar_logits_and_outputs_equal_poskit_on_float32_magnitudes():
    enc, peer = polar_pair(seed=0)
    q, k, v = qkv(seed=1)
    out, logits = polar_peer(q, k, v, peer)
    # the peer's magnitudes are softplus in float32; poskit without its own softplus, fed those magnitudes
    flat = poskit.build_encoding("pope", head_dim=D, num_heads=H, softplus=False).double()
    flat.load_state_dict(enc.state_dict())
    mq, mk = F.softplus(q.float()).double(), F.softplus(k.float()).double()
    assert_visible_close(poskit_logits(mq, mk, flat), logits)
    torch.testing.assert_close(last_query_output(mq, mk, v, flat), out[:, :, -1:], rtol=0, atol=1e-12)
    # against poskit's float64 softplus the gap is float32 rounding of the magnitudes, nothing larger
    gap = (poskit_logits(q, k, enc) - logits).nan_to_num(posinf=0, neginf=0).tril().abs().max()
    assert 0 < gap < 1e-5


# -- ALiBi ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6, 8, 12, 16])
def test_alibi_slopes_match_press_et_al_for_any_head_count(heads):
    ours = poskit.build_encoding("alibi", head_dim=D, num_heads=heads).slopes.tolist()
    theirs = xt.AlibiPositionalBias._get_slopes(heads)  # Python floats: the peer's formula before its float32 buffer
    assert ours == pytest.approx(theirs, rel=1e-14, abs=0)  # a few float64 ulps: powers computed in different orders
    if heads & (heads - 1) == 0:  # paper 001: m_h = 2^(-8h/H)
        assert ours == pytest.approx([2.0 ** (-8 * h / heads) for h in range(1, heads + 1)], rel=1e-14, abs=0)  # a few float64 ulps: powers computed in different orders


def test_alibi_logits_and_outputs_match():
    enc = poskit.build_encoding("alibi", head_dim=D, num_heads=H).double()
    peer = xt.AlibiPositionalBias(heads=H).double()
    assert torch.allclose(peer.slopes.flatten(), enc.slopes, rtol=FLOAT32_RTOL, atol=0)  # float32 buffer
    peer.slopes = enc.slopes.view(H, 1, 1).clone()  # the same slopes in float64
    q, k, v = qkv(seed=3)
    out, logits = attend(q, k, v, attn_bias=peer(T, T))
    assert_visible_close(poskit_logits(q, k, enc), logits)
    out1, _ = attend(q[:, :, -1:], k, v, attn_bias=peer(1, T))
    torch.testing.assert_close(last_query_output(q, k, v, enc), out1, rtol=0, atol=1e-12)


# -- CoPE ----------------------------------------------------------------------------------------------------


def cope_pair(p_max):
    enc = poskit.build_encoding("cope", head_dim=D, num_heads=H, p_max=p_max, init_std=0.5).double()
    peer = xt.CoPE(dim=D, heads=H, max_pos=p_max).double()
    with torch.no_grad():
        peer.pos_emb.copy_(enc.pos_emb.T)  # peer: (max_pos, dim); poskit: (head_dim, p_max)
    return enc, peer


@pytest.mark.parametrize("p_max", [3, 16])  # 3: the clamp to p_max - 1 acts; 16 > T: it never does
def test_cope_logits_and_outputs_match(p_max):
    enc, peer = cope_pair(p_max)
    q, k, v = qkv(seed=4)
    q = q * 3  # larger logits spread the gates over (0, 1)
    out, logits = attend(q, k, v, cope=peer)
    assert_visible_close(poskit_logits(q, k, enc), logits)
    out1, _ = attend(q[:, :, -1:], k, v, cope=peer)
    torch.testing.assert_close(last_query_output(q, k, v, enc), out1, rtol=0, atol=1e-12)


def test_cope_gates_use_scaled_logits_as_the_listing_does():
    """Appendix B scales q.k by 1/sqrt(d) before the gates; eq. 3 read literally (sigma(q.k)) counts differently.
    Both libraries follow the listing: poskit's logits differ from the literal eq. 3 ones."""
    enc, peer = cope_pair(16)
    q, k, v = qkv(seed=5)
    ours = poskit_logits(q, k, enc)
    content = (q @ k.transpose(-1, -2)) * D**-0.5
    vis = torch.ones(T, T, dtype=torch.bool).tril()
    literal_gates = torch.sigmoid(q @ k.transpose(-1, -2)) * vis  # eq. 3 without the scale
    p = literal_gates.flip(-1).cumsum(-1).flip(-1).clamp(max=15)
    z = q @ enc.pos_emb.detach()
    lo, hi = p.floor(), p.ceil()
    literal = content + z.gather(-1, hi.long()) * (p - lo) + z.gather(-1, lo.long()) * (1 - (p - lo))
    assert (ours - literal).nan_to_num(posinf=0, neginf=0).abs().max() > 1e-3


# -- RoPE ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, options, peer_options", [
    ("rope", {}, {}),
    ("rope-linear", dict(factor=4.0), dict(interpolation_factor=4.0)),
    ("rope-ntk", dict(factor=4.0), dict(base_rescale_factor=4.0)),
])
def test_rope_logits_match(name, options, peer_options):
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, **options).double()
    peer = xt.RotaryEmbedding(D, **peer_options)
    factor = peer_options.get("interpolation_factor", 1.0)  # the peer divides positions * inv_freq by it
    torch.testing.assert_close(peer.inv_freq.double() / factor, enc.inv_freq, rtol=FLOAT32_RTOL, atol=0)
    peer = peer.double()
    with torch.no_grad():
        peer.inv_freq.copy_(enc.inv_freq * factor)
    q, k, v = qkv(seed=6)
    freqs, scale = peer(torch.arange(T))
    rq, rk = xt.apply_rotary_pos_emb(q, freqs, scale), xt.apply_rotary_pos_emb(k, freqs, scale)
    _, logits = attend(rq, rk, v)
    assert_visible_close(poskit_logits(q, k, enc), logits)
