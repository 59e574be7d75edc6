"""The passkey heat map: exact-match accuracy per prompt length (x) and key depth (y), the plot of
needle-in-a-haystack tests, from a :func:`poskit.evaluate.passkey.passkey_grid` result."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .figure import save_figure  # noqa: E402

__all__ = ["plot_passkey"]


def plot_passkey(result: dict, path, context: int | None = None, title: str | None = None,
                 metric: str = "accuracy") -> Path:
    """Heat map of ``result[metric]`` ("accuracy" or "digit_accuracy", in [0, 1]) with the value in each cell;
    depth 0 (key at the start) on top, as needle-in-a-haystack plots draw it.  ``context``: the training context,
    marked on the length axis.  Returns the PNG's path."""
    if metric not in ("accuracy", "digit_accuracy"):
        raise ValueError(f"metric must be 'accuracy' or 'digit_accuracy', got {metric!r}")
    for key in ("lengths", "depths", metric):
        if key not in result:
            raise ValueError(f"result must be a passkey_grid result with {key!r}; it has {sorted(result)}")
    lengths, depths = result["lengths"], result["depths"]
    values = [[row[j] for row in result[metric]] for j in range(len(depths))]  # (depth, length)
    fig, ax = plt.subplots(figsize=(1.1 * len(lengths) + 2.5, 0.45 * len(depths) + 1.8))
    image = ax.imshow(values, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for j in range(len(depths)):
        for i in range(len(lengths)):
            v = values[j][i]
            ax.text(i, j, f"{100 * v:.0f}", ha="center", va="center", fontsize=8,
                    color="white" if v < 0.2 or v > 0.85 else "black")
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{100 * d:g}%" for d in depths])
    if context is not None:
        for i, L in enumerate(lengths):
            if L == context:
                ax.get_xticklabels()[i].set_fontweight("bold")
        # the training context sits between the last length inside it and the first beyond it
        inside = sum(L <= context for L in lengths)
        if 0 < inside < len(lengths):
            ax.axvline(inside - 0.5, color="black", linewidth=1.5, linestyle="--")
    # a grid's lengths count the key's tokens the model reads unless it says otherwise (passkey_grid)
    what = "positions read (prompt + key)" if result.get("answer_in_length", True) else "prompt length"
    ax.set_xlabel(f"{what}, tokens" + (f"; training context {context} (dashed)" if context else ""))
    ax.set_ylabel("key depth")
    fig.colorbar(image, ax=ax, label="exact match" if metric == "accuracy" else "digits correct")
    ax.set_title(title or f"passkey retrieval ({result.get('trials', '?')} trials per cell)")
    return save_figure(fig, path, dpi=120)
