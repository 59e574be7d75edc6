"""xPos, T5's bias and the dynamic position bias against the peers that have them (extra `poskit[peers]`), float64:
rotary-embedding-torch 0.9.1's xPos, Hugging Face transformers' T5Attention, x-transformers 2.31.10's
DynamicPositionBias (float32: the peer makes its distances float32) and its T5 buckets. Each test skips without its peer.

Matched: xPos's zeta_i = (2i/d + 0.4) / 1.4 and the scales zeta^(+-n / 512) on interleaved pairs; the peer measures
positions from the middle of the sequence (len // 2), poskit from the middle of the query positions, which changes
no logit of a full forward. Differences, asserted below:
- rotary-embedding-torch builds its frequencies and zeta in float32: equal to poskit's at float32 rounding; the
  logits are compared in float64 with poskit's values copied into the peer.
- its `rotate_queries_with_cached_keys` (queries at the last of a longer sequence) measures the queries from
  q_len // 2 and the keys from k_len // 2: pair i of every logit carries an extra zeta_i^((k_len // 2 - q_len // 2)
  / B), so its decode rows differ from its own full forward; poskit's rows equal the full forward.
- T5 does not scale q . k (scale 1.0 here) and computes its buckets with a float32 log; the buckets agree.
"""
import math

import pytest
import torch

import poskit
from extras import need
from peer_checks import FLOAT32_RTOL, assert_visible_close, poskit_logits, rand

D, H, T = 16, 2, 24


# -- xPos: rotary-embedding-torch -----------------------------------------------------------------------------
def xpos_pair(scale_base=512):
    ret = need("rotary_embedding_torch", "peers", "rotary-embedding-torch")
    enc = poskit.build_encoding("xpos", head_dim=D, num_heads=H, scale_base=float(scale_base)).double()
    peer = ret.RotaryEmbedding(D, use_xpos=True, xpos_scale_base=scale_base, cache_if_possible=False)
    return enc, peer


def test_xpos_frequencies_and_zeta_match_at_float32_rounding():
    from poskit.encodings.xpos import xpos_zeta

    enc, peer = xpos_pair()
    assert peer.scale.dtype == peer.freqs.dtype == torch.float32
    torch.testing.assert_close(peer.freqs.detach().double(), enc.inv_freq, rtol=FLOAT32_RTOL, atol=0)
    torch.testing.assert_close(peer.scale.double(), xpos_zeta(D, 0.4), rtol=FLOAT32_RTOL, atol=0)
    torch.testing.assert_close(peer.scale.double().log(), enc.log_zeta, rtol=0, atol=1e-7)


def float64_peer(enc, peer):
    from poskit.encodings.xpos import xpos_zeta

    peer = peer.double()
    with torch.no_grad():
        peer.freqs.copy_(enc.inv_freq)
        peer.scale.copy_(xpos_zeta(D, enc.gamma))
    return peer


@pytest.mark.parametrize("scale_base", [512, 8])
def test_xpos_logits_match_in_float64(scale_base):
    enc, peer = xpos_pair(scale_base)
    peer = float64_peer(enc, peer)
    q, k = rand(2, H, T, D, seed=0), rand(2, H, T, D, seed=1)
    rq, rk = peer.rotate_queries_and_keys(q, k)
    theirs = (rq @ rk.transpose(-1, -2)) * D**-0.5
    ours = poskit_logits(q, k, enc)
    assert_visible_close(ours, theirs)


def shifted_xpos_logits(q, k, enc, shift):
    """Sun et al.'s logits for queries at the last q_len of k_len positions, with every pair's decay exponent
    (t - s) / B moved by `shift` / B (shift 0: the formula itself). Loops over pairs, float64."""
    from poskit.encodings.xpos import xpos_zeta

    tq, tk = q.shape[-2], k.shape[-2]
    zeta = xpos_zeta(D, enc.gamma)
    out = torch.zeros(*q.shape[:2], tq, tk, dtype=torch.float64)
    for a in range(tq):
        t = tk - tq + a
        for s in range(tk):
            for i in range(D // 2):
                phi = (s - t) * enc.inv_freq[i]
                q0, q1, k0, k1 = q[..., a, 2 * i], q[..., a, 2 * i + 1], k[..., s, 2 * i], k[..., s, 2 * i + 1]
                rot = (q0 * k0 + q1 * k1) * torch.cos(phi) + (q1 * k0 - q0 * k1) * torch.sin(phi)
                out[..., a, s] += zeta[i] ** ((t - s + shift) / enc.scale_base) * rot
    return out * D**-0.5


def test_xpos_peer_decode_offset_measures_queries_and_keys_from_different_centres():
    enc, peer = xpos_pair(scale_base=8)  # a short scale base makes the difference plain
    peer = float64_peer(enc, peer)
    q, k = rand(1, H, 3, D, seed=2), rand(1, H, T, D, seed=3)
    rq, rk = peer.rotate_queries_with_cached_keys(q, k)
    theirs = (rq @ rk.transpose(-1, -2)) * D**-0.5
    ours = poskit_logits(q, k, enc)
    assert_visible_close(ours, shifted_xpos_logits(q, k, enc, 0))  # poskit: the formula
    assert_visible_close(theirs, shifted_xpos_logits(q, k, enc, T // 2 - 3 // 2))  # the peer: shifted decay
    full_q = torch.cat([rand(1, H, T - 3, D, seed=4), q], 2)
    frq, frk = peer.rotate_queries_and_keys(full_q, k)
    full_rows = ((frq @ frk.transpose(-1, -2)) * D**-0.5)[:, :, -3:]
    assert_visible_close(ours, full_rows)  # poskit's decode rows are the peer's own full-forward rows
    assert (theirs - full_rows)[..., :T - 3].abs().max() > 1e-3  # the peer's decode rows are not


# -- T5: Hugging Face transformers ------------------------------------------------------------------------------
def t5_attention(bidirectional, num_buckets=32, max_distance=128):
    t5 = need("transformers.models.t5.modeling_t5", "peers", "transformers")
    from transformers import T5Config

    config = T5Config(d_model=H * D, d_kv=D, num_heads=H, relative_attention_num_buckets=num_buckets,
                      relative_attention_max_distance=max_distance, is_decoder=not bidirectional, dropout_rate=0.0)
    config._attn_implementation = "eager"
    return t5, t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0).double().eval()


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (7, 9), (64, 1000)])
def test_t5_buckets_equal_hugging_faces(bidirectional, num_buckets, max_distance):
    from poskit.encodings.t5 import relative_position_bucket

    t5, _ = t5_attention(bidirectional)
    rel = torch.cat([torch.arange(-5 * max_distance, 5 * max_distance + 1), torch.tensor([-10**9, 10**9])])
    theirs = t5.T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                      max_distance=max_distance)
    ours = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                    max_distance=max_distance)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_and_attention_equal_hugging_faces_t5attention(bidirectional):
    _, peer = t5_attention(bidirectional)
    enc = poskit.build_encoding("t5", head_dim=D, num_heads=H, bidirectional=bidirectional, init_std=1.0).double()
    with torch.no_grad():
        peer.relative_attention_bias.weight.copy_(enc.table)
    tq, tk = 5, 200  # queries at the last 5 of 200 positions: distances past max_distance
    q = rand(1, H, tq, D, seed=5)
    bias = enc.bias(q, torch.arange(tk - tq, tk)[None], torch.arange(tk)[None], 1.0)
    theirs = peer.compute_bias(tq, tk, past_seen_tokens=tk - tq)
    torch.testing.assert_close(bias, theirs, atol=0, rtol=0)

    # the whole layer: T5 scales q . k by 1 (scale=1.0 here); the decoder's causal mask is additive in HF
    hidden = rand(2, 40, H * D, seed=6)
    mask = None if bidirectional else torch.full((40, 40), -math.inf, dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want = peer(hidden, mask=mask)[0]
        heads = lambda x: x.view(2, 40, H, D).transpose(1, 2)
        out = poskit.attention(heads(peer.q(hidden)), heads(peer.k(hidden)), heads(peer.v(hidden)), enc, scale=1.0,
                               is_causal=not bidirectional)
        got = peer.o(out.transpose(1, 2).reshape(2, 40, H * D))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# -- x-transformers: DynamicPositionBias and its T5 buckets -------------------------------------------------------
@pytest.mark.parametrize("log_distance", [False, True])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_dynamic_bias_equals_x_transformers(log_distance, depth):
    # the peer makes its distances float32 whatever its weights (`.float()`): compared in float32, both sides
    # with the same weights
    xt = need("x_transformers.x_transformers", "peers", "x-transformers")
    torch.manual_seed(0)
    peer = xt.DynamicPositionBias(dim=12, heads=H, depth=depth, log_distance=log_distance)
    enc = poskit.build_encoding("dynamic", head_dim=D, num_heads=H, hidden=12, depth=depth, log_distance=log_distance)
    linears = [m for m in peer.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == len(enc.mlp.weights) == depth + 1
    with torch.no_grad():
        for lin, w, b in zip(linears, enc.mlp.weights, enc.mlp.biases):
            w.copy_(lin.weight)
            b.copy_(lin.bias)
    tq, tk = 4, 30  # the peer's queries are the last i of j positions
    theirs = peer(tq, tk)[None]
    ours = enc.bias(rand(1, H, tq, D, seed=7).float(), torch.arange(tk - tq, tk)[None], torch.arange(tk)[None], 1.0)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_t5_buckets_equal_x_transformers(causal):
    xt = need("x_transformers.x_transformers", "peers", "x-transformers")
    from poskit.encodings.t5 import relative_position_bucket

    rel = torch.arange(-700, 701)  # key minus query, as both define it
    theirs = xt.RelativePositionBias._relative_position_bucket(rel, causal=causal, num_buckets=32, max_distance=128)
    ours = relative_position_bucket(rel, bidirectional=not causal, num_buckets=32, max_distance=128)
    assert torch.equal(ours, theirs)
