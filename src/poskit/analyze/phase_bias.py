"""How PoPE's phase bias moves over training, beside the task's metric (`poskit analyze phase-bias RUN...`).

The trainer records every encoding's statistics beside each evaluation (metrics.jsonl records
{"step", "encoding": {module: statistics}}; PositionalEncoding.statistics). This analysis reads them from trained
runs, averages PoPE's over the layers, and puts them beside the validation metric of the same step, one curve
per run and one colour per encoding spec (the label of the run's encoding and options), so that runs trained
under the two phase-bias rules (clamp alone, projected) and without a phase bias can be compared over training.
"""
from __future__ import annotations

from pathlib import Path

from poskit.encodings.spec import EncodingSpec
from poskit.training.files import load_config, read_metrics

from .output import checked_out_dir, write_result

PHASE_BIAS_JSON, PHASE_BIAS_PNG = "phase_bias.json", "phase_bias.png"
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
    return {"metric": metric, "groups": groups}


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
    return write_result(out_dir, phase_bias_curves(run_dirs, metric), PHASE_BIAS_JSON, plot_phase_bias,
                        PHASE_BIAS_PNG)
