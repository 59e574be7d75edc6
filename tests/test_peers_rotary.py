"""poskit's RoPE against rotary-embedding-torch 0.9.1 (extra `poskit[peers]`).

Matched: theta_i = base^(-2i/d) (RoFormer eq. 15) on interleaved pairs (x_2i, x_2i+1) (eq. 34, poskit's
layout="interleaved"); interpolate_factor divides the positions (= rope-linear, position interpolation);
theta_rescale_factor raises the base to base * s^(d/(d-2)) (= rope-ntk); decode offsets
(rotate_queries_with_cached_keys puts the queries at the last positions). Differences, asserted below:
- the peer's theta is float32 (`arange(...).float()`): equal to poskit's float64 at float32 rounding; the
  logits are compared in float64 with poskit's theta copied into the peer's `freqs` parameter.
Not compared: xpos (use_xpos) and the 'pixel'/'constant' frequencies, which poskit does not implement.
"""
import pytest
import torch
from extras import need

ret = need("rotary_embedding_torch", "peers", "rotary-embedding-torch")

import poskit  # noqa: E402
from peer_checks import FLOAT32_RTOL, assert_visible_close, poskit_logits, rand  # noqa: E402

D, H, T = 16, 2, 24

CASES = [("rope", {}, {}), ("rope-linear", dict(factor=4.0), dict(interpolate_factor=4.0)),
         ("rope-ntk", dict(factor=4.0), dict(theta_rescale_factor=4.0))]


def pair(name, options, peer_options):
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, **options).double()
    peer = ret.RotaryEmbedding(D, cache_if_possible=False, **peer_options)
    return enc, peer


@pytest.mark.parametrize("name, options, peer_options", CASES)
def test_frequencies_match_at_float32_rounding(name, options, peer_options):
    enc, peer = pair(name, options, peer_options)
    assert peer.freqs.dtype == torch.float32
    factor = peer_options.get("interpolate_factor", 1.0)  # the peer divides the positions instead
    torch.testing.assert_close(peer.freqs.detach().double() / factor, enc.inv_freq, rtol=FLOAT32_RTOL, atol=0)


@pytest.mark.parametrize("name, options, peer_options", CASES)
def test_logits_match_in_float64(name, options, peer_options):
    enc, peer = pair(name, options, peer_options)
    peer = peer.double()
    with torch.no_grad():
        peer.freqs.copy_(enc.inv_freq * peer_options.get("interpolate_factor", 1.0))
    q, k = rand(2, H, T, D, seed=0), rand(2, H, T, D, seed=1)
    rq, rk = peer.rotate_queries_or_keys(q), peer.rotate_queries_or_keys(k)
    assert_visible_close(poskit_logits(q, k, enc), (rq @ rk.transpose(-1, -2)) * D**-0.5)


def test_queries_against_cached_keys_sit_at_the_last_positions():
    enc, peer = pair("rope", {}, {})
    peer = peer.double()
    with torch.no_grad():
        peer.freqs.copy_(enc.inv_freq)
    q, k = rand(1, H, 3, D, seed=2), rand(1, H, T, D, seed=3)
    rq, rk = peer.rotate_queries_with_cached_keys(q, k)
    assert_visible_close(poskit_logits(q, k, enc), (rq @ rk.transpose(-1, -2)) * D**-0.5)


def test_interleaved_pairs_are_roformers_eq34():
    # two pairs at position 1, written out: (x0 cos - x1 sin, x1 cos + x0 sin) at angles theta_0 = 1, theta_1 = 1/100
    peer = ret.RotaryEmbedding(4, cache_if_possible=False).double()  # the peer needs d > 2 (its d / (d - 2))
    row = [0.3, -0.7, 1.1, 0.4]
    x = torch.tensor([[[[0.0] * 4, row]]], dtype=torch.float64)  # positions 0 and 1
    want = []
    for i, angle in enumerate([1.0, 0.01]):
        x0, x1 = row[2 * i], row[2 * i + 1]
        c, s = torch.cos(torch.tensor(angle, dtype=torch.float64)), torch.sin(torch.tensor(angle, dtype=torch.float64))
        want += [x0 * c - x1 * s, x1 * c + x0 * s]
    want = torch.stack(want)
    torch.testing.assert_close(peer.rotate_queries_or_keys(x)[0, 0, 1], want, rtol=0, atol=1e-7)  # float32 theta
    enc = poskit.build_encoding("rope", head_dim=4, num_heads=1).double()
    torch.testing.assert_close(enc.encode_k(x, torch.arange(2)[None])[0, 0, 1], want, rtol=0, atol=1e-15)
