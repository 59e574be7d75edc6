"""Where the Indirect Indexing models look: one figure per study group, RoPE beside PoPE.

Top row, per run: the mean attention mass (over fresh examples) per layer and head that
  (a) the restated source character puts on that character inside the string ("what": a content match),
  (b) the last input token puts on the target, source + shift ("where": the pointer arithmetic),
  (c) the last input token puts on the source character itself.
Middle row, per run: the mean attention mass a string token puts on the token k places to its left, per layer
and head (position-only heads that gather the neighbours a later content match reads; see
evaluate/attention_maps.py).
Bottom row, per run: the attention of the last input token over one example's positions, per layer (mean over
heads), with the source and the target marked.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .figure import save_figure
from .plots import plt

LOOKUP_JSON = "lookup_attention.json"
LOOKUP_PNG = "lookup_attention.png"


def _example(task, seed: int):
    rng = np.random.default_rng(seed)
    src, queries = task.sample_raw(rng)
    i, s, _ = queries[0]
    text = src + "".join(task.format_query(src, qi, qs) for qi, qs, _ in queries)
    last = len(src) + len(task.format_query(src, i, s)) - 2
    return text, i, s, last


def write_lookup_report(run_dirs: dict[str, Path], out_dir, n: int = 200, seed: int = 0) -> list[Path]:
    """For each {label: run directory} (trained Indirect Indexing runs), measure `lookup_attention` over `n`
    examples; write <out_dir>/lookup_attention.json and .png; returns their paths."""
    from poskit.evaluate.attention_maps import attention_maps, lookup_attention
    from poskit.training.run import load_run

    if not run_dirs:
        raise ValueError("run_dirs must name at least one trained run")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    measured, examples = {}, {}
    for label, run_dir in run_dirs.items():
        model, task, _ = load_run(run_dir)
        measured[label] = lookup_attention(model, task, n=n, seed=seed)
        text, i, s, last = _example(task, seed + 1)
        maps = attention_maps(model, torch.tensor([task.vocab.encode(text)[:-1]]))
        examples[label] = {"text": text, "source": i, "target": i + s, "last": last,
                           "rows": [m[0, :, last, : last + 1].mean(0).tolist() for m in maps]}
    js = out_dir / LOOKUP_JSON
    js.write_text(json.dumps({"examples_measured": n, "runs": {k: {**measured[k], "example": examples[k]}
                                                                for k in run_dirs}}, indent=1))
    labels = list(run_dirs)
    fig, axes = plt.subplots(3, len(labels), figsize=(6 * len(labels), 11), squeeze=False)
    for col, label in enumerate(labels):
        m = measured[label]
        ax = axes[0, col]
        kinds = [("source_match", "char -> its occurrence (what)"), ("target_from_last", "last -> target (where)"),
                 ("source_from_last", "last -> source")]
        layers, heads = np.array(m["source_match"]).shape
        x = np.arange(layers * heads)
        for k, (key, name) in enumerate(kinds):
            ax.bar(x + (k - 1) * 0.27, np.array(m[key]).ravel(), width=0.27, label=name)
        ax.set_xticks(x, [f"L{l}H{h}" for l in range(layers) for h in range(heads)], fontsize=7, rotation=90)
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"mean attention mass ({n} examples)")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7)
        ax = axes[1, col]
        neighbours = np.array(m["left_neighbour"]).reshape(layers * heads, -1)
        ax.imshow(neighbours, aspect="auto", cmap="magma", vmin=0, vmax=1)
        ax.set_xticks(range(neighbours.shape[1]), [str(k + 1) for k in range(neighbours.shape[1])])
        ax.set_yticks(range(layers * heads), [f"L{l}H{h}" for l in range(layers) for h in range(heads)], fontsize=7)
        ax.set_xlabel("k: the string token k places to the left")
        for (r, c), value in np.ndenumerate(neighbours):
            ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=6,
                    color="black" if value > 0.5 else "white")
        ax.set_title("string token -> its k-th left neighbour (mean mass)", fontsize=9)
        ex = examples[label]
        ax = axes[2, col]
        image = np.array(ex["rows"])
        ax.imshow(image, aspect="auto", cmap="viridis", vmin=0, vmax=max(1e-6, image.max()))
        ax.set_xticks(range(ex["last"] + 1), list(ex["text"][: ex["last"] + 1]), fontsize=6)
        ax.set_yticks(range(len(ex["rows"])), [f"layer {l}" for l in range(len(ex["rows"]))])
        for pos, mark in ((ex["source"], "source"), (ex["target"], "target")):
            ax.axvline(pos, color="white" if mark == "source" else "red", lw=1, ls="--")
        ax.set_title("last token's attention (mean over heads); white: source, red: target", fontsize=9)
    png = save_figure(fig, out_dir / LOOKUP_PNG, dpi=110)
    return [js, png]
