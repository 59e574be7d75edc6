"""The sdpa backend as torch.compile traces it: encode q/k (or build the bias), then one
F.scaled_dot_product_attention call, with no decision that reads tensor values.

In eager mode the sdpa backend picks among exact paths by looking at the data: a finiteness check (NaN rows
go to the materialised formula), trivial-mask recognition from the positions, and the blocked path's
per-block key ranges (attention/sdpa.py, blocked.py). Each of those reads a tensor value into Python, which
under Dynamo is a graph break, and `fullgraph=True` refuses it. Traced, the call instead masks by the
visibility mask itself (or SDPA's causal flag when the positions are the default arange), which is exact for
every input; inductor then fuses the encoding into the surrounding graph. What is lost is speed, never
correctness: no causal block skipping for PoPE's wide q/k (v is zero-padded to their width, as SDPA needs
one head dim), and ALiBi's bias is materialised (Tq x Tk per head). Inputs holding NaN or inf are not
routed to the materialised formula: rows are whatever the compiled SDPA gives.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import AttentionInputs
from .sdpa import mask_plan


def traced_sdpa(inp: AttentionInputs, enc) -> torch.Tensor:
    """softmax(scale * q'k'^T + bias, masked) @ v for a "none", "qk" or "bias" encoding."""
    q, k, v, bias = inp.q, inp.k, inp.v, None
    if enc.kind == "qk":
        q, k = enc.transform_qk(q, k, inp.q_positions, inp.k_positions)
    elif enc.kind == "bias":
        enc.check_positions(inp.q_positions, inp.k_positions, inp.visible())
        bias = enc.bias(inp.q, inp.q_positions, inp.k_positions, inp.scale)
    added = inp.additive_mask()  # a float attn_mask rides with the encoding's bias, as in sdpa.sdpa
    if added is not None:
        bias = added if bias is None else bias + added.to(bias.dtype)
    dv = v.shape[-1]
    if dv < q.shape[-1]:  # SDPA needs one head dim: zero columns of v add nothing and are sliced off
        v = F.pad(v, (0, q.shape[-1] - dv))
    plan = "explicit" if bias is not None else mask_plan(inp)  # "none"/"causal"/"explicit", from shapes and flags
    mask, visible = None, None
    if plan == "explicit":
        visible = inp.visible()  # (1|B, 1, Tq, Tk) bool
        mask = visible if bias is None else torch.where(visible, bias, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=plan == "causal", scale=inp.scale,
                                         enable_gqa=q.shape[1] != k.shape[1])[..., :dv]
    if visible is not None:  # a query that sees no key outputs 0, as in the reference
        out = torch.where(visible.any(-1, keepdim=True), out, out.new_zeros(()))
    return out
