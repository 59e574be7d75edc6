"""Fast exact paths through `F.scaled_dot_product_attention` (SDPA).

On CPU, SDPA's flash kernel serves boolean masks and 4-d float masks, but only when q, k and v share a
head dim; a 3-d float mask or unequal head dims send it to the much slower math path. The helpers here
keep every call on the fast kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import blocked as blocked_module  # its DEFAULT_BLOCK is read at call time (a test or a sweep may set it)
from .inputs import AttentionInputs, all_finite, repeat_kv
from .reference import softmax_rows


def mask_plan(inp: AttentionInputs) -> str:
    """How SDPA must mask: "none", "causal" (its own top-left aligned flag) or "explicit" (a bool mask).

    Explicit positions that make the mask trivial are recognised on CPU, where the check is a cheap
    O(T) pass and the saving is large: a decode step (its query at or after every cached key) needs no
    mask, and identical strictly increasing q/k positions are SDPA's causal flag. A bool mask would cost
    a (Tq, Tk) tensor per call and, for prefill, the slower masked kernel.
    """
    if inp.key_padding_mask is not None or inp.attn_mask is not None:
        return "explicit"
    if not inp.causal:
        return "none"
    if inp.default_positions:
        return "causal"
    qp, kp = inp.q_positions, inp.k_positions
    # (reading positions is data-dependent: a graph break under torch.compile, which masks explicitly instead)
    if qp.device.type == "cpu" and kp.numel() and qp.numel() and not torch.compiler.is_compiling():
        if bool((kp.amax(-1) <= qp.amin(-1)).all()):  # per sequence: every key at or before every query
            return "none"
        if qp.shape == kp.shape and qp.shape[0] == 1 and torch.equal(qp, kp) and bool((kp[0, 1:] > kp[0, :-1]).all()):
            return "causal"
    return "explicit"


# Beyond this many keys a training-size PoPE call is faster through SDPA's flash kernel with v zero-padded
# to 2d (its key tiles stay in cache; the blocked path's full key rows do not). Measured forward + backward
# at B=8, H=8, d=64, causal, against RoPE + SDPA in the same process (2026-11-23, 2 threads, medians of 3):
# at 4096 keys the blocked path is still ahead (bf16 1.52x against padded SDPA's 1.74x, fp32 1.85x against
# 2.13x); at 8192 in bf16 it is behind (1.97x against 1.89x, one round).
BLOCKED_MAX_KEYS = 4096


def use_blocked(inp: AttentionInputs, enc) -> bool:
    """On CPU, q/k wider than v (an encoding declaring qk_width > 1, e.g. PoPE) run faster through the blocked
    path than through padded SDPA, up to BLOCKED_MAX_KEYS keys, and always for a few queries (decode)."""
    if inp.q.device.type != "cpu" or enc.qk_width == 1 or inp.attn_mask is not None:
        return False  # a general attn_mask is served by SDPA with a merged mask, not by the blocked path
    return inp.k.shape[2] <= BLOCKED_MAX_KEYS or inp.q.shape[2] <= blocked_module.DEFAULT_BLOCK


def blocked(inp: AttentionInputs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias_fn=None,
            prescaled: bool = False):
    """The blocked path (attention/blocked.py) on encoded q/k, grouped kv heads read where they lie.
    prescaled: q already carries the attention scale."""
    return blocked_module.blocked_attention(q, k, v, scale=1.0 if prescaled else inp.scale,
                                            q_positions=inp.q_positions, k_positions=inp.k_positions,
                                            causal=inp.causal, key_padding_mask=inp.key_padding_mask,
                                            bias_fn=bias_fn)


def sdpa(inp: AttentionInputs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None):
    """softmax(scale * q k^T + bias, masked by inp) @ v, with q/k possibly re-encoded (any width, equal for q and k).

    v is zero-padded to q's width when they differ, so that the CPU flash kernel is used; the padding
    columns of the output are sliced off.
    """
    groups = q.shape[1] // k.shape[1]
    if not all_finite(q, inp.keys_to_check(k), bias):
        return _materialised(inp, q, k, v, bias)  # checked before merging the attn_mask, whose -inf is a mask
    dv = v.shape[-1]
    if dv < q.shape[-1] and q.device.type == "cpu":
        v = F.pad(v, (0, q.shape[-1] - dv))
    added = inp.additive_mask()  # a float attn_mask rides with the encoding's bias
    if added is not None:
        bias = added if bias is None else bias + added.to(bias.dtype)
    plan = "explicit" if bias is not None else mask_plan(inp)
    mask, is_causal, visible = None, False, None
    if plan == "explicit":
        visible = inp.visible()  # (1|B, 1, Tq, Tk) bool
        if bias is not None:
            mask = torch.where(visible, bias, float("-inf"))  # (either may be the broader one)
            if mask.dim() == 3:  # a 3-d float mask sends CPU SDPA to the math path
                mask = mask.unsqueeze(0)
        else:
            mask = visible
    else:
        is_causal = plan == "causal"
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=inp.scale, enable_gqa=groups > 1
    )[..., :dv]
    if visible is not None:
        has_key = visible.any(-1, keepdim=True)  # a query that sees no key outputs 0, as in the reference
        # off the CPU, asking whether any query lacks a key waits for every queued kernel (a host read):
        # the fill costs less there. masked_fill, not a product: a row without keys may hold NaN
        if q.device.type != "cpu" or not bool(has_key.all()):
            out = out.masked_fill(~has_key, 0)
    return out


def _materialised(inp: AttentionInputs, q, k, v, bias):
    """The reference formula on encoded q/k, for inputs holding NaN or inf.

    CPU SDPA's flash kernel zeroes a row whose logits are all NaN when it has fewer keys than one vector
    register (16 fp32 lanes): its scalar tail max skips NaN, the row's max stays -inf and the row is treated
    as fully masked. NaN in q (or in every visible key) then came out as a finite row of zeros; the
    materialised softmax keeps it NaN, as the reference does.
    """
    logits = inp.scale * (q @ repeat_kv(k, q.shape[1] // k.shape[1]).transpose(-1, -2))
    if bias is not None:
        logits = logits + bias
    if inp.additive_mask() is not None:
        logits = logits + inp.additive_mask()
    visible = inp.visible()
    weights = softmax_rows(logits.masked_fill(~visible, float("-inf")), visible)  # fp32 with an fp32 bias
    return weights.to(v.dtype) @ repeat_kv(v, q.shape[1] // v.shape[1])
