"""How PoPE's phase bias moves over training, beside the task's metric (`poskit analyze phase-bias RUN...`).

The trainer records every encoding's statistics beside each evaluation (metrics.jsonl records
{"step", "encoding": {module: statistics}}; PositionalEncoding.statistics). This analysis reads them from trained
runs, averages PoPE's over the layers, and puts them beside the validation metric of the same step, one curve
per run and one colour per encoding spec (the label of the run's encoding and options), so that runs trained
under the two phase-bias rules (clamp alone, projected) and without a phase bias can be compared over training.
"""
from __future__ import annotations

from pathlib import Path

import statistics

from poskit.encodings.spec import EncodingSpec
from poskit.training.files import RESULTS_FILE, load_config, read_metrics, read_results

from .output import checked_out_dir, write_result

PHASE_BIAS_JSON, PHASE_BIAS_PNG, PHASE_BIAS_MD = "phase_bias.json", "phase_bias.png", "phase_bias.md"
STATISTICS = ("delta_at_zero", "delta_inside", "delta_mean")


def _layer_mean(record: dict, key: str) -> float | None:
    values = [stats[key] for stats in record["encoding"].values() if key in stats]
    return sum(values) / len(values) if values else None


def run_curves(run_dir, metric: str) -> dict:
    """One run's curves: the validation `metric` and the layer means of PoPE's statistics at each step that has
    both an evaluation and the statistics."""
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    log = read_metrics(run_dir)
    evaluations = {r["step"]: r[metric] for r in log if r.get("split") == cfg.eval_split and metric in r}
    stats = {r["step"]: r for r in log if "encoding" in r}
    steps = sorted(set(evaluations) & set(stats))
    curves = {"run_dir": str(run_dir), "seed": cfg.seed, "steps": steps,
              metric: [evaluations[s] for s in steps]}
    for key in STATISTICS:
        curves[key] = [_layer_mean(stats[s], key) for s in steps]
    # the finished run's held-out result (None while it trains): what the rules are compared on
    final = (read_results(run_dir / RESULTS_FILE)["splits"] if (run_dir / RESULTS_FILE).exists() else {})
    curves["final"] = {split: values[metric] for split, values in final.items() if metric in values}
    return {"label": EncodingSpec.from_config(cfg.model.encoding, cfg.model.encoding_options).label, **curves}


def phase_bias_curves(run_dirs, metric: str = "accuracy") -> dict:
    """{"metric", "groups": {label: [run curves]}} for every run directory (each a trained PoPE run whose log
    holds encoding statistics: written by poskit's trainer)."""
    if not run_dirs:
        raise ValueError("runs must name at least one run directory of a trained pope run")
    groups: dict[str, list] = {}
    for d in run_dirs:
        curves = run_curves(d, metric)
        if not curves["steps"]:
            raise ValueError(f"run {str(d)!r} logged no phase-bias statistics beside its evaluations of {metric!r}: "
                             "a pope run with a phase bias, trained by this version of poskit, is needed")
        groups.setdefault(curves.pop("label"), []).append(curves)
    return {"metric": metric, "groups": groups, "summary": summarize(groups, metric)}


def summarize(groups: dict, metric: str, split: str = "test") -> dict:
    """Per encoding spec, over its finished runs: the `split` metric per seed, its mean and sample standard
    deviation, and the share of delta's entries at 0 at the end (layer mean) per seed."""
    summary = {}
    for label, runs in groups.items():
        done = sorted((r for r in runs if split in r["final"]), key=lambda r: r["seed"])
        values = [r["final"][split] for r in done]
        summary[label] = {"split": split, "seeds": [r["seed"] for r in done], metric: values,
                          "mean": statistics.fmean(values) if values else None,
                          "std": statistics.stdev(values) if len(values) > 1 else None,
                          "delta_at_zero": [r["delta_at_zero"][-1] for r in done]}
    return summary


def summary_table(result: dict) -> str:
    """The summary as a markdown table (the metric in percent when it is an accuracy)."""
    metric = result["metric"]
    scale = 100 if "accuracy" in metric else 1
    lines = [f"| encoding | runs | {metric} (mean ± std) | per seed | delta's entries at 0 at the end, per seed |",
             "|---|---|---|---|---|"]
    for label, s in result["summary"].items():
        if not s["seeds"]:
            continue
        mean = f"{s['mean'] * scale:.2f}" + (f" ± {s['std'] * scale:.2f}" if s["std"] is not None else "")
        per_seed = ", ".join(f"{seed}: {v * scale:.1f}" for seed, v in zip(s["seeds"], s[metric]))
        at_zero = ", ".join(f"{v:.2f}" for v in s["delta_at_zero"])
        lines.append(f"| {label} | {len(s['seeds'])} | {mean} | {per_seed} | {at_zero} |")
    return "\n".join(lines) + "\n"


def plot_phase_bias(result: dict, path: Path) -> Path:
    """Three panels against step: the metric, the share of delta's entries on the bound 0, delta's mean; one
    colour per encoding spec, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from poskit.report.figure import save_figure

    metric = result["metric"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    titles = (f"validation {metric}", "share of delta's entries at 0 (layer mean)", "mean clamped delta (layer mean)")
    for i, (label, runs) in enumerate(result["groups"].items()):
        colour = f"C{i}"
        for j, run in enumerate(runs):
            for ax, key in zip(axes, (metric, "delta_at_zero", "delta_mean")):
                ax.plot(run["steps"], run[key], color=colour, alpha=0.8, lw=1.2, label=label if j == 0 else None)
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path, dpi=110)


def write_phase_bias(run_dirs, out_dir, metric: str = "accuracy") -> dict:
    out_dir = checked_out_dir(out_dir)
    result = write_result(out_dir, phase_bias_curves(run_dirs, metric), PHASE_BIAS_JSON, plot_phase_bias,
                          PHASE_BIAS_PNG)
    (out_dir / PHASE_BIAS_MD).write_text(summary_table(result))
    return result
