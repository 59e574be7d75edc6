"""Exact attention in query blocks with a hand-written backward, for q/k wider than v.

CPU SDPA runs its flash kernel only when q, k and v share a head dim. PoPE's Cartesian q/k are 2d wide
while v is d wide, so SDPA either pads v to 2d (and spends a third of its FLOPs on zeros) or falls back
to the math path (full T x T logits). This path reaches PoPE's FLOP floor instead: per block of queries
it multiplies against only the keys the block can see (causal block skipping), keeps the logits of one
block at a time (memory O(block * Tk) per head, never O(T^2 * head_dim)) and recomputes the
probabilities in the backward, like FlashAttention but with batched GEMMs (or keeps them, when small).
"""
from __future__ import annotations

import torch

from ..util.function_call import call
from .blocks import sorted_key_ends
from .grouped import kv_rows, per_head, to_kv_heads
from .inputs import all_finite

DEFAULT_BLOCK = 64  # measured on a 2-core CPU: larger blocks hit slower GEMM shapes (benchmarks/attention.py)

# The forward keeps its softmax probabilities for the backward when they fit in this many bytes (causal
# blocks only hold the visible keys): the backward then skips recomputing q k^T over the 2d-wide PoPE
# features and the softmax, about a quarter of its work (measured: PoPE forward+backward at B=8, H=8,
# T=1024, d=64 went from 1.79x to 1.37x the time of RoPE + SDPA, keeping 134 MB). Above the budget the
# probabilities are recomputed block by block as in FlashAttention and memory stays O(block * Tk).
SAVE_PROBS_BYTES = 256 * 2**20

# Batch rows are processed in chunks whose logits for one query block fit in this many bytes: a block of 64
# queries against 4096 keys over 64 batch x heads is 64 MB, far past the cache, and the softmax and GEMMs then
# run at memory speed (measured at T=4096: PoPE forward+backward 12.4 s unchunked, 8.2 s with 8 MB chunks,
# against 8.6 s for SDPA with v zero-padded to 2d).
CHUNK_BYTES = 8 * 2**20


def _block_plan(q_positions, k_positions, key_padding_mask, causal: bool, Tq: int, Tk: int, block: int):
    """Per query block: (start, end, full_end, key_end).

    Keys [0, key_end) are multiplied; keys past key_end are invisible to the whole block (causal block
    skipping) and keys [0, full_end) are visible to every query of the block, so only columns
    [full_end, key_end) need an element-wise mask. Skipping needs shared (1, T) positions with ascending
    keys; otherwise every block scans and masks all keys (still exact).
    """
    plan = []
    shared = k_positions.shape[0] == 1 and q_positions.shape[0] == 1
    sorted_keys = shared and (Tk < 2 or bool((k_positions[0, 1:] >= k_positions[0, :-1]).all()))
    skip = causal and sorted_keys
    if skip:
        key_ends = sorted_key_ends(q_positions, k_positions, block)[0].tolist()
        full_ends = sorted_key_ends(q_positions, k_positions, block, whole_block=True)[0].tolist()
    for n, i in enumerate(range(0, Tq, block)):
        j = min(i + block, Tq)
        key_end, full_end = Tk, (Tk if not causal else 0)
        if skip:
            key_end, full_end = key_ends[n], full_ends[n]
        if key_padding_mask is not None:
            full_end = 0
        plan.append((i, j, full_end, key_end))
    return plan


def _partial_mask(q_positions, k_positions, key_padding_mask, causal, i, j, lo, hi):
    """(1|B, 1, j - i, hi - lo) bool visibility of keys [lo, hi) for queries [i, j)."""
    vis = None
    if causal:
        vis = k_positions[:, None, None, lo:hi] <= q_positions[:, None, i:j, None]
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, lo:hi]
        vis = pad if vis is None else vis & pad
    return vis


def _hide(s4, vis, finite: bool) -> None:
    """Set the logits s4 (B, H, rows, keys) to -inf where vis (broadcastable bool) is False, in place.

    With finite logits, adding a small 0/-inf block is the same and about 10x faster than masked_fill_ with a
    broadcast mask on CPU (measured 55 us against 565 us for 128 x 64 x 64 logits: the hidden keys of a
    training-size causal block). A NaN or inf logit at a hidden key would leak through the addition, so
    non-finite inputs keep masked_fill_.
    """
    if finite:
        s4.add_(torch.zeros(vis.shape, dtype=s4.dtype, device=s4.device).masked_fill_(~vis, float("-inf")))
    else:
        s4.masked_fill_(~vis, float("-inf"))


def _block_probs(q3, k3, shape, bias, q_positions, k_positions, pad, causal, step, stat, finite=False):
    """Softmax probabilities (B*H, j - i, key_end) of one query block, in `stat` precision.
    q3 (B*H, Tq, E), k3 (B*H_kv, Tk, E) (grouped kv heads: grouped.py). finite: q3, k3 (and the bias) hold no
    NaN or inf (a faster mask, _hide).

    torch.softmax is used rather than exp(s - logsumexp): on CPU, exp of very negative logits produces
    denormals and runs up to 25x slower, while softmax's own vectorised exp does not (measured).
    q3 is already multiplied by the scale.
    """
    B, H = shape
    i, j, full_end, ke = step
    s = per_head(q3[:, i:j], k3[:, :ke].transpose(1, 2), q3.shape[0] // k3.shape[0]).to(stat)
    if bias is not None:  # broadcastable to (B, H, j - i, ke)
        s.view(B, H, j - i, ke).add_(bias)
    if full_end >= ke:
        return torch.softmax(s, dim=-1)
    vis = _partial_mask(q_positions, k_positions, pad, causal, i, j, full_end, ke)
    s4 = s.view(B, H, j - i, ke)
    _hide(s4[..., full_end:], vis, finite)
    p = torch.softmax(s, dim=-1)
    if full_end == 0:
        has_key = vis.any(-1, keepdim=True)
        if not bool(has_key.all()):
            p.view(B, H, j - i, ke).masked_fill_(~has_key, 0.0)  # a query that sees no key: weights 0, not NaN
    return p


def _scaled(x, scale):
    # callers that fold the scale into q already (PoPE's angle tables) pass 1.0: skip a full-size multiply
    return x if scale == 1.0 else x * scale


def _flat(x):
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])


def _batch_chunks(B: int, H: int, block: int, Tk: int, elem: int):
    """(b0, b1) ranges of batch rows whose per-block logits fit in CHUNK_BYTES."""
    rows = max(1, CHUNK_BYTES // max(1, H * block * Tk * elem))
    return [(b0, min(B, b0 + rows)) for b0 in range(0, B, rows)]


class _Rows:
    """The inputs of one chunk of batch rows: flattened (rows * H, T, .) queries, (rows * H_kv, T, .) keys and
    values, and the per-batch extras."""

    def __init__(self, b0, b1, H, q3, k3, v3, q_positions, k_positions, pad):
        self.b0, self.b1 = b0, b1
        self.rows, self.shape = slice(b0 * H, b1 * H), (b1 - b0, H)
        self.groups = q3.shape[0] // k3.shape[0]
        self.kv_rows = kv_rows(self.rows, self.groups)
        self.q3, self.k3, self.v3 = q3[self.rows], k3[self.kv_rows], v3[self.kv_rows]
        self.q_positions, self.k_positions = _batch_rows(q_positions, b0, b1), _batch_rows(k_positions, b0, b1)
        self.pad = None if pad is None else pad[b0:b1]

    def probs(self, bias, causal, step, stat, finite=False):
        bias = None if bias is None else _batch_rows(bias, self.b0, self.b1)
        return _block_probs(self.q3, self.k3, self.shape, bias, self.q_positions, self.k_positions,
                            self.pad, causal, step, stat, finite)


def _batch_rows(x, b0, b1):
    # positions (1|B, T) and bias blocks (1|B, H, ., .): a leading 1 is shared by every batch row
    return x if x.shape[0] == 1 else x[b0:b1]


class BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, q_positions, k_positions, causal, key_padding_mask, block, bias_fn):
        # q: (B, H, Tq, E); k: (B, H_kv, Tk, E); v: (B, H_kv, Tk, Dv) (query head h reads kv head h // (H / H_kv))
        B, H, Tq, _ = q.shape
        plan = _block_plan(q_positions, k_positions, key_padding_mask, causal, Tq, k.shape[2], block)
        stat = torch.promote_types(q.dtype, torch.float32)  # softmax in fp32 for half inputs, float64 kept
        elem = torch.empty(0, dtype=stat).element_size()
        chunks = _batch_chunks(B, H, block, k.shape[2], elem)
        q3, k3, v3 = _flat(_scaled(q, scale)), _flat(k), _flat(v)  # the scale is folded into q once
        out = q.new_empty(B, H, Tq, v.shape[-1])
        out3 = out.view(B * H, Tq, -1)
        prob_bytes = B * H * sum((j - i) * ke for i, j, _, ke in plan) * elem
        keep = any(ctx.needs_input_grad[:3]) and prob_bytes <= SAVE_PROBS_BYTES
        ctx.probs = {} if keep else None
        parts = [_Rows(b0, b1, H, q3, k3, v3, q_positions, k_positions, key_padding_mask) for b0, b1 in chunks]
        # the fast mask needs finite logits: finite inputs (a generated bias, ALiBi's, is finite) in a dtype whose
        # q . k cannot overflow at realistic magnitudes (float16's 65504 can)
        finite = ((causal or key_padding_mask is not None) and q.dtype != torch.float16 and all_finite(q3, k3))
        for n, step in enumerate(plan):
            i, j, _, ke = step
            if ke == 0:
                out3[:, i:j] = 0  # no key visible to any query of the block
                continue
            bias = None if bias_fn is None else bias_fn(i, j, ke)  # generated once per block, shared by chunks
            for part in parts:
                p = part.probs(bias, causal, step, stat, finite)
                # (bmm out= into a strided view is 30x slower than this copy)
                out3[part.rows, i:j] = per_head(p.to(v.dtype), part.v3[:, :ke], part.groups)
                if keep:
                    ctx.probs[part.b0, n] = p
        pad = key_padding_mask if key_padding_mask is not None else torch.empty(0)
        ctx.save_for_backward(q, k, v, out, q_positions, k_positions, pad)
        ctx.scale, ctx.causal, ctx.plan, ctx.has_pad, ctx.bias_fn = scale, causal, plan, key_padding_mask is not None, bias_fn
        ctx.chunks, ctx.finite = chunks, finite
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, q_positions, k_positions, pad = ctx.saved_tensors
        pad = pad if ctx.has_pad else None
        B, H = q.shape[:2]
        acc = torch.promote_types(q.dtype, torch.float32)  # gradients accumulate in fp32 for half inputs
        q3, k3, v3 = _flat(_scaled(q, ctx.scale)), _flat(k), _flat(v)
        do3 = _flat(grad_out.contiguous())
        dq3 = torch.zeros(q3.shape, dtype=acc, device=q.device)
        dk3 = torch.zeros(k3.shape, dtype=acc, device=q.device)
        dv3 = torch.zeros(v3.shape, dtype=acc, device=q.device)
        row_dot = (do3.to(acc) * _flat(out).to(acc)).sum(-1, keepdim=True)  # D_i = rowsum(dO * O)
        parts = [_Rows(b0, b1, H, q3, k3, v3, q_positions, k_positions, pad) for b0, b1 in ctx.chunks]
        for n, step in enumerate(ctx.plan):
            i, j, _, ke = step
            if ke == 0:
                continue
            bias = None if ctx.bias_fn is None or ctx.probs is not None else ctx.bias_fn(i, j, ke)
            for part in parts:
                r, kv, g = part.rows, part.kv_rows, part.groups
                if ctx.probs is not None:  # kept by the forward; read-only (a second backward may need them)
                    p = ctx.probs[part.b0, n]
                else:  # recomputed (FlashAttention-style), never stored across blocks
                    p = part.probs(bias, ctx.causal, step, acc, ctx.finite)
                do = do3[r, i:j]
                # (baddbmm_ / bmm out= into these strided slices fall back to per-matrix loops: 30x slower)
                dv3[kv, :ke] += to_kv_heads(p.to(v.dtype), do, g).to(acc)
                dp = per_head(do, part.v3[:, :ke].transpose(1, 2), g).to(acc)
                dp.sub_(row_dot[r, i:j])
                ds = (p * dp if ctx.probs is not None else p.mul_(dp)).to(q.dtype)  # dS = P * (dP - D); scale in q3
                dq3[r, i:j] = per_head(ds, part.k3[:, :ke], g).to(acc)
                dk3[kv, :ke] += to_kv_heads(ds, part.q3[:, i:j], g).to(acc)
        dq = _scaled(dq3, ctx.scale).view(q.shape).to(q.dtype)
        return dq, dk3.view(k.shape).to(k.dtype), dv3.view(v.shape).to(v.dtype), None, None, None, None, None, None, None


def blocked_attention(q, k, v, *, scale, q_positions, k_positions, causal, key_padding_mask=None, block=None,
                      bias_fn=None):
    """softmax(scale q k^T + bias, masked by position) @ v for q/k of any width E and v of width Dv; k and v may
    have fewer heads than q (grouped-query attention: query head h reads kv head h // (H / H_kv)).

    bias_fn(i, j, key_end) -> a constant (no gradient) bias block broadcastable to (B, H, j - i, key_end),
    generated on the fly so that no T x T bias is ever stored (ALiBi).
    """
    block = block or DEFAULT_BLOCK
    return call(BlockedAttention, q, k, v, scale, q_positions, k_positions, causal, key_padding_mask, block, bias_fn)
