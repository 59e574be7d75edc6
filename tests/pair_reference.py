"""The slow obvious attention for the references of tests/test_{xpos,t5_bias,fire,kerple,dynamic_bias}.py: a
Python loop over every (batch, head, query, key), a logit per pair from a function written from the paper's
formula, then the masked softmax and the sum over values. float64; autograd flows through it, so it also
gives reference gradients for q, k, v and the encoding's parameters."""
import math

import torch

import poskit


def loop_logits(pair_logit, q, k, qp, kp, *, causal, key_mask=None):
    """(B, H, Tq, Tk) logits, -inf where masked. pair_logit(h, q_t, k_s, t, s) -> a 0-d tensor: the logit of
    query vector q_t at position t against key vector k_s at position s in head h, scale included.
    qp, kp: Python lists of positions (one list per batch row, or one list for all); k has H_kv heads, kv head
    h // (H / H_kv) serving query head h; key_mask: (B, Tk) bool, True = a real key."""
    B, H, Tq, _ = q.shape
    Tk, group = k.shape[2], H // k.shape[1]
    rows = []
    for b in range(B):
        qpos = qp[b] if isinstance(qp[0], list) else qp
        kpos = kp[b] if isinstance(kp[0], list) else kp
        for h in range(H):
            for t in range(Tq):
                for s in range(Tk):
                    masked = (causal and kpos[s] > qpos[t]) or (key_mask is not None and not key_mask[b, s])
                    if masked:
                        rows.append(torch.tensor(-math.inf, dtype=torch.float64))
                    else:
                        rows.append(pair_logit(h, q[b, h, t], k[b, h // group, s], qpos[t], kpos[s]))
    return torch.stack(rows).reshape(B, H, Tq, Tk)


def loop_attention(pair_logit, q, k, v, qp, kp, *, causal, key_mask=None):
    """softmax over each query's visible keys of loop_logits, times v; a query that sees no key outputs 0."""
    logits = loop_logits(pair_logit, q, k, qp, kp, causal=causal, key_mask=key_mask)
    seen = torch.isfinite(logits).any(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(~seen, 0.0), -1) * seen
    return weights @ v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)


def poskit_both_paths(q, k, v, enc, qp, kp, *, causal, key_mask=None):
    """poskit.attention on the reference backend and on the default path (auto), same arguments."""
    kw = dict(is_causal=causal, enable_gqa=True, q_positions=torch.tensor(qp), k_positions=torch.tensor(kp),
              attn_mask=None if key_mask is None else key_mask[:, None, None, :])
    return (poskit.attention(q, k, v, enc, backend="reference", **kw), poskit.attention(q, k, v, enc, **kw))


def assert_matches_reference(pair_logit, enc, q, k, v, qp, kp, *, causal, key_mask=None, params=(), atol=1e-12,
                             seed=0):
    """Both poskit paths equal the loop reference in float64, and so do the gradients of a random projection
    of the output with respect to q, k, v and `params` (the encoding's tensors the pair logit reads).
    Returns the largest absolute difference of the outputs seen."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    want = loop_attention(pair_logit, q, k, v, qp, kp, causal=causal, key_mask=key_mask)
    inputs = [q, k, v, *params]
    w = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed))
    want_grads = torch.autograd.grad(want, inputs, w, allow_unused=True)
    worst = 0.0
    for got in poskit_both_paths(q, k, v, enc, qp, kp, causal=causal, key_mask=key_mask):
        torch.testing.assert_close(got, want, atol=atol, rtol=0)
        worst = max(worst, (got - want).abs().max().item())
        got_grads = torch.autograd.grad(got, inputs, w, allow_unused=True)
        for n, (g, r) in enumerate(zip(got_grads, want_grads)):
            g = torch.zeros_like(inputs[n]) if g is None else g
            r = torch.zeros_like(inputs[n]) if r is None else r
            torch.testing.assert_close(g, r, atol=100 * atol, rtol=0, msg=lambda m: f"gradient of input {n}: {m}")
    return worst
