"""The blocked path's two ways of hiding keys (attention/blocked.py `_hide`): the additive 0/-inf block used for
finite logits equals masked_fill_, and a NaN at a hidden key still stays hidden (the masked_fill_ fallback)."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.attention.blocked import _hide, blocked_attention


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), rows=st.integers(1, 9), keys=st.integers(1, 9),
       per_batch=st.booleans(), seed=st.integers(0, 2**16))
def test_additive_hiding_equals_masked_fill(B, H, rows, keys, per_batch, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, H, rows, keys, generator=g) * 10
    vis = torch.rand(B if per_batch else 1, 1, rows, keys, generator=g) > 0.4
    fast, slow = logits.clone(), logits.clone()
    _hide(fast, vis, finite=True)
    _hide(slow, vis, finite=False)
    assert torch.equal(fast, slow)
    assert torch.equal(slow, torch.where(vis, logits, float("-inf")))  # and both are the written-out rule


def test_nan_in_a_hidden_key_stays_hidden():
    """A NaN key that a causal query cannot see must not reach that query's output (as in the reference)."""
    T, E = 70, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, E, generator=g) for _ in range(3))
    k[:, :, T - 1] = float("nan")
    pos = torch.arange(T)[None]
    out = blocked_attention(q, k, v, scale=E ** -0.5, q_positions=pos, k_positions=pos, causal=True)
    assert torch.isfinite(out[:, :, : T - 1]).all()
    assert torch.isnan(out[:, :, T - 1]).all()
    clean = blocked_attention(q[:, :, : T - 1], k[:, :, : T - 1], v[:, :, : T - 1], scale=E ** -0.5,
                              q_positions=pos[:, : T - 1], k_positions=pos[:, : T - 1], causal=True)
    torch.testing.assert_close(out[:, :, : T - 1], clean)
