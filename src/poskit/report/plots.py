"""PNG plots (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from .aggregate import periodic_evaluations  # noqa: E402
from .figure import save_figure  # noqa: E402

# plain numbers on log axes (perplexities like 5, 7, 20 rather than 10^0.7)
_plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")

# fixed colours so an encoding looks the same in every plot
_COLORS = {"none": "#7f7f7f", "alibi": "#1f77b4", "rope": "#d62728", "pope": "#2ca02c", "cope": "#9467bd",
           "sinusoidal": "#8c564b", "learned": "#e377c2", "relative": "#bcbd22", "relative-capped": "#17becf",
           "cope-alibi": "#ff7f0e", "legendre": "#aec7e8"}


def color(name: str):
    return _COLORS.get(name.split()[0].split("+")[0].split(":")[0], None)  # "pope:delta_init=uniform" is pope


def plot_compare(results: dict, curves: dict[str, tuple[list, list, list]], path, title: str | None = None) -> Path:
    """Left: periodic validation metric vs step (mean ± std over seeds). Right: final metric per split with
    std error bars and the seeds as dots."""
    metric = results["metric"]
    encs = list(results["encodings"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for enc in encs:
        steps, mean, std = curves[enc]
        if steps:
            ax1.plot(steps, mean, label=enc, color=color(enc))
            ax1.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                             alpha=0.2, color=color(enc))
    ax1.set_xlabel("step")
    ax1.set_ylabel(f"validation {metric}")
    ax1.set_title("learning curves (mean ± std over seeds)")
    if metric == "perplexity":
        ax1.set_yscale("log")
        ax1.yaxis.set_major_formatter(_plain)
        ax1.yaxis.set_minor_formatter(_plain)
    ax1.legend()
    splits = list(results["encodings"][encs[0]]["splits"])
    width = 0.8 / len(encs)
    for i, enc in enumerate(encs):
        e = results["encodings"][enc]["splits"]
        xs = [j + (i - (len(encs) - 1) / 2) * width for j in range(len(splits))]
        ax2.bar(xs, [e[s]["mean"] for s in splits], width, yerr=[e[s]["std"] for s in splits], capsize=3,
                label=enc, color=color(enc), alpha=0.85)
        for x, s in zip(xs, splits):
            ax2.scatter([x] * len(e[s]["per_seed"]), e[s]["per_seed"], s=10, color="black", zorder=3)
    ax2.set_xticks(range(len(splits)))
    ax2.set_xticklabels(splits)
    ax2.set_ylabel(metric)
    ax2.set_title("final metric (bars: mean, whiskers: std, dots: seeds)")
    fig.suptitle(title or f"{results['task']}: {', '.join(encs)}")
    return save_figure(fig, path, dpi=120)


_VARIANT_STYLES = {"linear": "--", "ntk": "-.", "dynamic": (0, (1, 1)), "yarn": ":"}


LEGEND_INSIDE_MAX = 8  # lines a panel's own legend may list before it covers the curves


def plot_extrapolation(sweeps: dict[str, list[dict]], path, context: int | None = None, title: str | None = None) -> Path:
    """Perplexity vs evaluation window length, over all positions (left) and over the last quarter of each
    window (right), one line per model."""
    # many lines (models x test-time scalings x seeds): one legend beside the panels instead of one over each
    beside = len(sweeps) > LEGEND_INSIDE_MAX
    if beside:  # a third, empty panel holds the legend, so that the layout makes room for it
        fig, (*axes, legend_ax) = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [1, 1, 0.32]})
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    for ax, key, sub in ((axes[0], "perplexity", "all positions"), (axes[1], "last_perplexity", "last quarter of each window")):
        for label, rows in sweeps.items():
            # a test-time variant ("rope+yarn") keeps its model's colour with its own line style
            style = _VARIANT_STYLES.get(label.rsplit("+", 1)[-1], "-") if "+" in label else "-"
            ax.plot([r["length"] for r in rows], [r[key] for r in rows], marker="o", label=label, color=color(label),
                    linestyle=style)
        if context:
            ax.axvline(context, color="black", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        lengths = sorted({r["length"] for rows in sweeps.values() for r in rows})
        ax.set_xticks(lengths)
        ax.xaxis.set_major_formatter(_plain)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("evaluation window length (tokens)" + (f"; training context {context} (dotted)" if context else ""))
        ax.set_ylabel("perplexity per token (character or corpus token)")
        ax.set_title(sub)
        if not beside:
            ax.legend(loc="upper left")
    if beside:
        legend_ax.axis("off")
        legend_ax.legend(*axes[0].get_legend_handles_labels(), loc="center left", fontsize=8)
    fig.suptitle(title or "zero-shot length extrapolation")
    return save_figure(fig, path, dpi=120)


def plot_split_curves(results: dict, path, title: str | None = None) -> Path:
    """One panel per periodically evaluated split (results["curves"], experiments/compare.py): its metric
    against step, one line per encoding (mean ± std over seeds)."""
    metric, curves = results["metric"], results["curves"]
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4.2), squeeze=False)
    for ax, (split, by_label) in zip(axes[0], curves.items()):
        for label, c in by_label.items():
            if c["steps"]:
                ax.plot(c["steps"], c["mean"], label=label, color=color(label), marker="o", markersize=3)
                ax.fill_between(c["steps"], [m - s for m, s in zip(c["mean"], c["std"])],
                                [m + s for m, s in zip(c["mean"], c["std"])], alpha=0.15, color=color(label))
        ax.set_xlabel("step")
        ax.set_ylabel(f"{split} {metric}")
        ax.set_title(split)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title or f"{results['task']}: learning curves per split (mean ± std over seeds)")
    return save_figure(fig, path, dpi=120)


def plot_runs(runs: dict[str, list[dict]], path, metric: str = "accuracy", title: str | None = None) -> Path:
    """Training loss (left) and periodic evaluation `metric` (right) against step for single runs, from their
    metrics logs (`poskit.training.read_metrics`)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, log in runs.items():
        loss = [(m["step"], m["train_loss"]) for m in log if "train_loss" in m]
        ev = [(m["step"], m[metric]) for m in periodic_evaluations(log) if metric in m]
        if loss:
            ax1.plot(*zip(*loss), label=label, color=color(label), linewidth=0.8)
        if ev:
            ax2.plot(*zip(*ev), label=label, color=color(label), marker="o", markersize=3)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss")
    ax2.set_xlabel("step")
    ax2.set_ylabel(f"validation {metric}")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title or "training runs")
    return save_figure(fig, path, dpi=120)
