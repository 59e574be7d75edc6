"""Position correlation of absolute encodings (Legendre PE paper, Figs. 1 and 3): the Pearson correlation
between the encoding vectors of every two positions, over all dimensions and over the high dimensions alone
(d >= high_from; the paper's d > 356 of 512), and the high-dimension curves Corr(p_n, p_m) against m for a few
anchor positions n (its Fig. 1b / 3b).

Any encoding of kind "absolute" (its `embed(positions)` is the vector added to the embeddings) can be analysed;
the paper compares sinusoidal and legendre. Computed in float64.
"""
from __future__ import annotations

from pathlib import Path

import torch

import poskit
from poskit.util.validate import check_int

from .output import checked_out_dir, write_result

CORRELATION_JSON, CORRELATION_PNG = "correlation.json", "correlation.png"
PAPER_ANCHORS = (1, 40, 100, 200, 260, 299)  # the positions n of the paper's eq. 5


def correlation_matrix(vectors: torch.Tensor) -> torch.Tensor:
    """Pearson correlation between the rows of `vectors` (P, D) -> (P, P), float64; a row with zero variance
    (a constant vector) has no correlation: its row and column are NaN."""
    x = vectors.to(torch.float64)
    x = x - x.mean(dim=1, keepdim=True)
    norm = x.norm(dim=1, keepdim=True)
    x = x / norm.where(norm > 0, torch.full_like(norm, float("nan")))
    return x @ x.T


def position_correlation(encodings: list[str], dim: int = 512, positions: int = 300, high_from: int = 356,
                         anchors: tuple = PAPER_ANCHORS) -> dict:
    """For each absolute encoding: its correlation matrices over positions 0..positions-1 (all dimensions; the
    dimensions high_from..dim-1) and the high-dimension curves of the `anchors`."""
    check_int(dim, "dim", minimum=2)
    check_int(positions, "positions", minimum=2)
    check_int(high_from, "high_from", minimum=0, maximum=dim - 2)  # at least two dimensions to correlate over
    if not anchors or any(not isinstance(a, int) or isinstance(a, bool) or not 0 <= a < positions for a in anchors):
        raise ValueError(f"anchors must be positions in [0, positions={positions}), got {list(anchors)!r}")
    known = poskit.available_encodings()
    if not encodings or any(e not in known for e in encodings):
        raise ValueError(f"encodings must name encodings from {known}, got {encodings!r}")
    out = {"dim": dim, "positions": positions, "high_from": high_from, "anchors": list(anchors), "encodings": {}}
    for name in encodings:
        enc = poskit.build_encoding(name, head_dim=dim, num_heads=1, dim=dim)
        if enc.kind != "absolute":
            raise ValueError(f"encodings must be absolute (kind 'absolute', vectors added to the embeddings), "
                             f"{name!r} is {enc.kind!r}")
        with torch.no_grad():
            vectors = enc.embed(torch.arange(positions)).to(torch.float64)  # (P, dim)
        full, high = correlation_matrix(vectors), correlation_matrix(vectors[:, high_from:])
        off = ~torch.eye(positions, dtype=torch.bool)
        out["encodings"][name] = {
            "vectors_std_per_dim": vectors.std(dim=0).tolist(),  # Fig. 1a: how much each dimension varies
            "corr_all": full.tolist(), "corr_high": high.tolist(),
            "curves_high": {str(a): high[a].tolist() for a in anchors},
            "mean_abs_offdiag_all": float(full[off].abs().nanmean()),
            "mean_abs_offdiag_high": float(high[off].abs().nanmean()),
        }
    return out


def plot_correlation(result: dict, path) -> Path:
    from poskit.report.figure import save_figure
    from poskit.report.plots import plt

    names = list(result["encodings"])
    fig, axes = plt.subplots(len(names), 3, figsize=(14, 4 * len(names)), squeeze=False)
    hf, dim = result["high_from"], result["dim"]
    for row, name in zip(axes, names):
        e = result["encodings"][name]
        for ax, key, what in ((row[0], "corr_all", f"all {dim} dims"), (row[1], "corr_high", f"dims {hf}..{dim - 1}")):
            im = ax.imshow(torch.tensor(e[key]).numpy(), vmin=-1, vmax=1, cmap="RdBu_r", interpolation="nearest")
            ax.set(title=f"{name}: position correlation, {what}", xlabel="position m", ylabel="position n")
            fig.colorbar(im, ax=ax, fraction=0.046)
        for a, curve in e["curves_high"].items():
            row[2].plot(curve, label=f"n = {a}")
        row[2].set(title=f"{name}: Corr(p_n, p_m) over dims {hf}..{dim - 1}", xlabel="position m",
                   ylabel="correlation", ylim=(-1.05, 1.05))
        row[2].legend(fontsize=7)
    return save_figure(fig, path, dpi=100)


def write_correlation(out_dir, encodings: list[str], **kw) -> dict:
    """Compute `position_correlation(encodings, **kw)`; write its JSON and PNG in `out_dir`."""
    out_dir = checked_out_dir(out_dir)
    result = position_correlation(encodings, **kw)
    return write_result(out_dir, result, CORRELATION_JSON, plot_correlation, CORRELATION_PNG)
