"""Attention probabilities of a trained Transformer, per layer and head, through the exact reference formula.

`attention_maps(model, tokens)` records each layer's normalised input with a forward hook, rebuilds that
layer's q, k, v from its own projections and evaluates `poskit.attention_scores` (the float-checkable
reference path, every encoding alike) and a softmax: the weights the fast path used implicitly.

`lookup_attention(model, task, n)` asks where the Indirect Indexing models look (PoPE paper, Sec. 4): for
each layer and head, the mean attention mass that
* the query's source-character token puts on that character's occurrence in the string ("what": a content
  match), and
* the last input token (the one that predicts the target) puts on the target's position and on the source
  position ("where": the pointer arithmetic, source + shift), and
* each string token puts on the token k places to its left, k = 1..max_shift ("left_neighbour"). Why: with
  the query after the string, a causal model can only find the target if the string tokens have gathered
  their left neighbours beforehand (position-only heads); the source (left shifts) or the target (right
  shifts) is then found by a content match against what they gathered.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from poskit.attention.reference import attention_scores


@torch.no_grad()
def attention_maps(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """One (B, H, T, T) float64 tensor of attention probabilities per layer, for causal `tokens` (B, T)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        got = getattr(tokens, "shape", type(tokens).__name__)
        raise ValueError(f"tokens must be a (B, T) integer tensor, got {got}")
    inputs = []
    hooks = [b.attn.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach()))
             for b in model.blocks]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    T = tokens.shape[1]
    positions = torch.arange(T, device=tokens.device)
    maps = []
    for block, x in zip(model.blocks, inputs):
        a = block.attn
        x = x.double()
        proj = {name: getattr(a, name) for name in ("q_proj", "k_proj", "v_proj", "g_proj")}
        q, k, v = (a._heads(torch.nn.functional.linear(x, proj[n].weight.double(),
                                                       None if proj[n].bias is None else proj[n].bias.double()), h)
                   for n, h in (("q_proj", a.num_heads), ("k_proj", a.num_kv_heads), ("v_proj", a.num_kv_heads)))
        g = None if proj["g_proj"] is None else a._heads(
            torch.nn.functional.linear(x, proj["g_proj"].weight.double()), a.num_kv_heads)
        enc = copy.deepcopy(a.encoding).double()  # a float64 copy: the model itself is left as it is
        logits = attention_scores(q, k, enc, is_causal=True, enable_gqa=True, q_positions=positions,
                                  k_positions=positions, v=v, gate_keys=g)
        maps.append(torch.softmax(logits, dim=-1).nan_to_num(0.0))
    return maps


def lookup_attention(model, task, n: int = 256, seed: int = 0) -> dict:
    """Mean attention mass per layer and head ({"source_match", "target_from_last", "source_from_last"}: lists
    of shape (layers, heads); "left_neighbour": (layers, heads, max_shift), entry k-1 the mass a string token
    puts on the token k places to its left, averaged over the string tokens that have one) over `n` fresh
    Indirect Indexing examples, first query of each."""
    if getattr(task, "name", None) != "indirect-indexing":
        raise ValueError(f"task must be the indirect-indexing task, got {getattr(task, 'name', task)!r}")
    rng = np.random.default_rng(seed)
    sums, neighbour_sums = None, None
    offsets = range(1, task.max_shift + 1)
    for _ in range(n):
        src, queries = task.sample_raw(rng)
        i, s, _ = queries[0]
        text = src + "".join(task.format_query(src, qi, qs) for qi, qs, _ in queries)
        tokens = torch.tensor([task.vocab.encode(text)[:-1]])  # the model never sees the last target
        last = len(src) + len(task.format_query(src, i, s)) - 2  # the token that predicts the first target
        query_char = len(src) + 1  # ",<c>": the source character restated after the string
        maps = attention_maps(model, tokens)
        row = np.array([[[m[0, h, query_char, i].item(), m[0, h, last, i + s].item(), m[0, h, last, i].item()]
                         for h in range(m.shape[1])] for m in maps])  # (layers, heads, 3)
        sums = row if sums is None else sums + row
        # string tokens j >= k, attention on j - k: the k-th subdiagonal of the string block, per layer and head
        neighbours = np.array([[[m[0, h, : len(src), : len(src)].diagonal(-k).mean().item() for k in offsets]
                                for h in range(m.shape[1])] for m in maps])  # (layers, heads, max_shift)
        neighbour_sums = neighbours if neighbour_sums is None else neighbour_sums + neighbours
    mean = sums / n
    return {"source_match": mean[..., 0].tolist(), "target_from_last": mean[..., 1].tolist(),
            "source_from_last": mean[..., 2].tolist(), "left_neighbour": (neighbour_sums / n).tolist(),
            "examples": n}
