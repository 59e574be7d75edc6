"""The reference attention: materialised logits, any dtype (float64 for checks), every encoding kind.

Every fast path is tested against these two functions.
"""
from __future__ import annotations

import torch

from ..encodings.base import PositionalEncoding
from .inputs import AttentionInputs, prepare, refuse_renamed, repeat_kv


def scores_from_inputs(inp: AttentionInputs, enc: PositionalEncoding, gate_keys=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, H, Tq, Tk) with -inf at masked pairs, visible mask)."""
    q, k = inp.q, inp.k
    visible = inp.visible()
    enc.check_positions(inp.q_positions, inp.k_positions, visible)
    if not inp.has_pairs:  # no query or no key: no logit to compute, for every encoding alike
        if enc.kind == "contextual":
            enc.gate_source(k, inp.v, gate_keys)  # the same argument checks as a non-empty call
        elif gate_keys is not None:
            raise ValueError("gate_keys is only accepted by contextual encodings (cope, cope-alibi) with gates='separate'")
        return no_pair_logits(inp), visible
    if enc.kind == "qk":
        q_enc, k_enc = enc.transform_qk(q, k, inp.q_positions, inp.k_positions)
    else:  # none / bias / contextual: q and k are used as they are
        q_enc, k_enc = q, k
    logits = inp.scale * (q_enc @ repeat_kv(k_enc, inp.groups).transpose(-1, -2))
    if inp.additive_mask() is not None:  # a float attn_mask: added to the logits before any contextual gate
        logits = logits + inp.additive_mask()
    if enc.kind == "bias":
        logits = logits + enc.bias(q, inp.q_positions, inp.k_positions, inp.scale)
    elif enc.kind == "contextual":
        logits = logits + enc.contextual_bias(q, contextual_gate_logits(inp, enc, gate_keys, logits), visible)
    elif gate_keys is not None:
        raise ValueError("gate_keys is only accepted by contextual encodings (cope, cope-alibi) with gates='separate'")
    return logits.masked_fill(~visible, float("-inf")), visible


def contextual_gate_logits(inp: AttentionInputs, enc: PositionalEncoding, gate_keys, logits: torch.Tensor):
    """The gate logits of a contextual encoding: the content `logits` themselves when its gates read the keys,
    else scale * q . source with source its values or separate gate keys (enc.gate_source)."""
    source = enc.gate_source(inp.k, inp.v, gate_keys)
    if source is inp.k:
        return logits
    return inp.scale * (inp.q @ repeat_kv(source, inp.groups).transpose(-1, -2))


def no_pair_logits(inp: AttentionInputs) -> torch.Tensor:
    """The (B, H, Tq, Tk) logits of an input with no query or no key: empty, yet computed from q and k (a
    product over an empty channel axis) so that autograd still reaches them and their gradients are zeros."""
    return inp.q[..., :0] @ repeat_kv(inp.k[..., :0], inp.groups).transpose(-1, -2)


def attention_scores(q, k, enc, *, attn_mask=None, is_causal: bool = False, scale=None, enable_gqa: bool = False,
                     q_positions=None, k_positions=None, v=None, gate_keys=None, **removed) -> torch.Tensor:
    """Reference logits (B, H, Tq, Tk) after the encoding's contribution and the scale; masked entries are -inf.

    q: (B, H, Tq, head_dim); k: (B, H_kv, Tk, head_dim), H_kv == H unless enable_gqa (then H_kv divides H and
    query head h uses kv head h // (H // H_kv)). Positions: int tensors (Tq,)/(Tk,) or (B, T), default arange;
    with `is_causal` a key is visible to a query iff its position is <= the query's. attn_mask: as in
    `F.scaled_dot_product_attention` (bool: True = attend; float: added to the logits). `v` is needed only for
    CoPE value gates and `gate_keys` only for CoPE separate gates.
    """
    refuse_renamed("attention_scores", removed)
    inp = prepare(q, k, v, enc, causal=is_causal, q_positions=q_positions, k_positions=k_positions, scale=scale,
                  attn_mask=attn_mask, enable_gqa=enable_gqa)
    return scores_from_inputs(inp, enc, gate_keys)[0]


def softmax_rows(logits: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax over keys; a query that sees no key gets all-zero weights instead of NaN."""
    has_key = visible.any(-1, keepdim=True)
    return torch.softmax(logits.masked_fill(~has_key, 0.0), dim=-1) * has_key


def reference_attention(q, k, v, enc, *, attn_mask=None, is_causal: bool = False, scale=None,
                        enable_gqa: bool = False, q_positions=None, k_positions=None, gate_keys=None,
                        **removed) -> torch.Tensor:
    """(B, H, Tq, Dv) = softmax(attention_scores(...)) @ v, materialising the logits; rows with no visible key are 0."""
    refuse_renamed("reference_attention", removed)
    inp = prepare(q, k, v, enc, causal=is_causal, q_positions=q_positions, k_positions=k_positions, scale=scale,
                  attn_mask=attn_mask, enable_gqa=enable_gqa)
    if v is None:
        raise ValueError("v must be a tensor (B, H_kv, Tk, Dv), got None")
    logits, visible = scores_from_inputs(inp, enc, gate_keys)
    return softmax_rows(logits, visible).to(v.dtype) @ repeat_kv(v, inp.groups)
