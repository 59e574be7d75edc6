"""poskit's PoPE against PoPE-pytorch 0.2.1 (extra `poskit[peers]`).

Both follow the paper (000, eq. 2-7): theta_c = base^(-c/d) for c = 0..d-1, magnitudes softplus(q), softplus(k),
logit = scale * sum_c mu_q mu_k cos((s - t) theta_c + delta_hc) with delta clamped to [-2 pi, 0]. PoPE-pytorch
puts delta on the key phase (eq. 7), poskit on the query phase with the opposite sign: the logits are the same.
Differences, each asserted below:
- PoPE-pytorch builds theta in float32 (`arange(dim).float()`): equal to poskit's float64 theta at float32 rounding.
- grouped-query attention: PoPE-pytorch repeats kv heads as `(g h)` (query head i reads kv head i % H_kv);
  poskit, HF's repeat_kv and SDPA's enable_gqa read kv head i // (H / H_kv). A convention, not a formula: the
  paper has no GQA.
"""
import math

import torch
from extras import need

pope_pytorch = need("PoPE_pytorch", "peers", "PoPE-pytorch")

import poskit
from peer_checks import FLOAT32_RTOL, assert_visible_close, last_query_output, poskit_logits, rand

D, H, T = 32, 4, 12  # PoPE-pytorch's public similarity function accepts head_dim in {32, 48, 64, 128, 256}


def pair(seed=0, heads=H):
    """poskit's pope with a random delta (partly outside [-2 pi, 0], so both clamps act) and the peer holding the
    same delta and poskit's float64 theta (the theta formulas are compared separately)."""
    enc = poskit.build_encoding("pope", head_dim=D, num_heads=heads).double()
    with torch.no_grad():
        enc.delta.copy_(rand(heads, D, seed=seed) * 4 - 3)
    peer = pope_pytorch.PoPE(D, heads=heads, inv_freqs=enc.inv_freq.clone()).double()
    with torch.no_grad():
        peer.bias.copy_(enc.delta)
    return enc, peer


def test_theta_is_the_papers_theta_at_float32_rounding():
    enc = poskit.build_encoding("pope", head_dim=D, num_heads=H)
    peer = pope_pytorch.PoPE(D, heads=H)
    assert peer.inv_freqs.dtype == torch.float32  # the peer's own theta is float32 ...
    paper = torch.tensor([10000.0 ** (-c / D) for c in range(D)], dtype=torch.float64)  # eq. 3: theta_c, c = 0..d-1
    torch.testing.assert_close(enc.inv_freq, paper, rtol=1e-15, atol=0)
    torch.testing.assert_close(peer.inv_freqs.double(), paper, rtol=FLOAT32_RTOL, atol=0)  # ... equal at its rounding


def test_logits_match_with_delta_copied_across():
    enc, peer = pair()
    q, k = rand(2, H, T, D, seed=1), rand(2, H, T, D, seed=2)
    theirs = pope_pytorch.compute_attn_similarity(q, k, peer(T)) * D**-0.5  # the peer's similarity is unscaled
    assert_visible_close(poskit_logits(q, k, enc), theirs)


def test_logits_match_the_papers_eq5_written_out():
    # both sides against eq. 5 summed channel by channel, so an agreement cannot hide a shared mistake
    enc, peer = pair(seed=3)
    q, k = rand(1, H, 5, D, seed=4), rand(1, H, 5, D, seed=5)
    theta = [10000.0 ** (-c / D) for c in range(D)]
    delta = enc.delta.detach().clamp(-2 * math.pi, 0).tolist()
    mu_q, mu_k = torch.nn.functional.softplus(q).tolist(), torch.nn.functional.softplus(k).tolist()
    want = torch.zeros(1, H, 5, 5, dtype=torch.float64)
    for h in range(H):
        for t in range(5):
            for s in range(5):
                want[0, h, t, s] = sum(mu_q[0][h][t][c] * mu_k[0][h][s][c] * math.cos((s - t) * theta[c] + delta[h][c])
                                       for c in range(D)) / math.sqrt(D)
    theirs = pope_pytorch.compute_attn_similarity(q, k, peer(5)) * D**-0.5
    torch.testing.assert_close(theirs, want, rtol=0, atol=1e-12)
    assert_visible_close(poskit_logits(q, k, enc), want)


def test_attention_output_matches_at_the_last_query():
    enc, peer = pair(seed=6)
    q, k, v = rand(2, H, T, D, seed=7), rand(2, H, T, D, seed=8), rand(2, H, T, D, seed=9)
    theirs = pope_pytorch.flash_attn_with_pope(q[:, :, -1:], k, v, pos_emb=peer(T), fused=False)
    torch.testing.assert_close(last_query_output(q, k, v, enc), theirs, rtol=0, atol=1e-12)


def test_grouped_query_heads_pair_differently():
    """PoPE-pytorch tiles kv heads (g h): with H_kv = 2 of 4, query head 1 reads kv head 1, poskit's reads kv head 0.
    The peer equals poskit given the kv heads tiled the peer's way, and differs from poskit's own grouping."""
    enc, peer = pair(seed=10)
    q, k = rand(1, H, T, D, seed=11), rand(1, 2, T, D, seed=12)
    theirs = pope_pytorch.compute_attn_similarity(q, k, peer(T)) * D**-0.5
    assert_visible_close(poskit_logits(q, k.repeat(1, 2, 1, 1), enc), theirs)  # kv head i % 2 for query head i
    assert not torch.allclose(poskit_logits(q, k, enc)[:, 1].tril(), theirs[:, 1].tril(), atol=1e-3)
