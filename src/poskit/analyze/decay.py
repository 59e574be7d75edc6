"""RoPE's long-term decay (RoFormer, App. C, Fig. 3), from the encoding's declared frequencies, beside the same
decay measured on poskit's own attention logits.

Bound: with h_i = q_[2i:2i+1] k_[2i:2i+1]^* and S_j = sum_{i<j} exp(i r theta_i) (r the relative distance), Abel
summation gives |sum_i h_i exp(i r theta_i)| <= (max_i |h_{i+1} - h_i|) sum_{j=1}^{C} |S_j|; the paper plots the
"relative upper bound" (1/C) sum_{j=1}^{C} |S_j| against r. It only needs the frequencies, so any encoding that
declares frequency components (`component_frequencies`) gets one (PoPE's logit has the same complex form).

Measured: poskit.attention_scores between a query and a key that hold the same random content x ~ N(0, I) at
relative distance r, |logit(r)| averaged over `samples` draws. Both curves are also given divided by their value
at r = 0, the shape the figure compares.
"""
from __future__ import annotations

from pathlib import Path

import torch

import poskit
from poskit.util.validate import check_int

from .output import checked_out_dir, write_result

DECAY_JSON, DECAY_PNG = "decay.json", "decay.png"


def relative_upper_bound(frequencies: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """(1/C) sum_{j=1}^{C} |S_j(r)|, S_j(r) = sum_{i<j} exp(i r theta_i), for each r of `distances`; float64."""
    theta = frequencies.to(torch.float64)
    phase = distances.to(torch.float64)[:, None] * theta[None, :]  # (R, C)
    partial = torch.cumsum(torch.polar(torch.ones_like(phase), phase), dim=1)  # S_1..S_C, (R, C)
    return partial.abs().mean(dim=1)


def measured_logits(name: str, distances: torch.Tensor, head_dim: int, samples: int, seed: int = 0,
                    options: dict | None = None) -> torch.Tensor:
    """Mean over `samples` random contents x of |logit| between a query and a key both holding x, at every
    relative distance of `distances` (float64, one head, poskit.attention_scores with its default scale)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # learned parameters' initial values (pope's delta init), reproducibly
    enc = poskit.build_encoding(name, head_dim=head_dim, num_heads=1, **(options or {})).double()
    x = torch.randn(samples, 1, 1, head_dim, dtype=torch.float64, generator=gen)
    far = int(distances.max())
    keys = (far - distances).flip(0)  # increasing key positions (CoPE-style encodings need it; harmless here)
    k = x.expand(samples, 1, len(distances), head_dim)
    row = poskit.attention_scores(x, k, enc, q_positions=torch.tensor([far]), k_positions=keys, is_causal=True)
    return row[:, 0, 0].flip(-1).abs().mean(0)  # (R,), back in the order of `distances`


def decay_curves(encodings: list[str], head_dim: int = 128, max_distance: int = 256, samples: int = 256,
                 seed: int = 0) -> dict:
    """For each encoding name: the relative upper bound (if it declares frequencies) and the measured mean |logit|
    at relative distances 0..max_distance, raw and divided by the value at 0."""
    check_int(head_dim, "head_dim", minimum=2)
    check_int(max_distance, "max_distance", minimum=1)
    check_int(samples, "samples", minimum=1)
    known = poskit.available_encodings()
    if not encodings or any(e not in known for e in encodings):
        raise ValueError(f"encodings must name encodings from {known}, got {encodings!r}")
    distances = torch.arange(max_distance + 1)
    curves = {}
    for name in encodings:
        probe = poskit.build_encoding(name, head_dim=head_dim, num_heads=1, dim=head_dim)
        if probe.kind not in ("qk", "bias", "contextual", "none"):
            raise ValueError(f"encodings must act inside attention (kind qk, bias, contextual or none); {name!r} "
                             f"is {probe.kind!r}: it changes the embeddings, not the logits")
        entry = {}
        freqs = probe.component_frequencies()
        if freqs is not None:
            bound = relative_upper_bound(freqs, distances)
            entry["upper_bound"], entry["upper_bound_relative"] = bound.tolist(), (bound / bound[0]).tolist()
        logits = measured_logits(name, distances, head_dim, samples, seed)
        entry["mean_abs_logit"] = logits.tolist()
        entry["mean_abs_logit_relative"] = (logits / logits[0]).tolist() if logits[0] != 0 else None
        curves[name] = entry
    return {"head_dim": head_dim, "samples": samples, "seed": seed, "distances": distances.tolist(),
            "curves": curves}


def plot_decay(result: dict, path) -> Path:
    from poskit.report.figure import save_figure
    from poskit.report.plots import color, plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    r = result["distances"]
    for name, c in result["curves"].items():
        if "upper_bound" in c:
            ax1.plot(r, c["upper_bound"], label=name, color=color(name))
            ax2.plot(r, c["upper_bound_relative"], label=f"{name}: bound", color=color(name))
        if c["mean_abs_logit_relative"] is not None:
            ax2.plot(r, c["mean_abs_logit_relative"], label=f"{name}: measured |logit|", color=color(name),
                     linestyle=":")
    ax1.set(xlabel="relative distance", ylabel="relative upper bound (1/C) sum |S_j|",
            title=f"long-term decay bound (head dim {result['head_dim']})")
    ax2.set(xlabel="relative distance", ylabel="value / value at distance 0",
            title=f"bound vs poskit logits (q = k = x, mean of {result['samples']} x)")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


def write_decay(out_dir, encodings: list[str], **kw) -> dict:
    """Compute `decay_curves(encodings, **kw)`; write its JSON and PNG in `out_dir`."""
    out_dir = checked_out_dir(out_dir)
    result = decay_curves(encodings, **kw)
    return write_result(out_dir, result, DECAY_JSON, plot_decay, DECAY_PNG)
