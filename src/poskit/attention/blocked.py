"""Exact attention in query blocks with a hand-written backward, for q/k wider than v.

CPU SDPA runs its flash kernel only when q, k and v share a head dim. PoPE's Cartesian q/k are 2d wide
while v is d wide, so SDPA either pads v to 2d (and spends a third of its FLOPs on zeros) or falls back
to the math path (full T x T logits). This path reaches PoPE's FLOP floor instead: per block of queries
it multiplies against only the keys the block can see (causal block skipping), keeps the logits of one
block at a time (memory O(block * Tk) per head, never O(T^2 * head_dim)), saves the row log-sum-exp and
recomputes the probabilities in the backward, like FlashAttention but with batched GEMMs.
"""
from __future__ import annotations

import torch

DEFAULT_BLOCK = 64  # measured on a 2-core CPU: larger blocks hit slower GEMM shapes (benchmarks/attention.py)


def _block_plan(q_positions, k_positions, causal: bool, Tq: int, Tk: int, block: int):
    """Per query block: (start, end, key_end) with key_end the number of keys the block can see.

    Keys past key_end are skipped wholesale; this needs shared (1, T) positions with ascending keys,
    otherwise every block scans all keys (still exact: masking is element-wise).
    """
    plan = []
    sorted_keys = k_positions.shape[0] == 1 and (Tk < 2 or bool((k_positions[0, 1:] >= k_positions[0, :-1]).all()))
    for i in range(0, Tq, block):
        j = min(i + block, Tq)
        key_end = Tk
        if causal and sorted_keys:
            latest = q_positions[:, i:j].max()
            key_end = int(torch.searchsorted(k_positions[0], latest, right=True))
        plan.append((i, j, key_end))
    return plan


def _block_visible(q_positions, k_positions, key_padding_mask, causal, i, j, key_end):
    """(1|B, 1, j - i, key_end) bool, or None when every pair in the block is visible."""
    vis = None
    if causal:
        qp, kp = q_positions[:, i:j], k_positions[:, :key_end]
        vis = kp[:, None, None, :] <= qp[:, None, :, None]
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :key_end]
        vis = pad if vis is None else vis & pad
    if vis is not None and bool(vis.all()):
        return None
    return vis


class BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, q_positions, k_positions, causal, key_padding_mask, block, bias_fn):
        # q: (B, H, Tq, E); k: (B, H, Tk, E) (kv heads already repeated); v: (B, H, Tk, Dv)
        B, H, Tq, _ = q.shape
        plan = _block_plan(q_positions, k_positions, causal, Tq, k.shape[2], block)
        # softmax statistics in fp32 whatever the input dtype (bf16 logits lose the row max otherwise)
        out = q.new_zeros(B, H, Tq, v.shape[-1])
        stat = torch.promote_types(q.dtype, torch.float32)
        lse = q.new_zeros(B, H, Tq, dtype=stat)
        for i, j, ke in plan:
            if ke == 0:
                continue  # no key visible to any query of the block: output 0
            s = torch.matmul(q[:, :, i:j], k[:, :, :ke].transpose(-1, -2)).to(lse.dtype).mul_(scale)
            if bias_fn is not None:
                s.add_(bias_fn(i, j, ke))
            vis = _block_visible(q_positions, k_positions, key_padding_mask, causal, i, j, ke)
            if vis is not None:
                s.masked_fill_(~vis, float("-inf"))
            row_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            row_lse = row_lse.masked_fill(torch.isinf(row_lse), 0.0)  # rows with no visible key: p = 0
            p = s.sub_(row_lse).exp_()
            out[:, :, i:j] = torch.matmul(p.to(v.dtype), v[:, :, :ke])
            lse[:, :, i:j] = row_lse[..., 0]
        ctx.save_for_backward(q, k, v, out, lse, q_positions, k_positions,
                              key_padding_mask if key_padding_mask is not None else torch.empty(0))
        ctx.scale, ctx.causal, ctx.plan, ctx.has_pad = scale, causal, plan, key_padding_mask is not None
        ctx.bias_fn = bias_fn
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, q_positions, k_positions, pad = ctx.saved_tensors
        pad = pad if ctx.has_pad else None
        scale = ctx.scale
        grad_out = grad_out.contiguous()
        acc = lse.dtype  # fp32 for half-precision inputs (float64 stays float64): gradients accumulate there
        dq, dk, dv = (torch.zeros(t.shape, dtype=acc) for t in (q, k, v))
        row_dot = (grad_out.to(acc) * out.to(acc)).sum(-1, keepdim=True)  # D_i = rowsum(dO * O)
        for i, j, ke in ctx.plan:
            if ke == 0:
                continue
            s = torch.matmul(q[:, :, i:j], k[:, :, :ke].transpose(-1, -2)).to(lse.dtype).mul_(scale)
            if ctx.bias_fn is not None:
                s.add_(ctx.bias_fn(i, j, ke))
            vis = _block_visible(q_positions, k_positions, pad, ctx.causal, i, j, ke)
            if vis is not None:
                s.masked_fill_(~vis, float("-inf"))
            p = s.sub_(lse[:, :, i:j, None]).exp_()
            do = grad_out[:, :, i:j]
            dv[:, :, :ke] += torch.matmul(p.to(v.dtype).transpose(-1, -2), do).to(acc)
            dp = torch.matmul(do, v[:, :, :ke].transpose(-1, -2)).to(acc)
            ds = p.mul_(dp.sub_(row_dot[:, :, i:j])).mul_(scale).to(q.dtype)  # dS = P * (dP - D) * scale
            dq[:, :, i:j] = torch.matmul(ds, k[:, :, :ke]).to(acc)
            dk[:, :, :ke] += torch.matmul(ds.transpose(-1, -2), q[:, :, i:j]).to(acc)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def blocked_attention(q, k, v, *, scale, q_positions, k_positions, causal, key_padding_mask=None, block=DEFAULT_BLOCK,
                      bias_fn=None):
    """softmax(scale q k^T + bias, masked by position) @ v for q/k of any width E and v of width Dv.

    bias_fn(i, j, key_end) -> a constant (no gradient) bias block broadcastable to (B, H, j - i, key_end),
    generated on the fly so that no T x T bias is ever stored (ALiBi).
    """
    return BlockedAttention.apply(q, k, v, scale, q_positions, k_positions, causal, key_padding_mask, block, bias_fn)
