"""Shared pieces of the checks against peer libraries (tests/test_peers_*.py, extra `poskit[peers]`).

Every comparison runs in float64. Peers that build their frequencies (or magnitudes) in float32 whatever the
input dtype get two checks instead of one looser one: their float32 numbers against poskit's float64 ones at
float32 rounding (FLOAT32_RTOL), then the logits at float64 with the frequencies copied across like parameters.
"""
import torch

import poskit

# a few float32 ulps: a float32 pow/exp/division chain rounds each step to 2^-24 relative
FLOAT32_RTOL = 4 * 2.0**-24
FLOAT64_ATOL = 1e-12


def rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def causal_visible(tq: int, tk: int) -> torch.Tensor:
    """(tq, tk) bool: the queries are the last tq of the tk positions and see keys at or before their own."""
    return torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)


def poskit_logits(q, k, enc, **kw) -> torch.Tensor:
    """poskit's causal logits (default scale 1/sqrt(head_dim)), queries at the last Tq of Tk positions."""
    tq, tk = q.shape[-2], k.shape[-2]
    return poskit.attention_scores(q, k, enc, q_positions=torch.arange(tk - tq, tk), k_positions=torch.arange(tk), **kw)


def assert_visible_close(ours: torch.Tensor, theirs: torch.Tensor, atol: float = FLOAT64_ATOL, rtol: float = 0.0):
    """Equal on every causally visible (query, key) pair; what the two sides put on masked pairs differs (-inf,
    -finfo.max, or unmasked values) and never reaches the softmax."""
    vis = causal_visible(ours.shape[-2], ours.shape[-1]).expand_as(ours)
    torch.testing.assert_close(ours[vis], theirs.to(ours.dtype)[vis], atol=atol, rtol=rtol)


def last_query_output(q, k, v, enc) -> torch.Tensor:
    """poskit's attention output for the query at the last position only: every key is visible to it, so the
    result does not depend on how causality is spelled (the keyword is changing to SDPA's is_causal)."""
    tk = k.shape[-2]
    return poskit.attention(q[:, :, -1:], k, v, enc, q_positions=torch.tensor([tk - 1]), k_positions=torch.arange(tk))
