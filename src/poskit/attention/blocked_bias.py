"""Exact attention with a learned (trainable) additive logit bias, in query blocks, on CPU.

A learned bias such as the relative embeddings' scale * q_t . e[t - s] is a (B, H, T, T) tensor when
materialised, and SDPA with it as a float mask keeps it and its gradient alive (2.5 GB at B=1, H=8,
T=4096). Here the bias of one block of queries against its visible keys is generated on the fly by the
encoding's own `bias` hook (which gathers it from the table of the offsets that occur), used, and dropped;
the backward generates it again under autograd and pulls the logits' gradient back through it into q and
into the bias parameters (the embedding table). Memory O(block * Tk) per head, never T x T.

The loop structure and the softmax of a block are blocked.py's (ALiBi's constant bias goes there).
"""
from __future__ import annotations

import torch

from ..encodings.base import PositionalEncoding
from ..util.function_call import call
from .blocked import DEFAULT_BLOCK, _batch_chunks, _block_plan, _block_probs, _flat, _partial_mask, _Rows
from .grouped import per_head, to_kv_heads
from .inputs import AttentionInputs


def _block_bias(bias_fn, params, q_block, part: _Rows, i: int, j: int, ke: int):
    """The bias of queries [i, j) of the part's batch rows (q_block: their unscaled q) against keys [0, ke)."""
    return bias_fn(q_block, part.q_positions[:, i:j], part.k_positions[:, :ke], params)


class BlockedBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, q_positions, k_positions, causal, key_padding_mask, block, bias_fn, *params):
        # q (B, H, Tq, D); k, v (B, H_kv, Tk, .) (grouped.py); params: the tensors bias_fn
        # reads (passed so that autograd routes their gradients here, and given back to bias_fn, since in the
        # backward the module may hold other tensors, e.g. after torch.func.functional_call)
        B, H, Tq, _ = q.shape
        Tk = k.shape[2]
        stat = torch.promote_types(q.dtype, torch.float32)
        plan = _block_plan(q_positions, k_positions, key_padding_mask, causal, Tq, Tk, block)
        chunks = _batch_chunks(B, H, block, Tk, torch.empty(0, dtype=stat).element_size())
        q3, k3, v3 = _flat(q * scale), _flat(k), _flat(v)
        parts = [_Rows(b0, b1, H, q3, k3, v3, q_positions, k_positions, key_padding_mask) for b0, b1 in chunks]
        out = q.new_zeros(B, H, Tq, v.shape[-1])
        out3 = out.view(B * H, Tq, -1)
        for step in plan:
            i, j, _, ke = step
            if ke == 0:
                continue  # no key visible to any query of the block: output 0
            for part in parts:
                bias = _block_bias(bias_fn, params, q[part.b0:part.b1, :, i:j], part, i, j, ke)
                p = _block_probs(part.q3, part.k3, part.shape, bias, part.q_positions, part.k_positions, part.pad,
                                 causal, step, stat)
                out3[part.rows, i:j] = per_head(p.to(v.dtype), part.v3[:, :ke], part.groups)
        pad = key_padding_mask if key_padding_mask is not None else torch.empty(0)
        ctx.save_for_backward(q, k, v, out, q_positions, k_positions, pad, *params)
        ctx.args = (scale, causal, key_padding_mask is not None, plan, chunks, bias_fn)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, q_positions, k_positions, pad, *params = ctx.saved_tensors
        scale, causal, has_pad, plan, chunks, bias_fn = ctx.args
        pad = pad if has_pad else None
        B, H = q.shape[:2]
        acc = torch.promote_types(q.dtype, torch.float32)
        q3, k3, v3 = _flat(q * scale), _flat(k), _flat(v)
        do3 = _flat(grad_out.contiguous())
        dq3, dk3, dv3 = (torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q3, k3, v3))
        dq_bias = torch.zeros(q.shape, dtype=acc, device=q.device)  # through the bias, which reads the unscaled q
        dparams = [torch.zeros(p.shape, dtype=acc, device=p.device) if p.requires_grad else None for p in params]
        row_dot = (do3.to(acc) * _flat(out).to(acc)).sum(-1, keepdim=True)  # D_t = rowsum(dO * O)
        parts = [_Rows(b0, b1, H, q3, k3, v3, q_positions, k_positions, pad) for b0, b1 in chunks]
        for step in plan:
            i, j, _, ke = step
            if ke == 0:
                continue
            for part in parts:
                r, kv, g = part.rows, part.kv_rows, part.groups
                q_blk = q[part.b0:part.b1, :, i:j].detach().requires_grad_(ctx.needs_input_grad[0])
                with torch.enable_grad():
                    bias = _block_bias(bias_fn, params, q_blk, part, i, j, ke)
                p = _block_probs(part.q3, part.k3, part.shape, bias.detach(), part.q_positions, part.k_positions,
                                 part.pad, causal, step, acc)
                do = do3[r, i:j]
                dv3[kv, :ke] += to_kv_heads(p.to(v.dtype), do, g).to(acc)
                dp = per_head(do, part.v3[:, :ke].transpose(1, 2), g).to(acc)
                ds = p.mul_(dp.sub_(row_dot[r, i:j]))  # dS = P * (dP - D): the gradient of the biased logits
                _bias_backward(bias, ds.view(*part.shape, j - i, ke), q_blk, params, dparams, dq_bias, part, i, j)
                ds = ds.to(q.dtype)
                dq3[r, i:j] = per_head(ds, part.k3[:, :ke], g).to(acc)
                dk3[kv, :ke] += to_kv_heads(ds, part.q3[:, i:j], g).to(acc)
        dq = (dq3.view(q.shape) * scale + dq_bias).to(q.dtype)
        grads = [None if d is None else d.to(p.dtype) for d, p in zip(dparams, params)]
        return (dq, dk3.view(k.shape).to(k.dtype), dv3.view(v.shape).to(v.dtype), None, None, None, None, None, None,
                None, *grads)


def _bias_backward(bias, ds, q_blk, params, dparams, dq_bias, part, i, j):
    """Accumulate <ds, d bias> into the gradients of q (unscaled) and of the bias parameters."""
    if not bias.requires_grad:
        return
    wanted = [(n, p) for n, p in enumerate(params) if dparams[n] is not None]
    inputs = ([q_blk] if q_blk.requires_grad else []) + [p for _, p in wanted]
    if not inputs:
        return
    grads = torch.autograd.grad(bias, inputs, ds.sum_to_size(bias.shape).to(bias.dtype), allow_unused=True)
    if q_blk.requires_grad:
        g, grads = grads[0], grads[1:]
        if g is not None:
            dq_bias[part.b0:part.b1, :, i:j] += g
    for (n, _), g in zip(wanted, grads):
        if g is not None:
            dparams[n] += g


class _BiasOf(torch.nn.Module):
    """enc.bias as a module call, so that torch.func.functional_call can swap the encoding's parameters."""

    wraps_temporarily = True  # for one call: the encoding does not become part of a model (registration.py)

    def __init__(self, enc, scale: float):
        super().__init__()
        self.enc, self.scale = enc, scale

    def forward(self, q, q_positions, k_positions):
        return self.enc.bias(q, q_positions, k_positions, self.scale)


def blocked_bias_attention(q, k, v, enc, *, scale, q_positions, k_positions, causal, key_padding_mask=None,
                           block=None):
    """softmax(scale q k^T + enc.bias(...), masked by position) @ v, the bias generated per block of queries.

    enc: an encoding of kind "bias"; its `bias(q_block, q_positions_block, k_positions_block, scale)` gives
    (b|1, H|1, len q block, len k block) for those queries (unscaled q) and positions ((1|b, .) int64), and may
    read q and the encoding's parameters, which get their gradients (the bias is regenerated in the backward
    with the parameters this call was made with). q (B, H, Tq, D); k, v (B, H_kv, Tk, .).
    """
    module = _BiasOf(enc, scale)
    names, params = zip(*module.named_parameters()) if any(True for _ in module.parameters()) else ((), ())

    def bias_fn(q_block, qp, kp, tensors):
        return torch.func.functional_call(module, dict(zip(names, tensors)), (q_block, qp, kp), strict=False)

    return call(BlockedBiasAttention, q, k, v, scale, q_positions, k_positions, causal,
                                      key_padding_mask, block or DEFAULT_BLOCK, bias_fn, *params)


def check_positions_by_block(enc: PositionalEncoding, inp: AttentionInputs, block: int = DEFAULT_BLOCK) -> None:
    """enc.check_positions over blocks of queries: the same verdict (ValueError for positions the encoding
    cannot represent) without building the (Tq, Tk) visibility mask."""
    if type(enc).check_positions is PositionalEncoding.check_positions:
        return  # accepts every position
    qp, kp, Tq, Tk = inp.q_positions, inp.k_positions, inp.q.shape[2], inp.k.shape[2]
    for i in range(0, Tq, block):
        j = min(i + block, Tq)
        vis = _partial_mask(qp, kp, inp.key_padding_mask, inp.causal, i, j, 0, Tk)
        if vis is None:  # neither causal nor padded: every key visible
            vis = torch.ones(1, 1, j - i, Tk, dtype=torch.bool, device=qp.device)
        enc.check_positions(qp[:, i:j], kp, vis)
