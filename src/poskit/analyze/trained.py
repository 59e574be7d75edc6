"""What the analyses of trained runs share: loading a run with its held-out split checked, and reading the raw
projections that each attention layer hands the engine (forward hooks), split into heads."""
from __future__ import annotations

import torch

from poskit.training import load_run


def load_held_out(run_dir, split: str, max_tokens: int | None):
    """(model, task, cfg) of the trained run in `run_dir`, after checking `max_tokens` (a positive int or None)
    and that the run's task has the held-out `split`."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be a positive int or None (all), got {max_tokens!r}")
    model, task, cfg = load_run(run_dir)
    names = task.split_names if hasattr(task, "split_names") else ()
    if names and split not in names:
        raise ValueError(f"split must be one of {list(names)} for run {str(run_dir)!r}, got {split!r}")
    return model, task, cfg


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, n_heads * hd) -> (B, n_heads, T, hd), the split poskit.nn.Attention makes."""
    B, T, width = x.shape
    return x.view(B, T, n_heads, width // n_heads).transpose(1, 2)


def capture_projections(layers, sides) -> tuple[dict, list]:
    """Forward hooks on each layer's `<side>_proj` (q, k, v, g; a layer without one is skipped): returns the dict
    they fill, {(layer index, side): output}, and the hook handles (remove them when done)."""
    captured: dict = {}
    hooks = []
    for i, attn in enumerate(layers):
        for side in sides:
            proj = getattr(attn, f"{side}_proj", None)
            if proj is not None:
                hooks.append(proj.register_forward_hook(
                    lambda m, a, out, i=i, side=side: captured.__setitem__((i, side), out)))
    return captured, hooks


def layer_heads(captured: dict, i: int, attn) -> dict:
    """The captured projections of layer `i`, split into heads: q into the layer's query heads, the others into
    its kv heads."""
    return {side: split_heads(out, attn.num_heads if side == "q" else attn.num_kv_heads)
            for (layer, side), out in captured.items() if layer == i}
