"""Frequency usage of trained models (PoPE paper Figs. 3-6, after Barbero et al.): for each layer and head, the
mean magnitude that queries and keys give each frequency component over held-out inputs.

The components and their magnitudes come from what the layer's encoding declares
(`component_frequencies`, `component_magnitudes`): RoPE's 2-D chunks (their 2-norm), PoPE's complex features
(their modulus). An encoding without frequency components (alibi, cope, none, absolute ones) is refused with
its name. Magnitudes are read from the raw q and k (the outputs of q_proj and k_proj, captured by forward
hooks), before the encoding: rotation or phase never changes them, so this is the content's share alone.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from .output import checked_out_dir, write_result
from .trained import capture_projections, layer_heads, load_held_out

FREQUENCY_JSON, FREQUENCY_PNG = "frequency.json", "frequency.png"


def model_frequency_usage(model, batches, max_tokens: int | None = None) -> dict:
    """Mean component magnitudes of `model`'s queries and keys over the input windows of `batches` (objects with
    an `inputs` (B, T) tensor), at most `max_tokens` tokens. Returns {"frequencies": (C,) list, "tokens": n,
    "layers": [{"q": (H, C) list, "k": (H_kv, C) list}]}; raises ValueError naming the encoding when a layer's
    encoding declares no frequency components."""
    layers = [b.attn for b in model.blocks]
    freqs = None
    for i, attn in enumerate(layers):
        f = attn.encoding.component_frequencies()
        if f is None:
            name = getattr(attn.encoding, "name", "") or type(attn.encoding).__name__
            raise ValueError(f"the encoding {name!r} of layer {i} declares no frequency components "
                             "(component_frequencies() is None): the frequency analysis needs an encoding such as "
                             "rope or pope")
        freqs = f if freqs is None else freqs
    sums = [{"q": None, "k": None} for _ in layers]
    captured, hooks = capture_projections(layers, ("q", "k"))
    tokens = 0
    try:
        with torch.no_grad():
            for batch in batches:
                x = batch.inputs
                if max_tokens is not None:
                    rows = max(1, math.ceil((max_tokens - tokens) / x.shape[1]))
                    x = x[:rows]
                model(x)
                for i, attn in enumerate(layers):
                    heads = layer_heads(captured, i, attn)
                    for side in ("q", "k"):
                        mags = attn.encoding.component_magnitudes(heads[side].double())
                        total = mags.sum(dim=(0, 2))  # (heads, C): summed over batch and positions
                        sums[i][side] = total if sums[i][side] is None else sums[i][side] + total
                tokens += x.shape[0] * x.shape[1]
                if max_tokens is not None and tokens >= max_tokens:
                    break
    finally:
        for h in hooks:
            h.remove()
    if tokens == 0:
        raise ValueError("batches must hold at least one input window, got none")
    return {"frequencies": freqs.tolist(), "tokens": tokens,
            "layers": [{side: (s[side] / tokens).tolist() for side in ("q", "k")} for s in sums]}


def _summary(layers: list[dict], freqs: list[float]) -> list[dict]:
    """Per layer: the share of the mean magnitude held by the highest- and the lowest-frequency quarter of the
    components (0.25 each if every component were used alike), the number a reader compares with the figures."""
    order = sorted(range(len(freqs)), key=lambda c: -freqs[c])  # highest frequency first
    quarter = max(1, len(order) // 4)
    out = []
    for layer in layers:
        row = {}
        for side in ("q", "k"):
            per_c = torch.tensor(layer[side]).mean(0)  # mean over heads, (C,)
            total = float(per_c.sum())
            row[f"{side}_high_quarter_share"] = float(per_c[order[:quarter]].sum()) / total
            row[f"{side}_low_quarter_share"] = float(per_c[order[-quarter:]].sum()) / total
        out.append(row)
    return out


def frequency_usage(run_dir, split: str = "test", max_tokens: int | None = 16384) -> dict:
    """`model_frequency_usage` of the trained run in `run_dir` over its task's held-out `split` (at most
    `max_tokens` tokens), with the run's encoding and a per-layer summary."""
    model, task, cfg = load_held_out(run_dir, split, max_tokens)
    usage = model_frequency_usage(model, task.split(split), max_tokens)
    usage.update(run_dir=str(run_dir), encoding=cfg.model.encoding, encoding_options=cfg.model.encoding_options,
                 task=cfg.task, split=split, summary=_summary(usage["layers"], usage["frequencies"]))
    return usage


def _label(r: dict) -> str:
    tail = "/".join(Path(r["run_dir"]).parts[-2:])  # e.g. lm/rope or rope/seed0: enough to tell runs apart
    return f"{r['encoding']} ({tail})"


def plot_frequency(results: list[dict], path) -> Path:
    """One row per run, queries left and keys right: components (highest frequency at the top) x layers,
    the mean magnitude over heads, as the paper's Figs. 3-6."""
    from poskit.report.figure import save_figure
    from poskit.report.plots import plt

    fig, axes = plt.subplots(len(results), 2, figsize=(9, 3.2 * len(results)), squeeze=False)
    for row, r in zip(axes, results):
        order = sorted(range(len(r["frequencies"])), key=lambda c: -r["frequencies"][c])
        for ax, side, what in zip(row, ("q", "k"), ("queries", "keys")):
            grid = torch.stack([torch.tensor(layer[side]).mean(0)[order] for layer in r["layers"]], dim=1)
            im = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
            ax.set_title(f"{_label(r)}: {what}", fontsize=9)
            ax.set_xlabel("layer")
            ax.set_ylabel("component (high -> low frequency)")
            ax.set_xticks(range(grid.shape[1]))
            fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, path, dpi=110)


def write_frequency(run_dirs: list, out_dir, split: str = "test", max_tokens: int | None = 16384) -> dict:
    """Analyse every run; write out_dir/frequency.json (every number behind the plot) and frequency.png.
    Every run is checked (it loads, its encoding declares frequency components) before anything is written."""
    if not run_dirs:
        raise ValueError("runs must list at least one run directory")
    out_dir = checked_out_dir(out_dir)
    results = [frequency_usage(d, split, max_tokens) for d in run_dirs]
    report = {"split": split, "max_tokens": max_tokens, "runs": results}
    return write_result(out_dir, report, FREQUENCY_JSON, lambda r, path: plot_frequency(r["runs"], path),
                        FREQUENCY_PNG)
