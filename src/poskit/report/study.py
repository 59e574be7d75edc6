"""The table (study.md) and learning curves (study.png) of a `poskit study`, from its run directories alone.

Finished runs report their outcome (study.json: why they stopped, steps, wall time, accuracy per split);
runs still training or waiting appear with their curve so far, marked as such, so the report can be written
at any time while the study runs.
"""
from __future__ import annotations

import math
from pathlib import Path

from poskit.training.files import read_json, read_metrics

from .figure import save_figure
from .plots import color, plt

OUTCOME_FILE = "study.json"  # a finished study run's outcome, in its run directory
STUDY_MD = "study.md"
STUDY_PNG = "study.png"


def run_log(run_dir) -> list[dict]:
    """A run's metrics log (empty before its first line)."""
    return read_metrics(run_dir) if (Path(run_dir) / "metrics.jsonl").exists() else []


def curve_of(log: list[dict], split: str = "validation") -> list[tuple[int, float]]:
    """[(step, accuracy)] of the periodic evaluations in a metrics log."""
    return [(m["step"], m["accuracy"]) for m in log if m.get("split") == split and "accuracy" in m]


def validation_curve(run_dir, split: str = "validation") -> list[tuple[int, float]]:
    """[(step, accuracy)] of a run's periodic evaluations."""
    return curve_of(run_log(run_dir), split)


def training_seconds(log: list[dict]) -> float | None:
    """The training seconds of a log's last logged step (the trainer's "elapsed", kept across resumes)."""
    return max((m["elapsed"] for m in log if "elapsed" in m), default=None)



def outcome(run_dir) -> dict | None:
    path = Path(run_dir) / OUTCOME_FILE
    return read_json(path, "a study run's outcome") if path.exists() else None



def _row(study, run, out_dir) -> dict:
    run_dir = Path(out_dir) / run.name
    cfg = run.config
    o = outcome(run_dir)
    log = [] if o else run_log(run_dir)
    curve = o["curve"] if o else curve_of(log)
    row = {"group": run.group or run.name, "encoding": cfg["model"]["encoding"], "seed": cfg.get("seed", 0),
           "model": "d{d_model} L{n_layers} H{n_heads}".format(**cfg["model"]),
           "curve": [tuple(p) for p in curve]}
    if o:
        acc = o["splits"].get(study.metric_split, {}).get("accuracy")
        row.update(status=o["stop"], steps=o["steps"], seconds=o["train_seconds"], accuracy=acc)
    else:  # a run still training (or stopped between runner starts): its training time so far
        row.update(status="running" if curve else "waiting", steps=curve[-1][0] if curve else 0,
                   seconds=training_seconds(log) if curve else None, accuracy=None)
    row["best_validation"] = max((v for _, v in curve), default=None)
    return row


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def write_study_report(study, out_dir) -> list[Path]:
    """Write <out_dir>/study.md and study.png; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [_row(study, r, out_dir) for r in study.runs]
    lines = [f"Question: {study.question}.", "",
             f"Stop rule: learned at {study.rule.learned_at:.0%} validation accuracy; plateaued when the best "
             f"value has not risen by {study.rule.min_gain:.2f} in {study.rule.patience} evaluations (from step "
             f"{study.rule.min_steps}).", "",
             f"| group | model | encoding | seed | status | steps | train time | best validation | "
             f"{study.metric_split} accuracy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        minutes = None if r["seconds"] is None else r["seconds"] / 60
        lines.append(f"| {r['group']} | {r['model']} | {r['encoding']} | {r['seed']} | {r['status']} | {r['steps']} "
                     f"| {_fmt(minutes, '.0f')} min | {_fmt(r['best_validation'], '.3f')} | "
                     f"{_fmt(r['accuracy'], '.3f')} |")
    md = out_dir / STUDY_MD
    md.write_text("\n".join(lines) + "\n")

    groups = list(dict.fromkeys(r["group"] for r in rows))
    cols = min(3, len(groups))
    nrows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax, group in zip(axes.flat, groups):
        for r in (r for r in rows if r["group"] == group):
            if r["curve"]:
                steps, values = zip(*r["curve"])
                ax.plot(steps, values, label=f"{r['encoding']} s{r['seed']} ({r['status']})",
                        color=color(r["encoding"]), alpha=1.0 if r["seed"] == 0 else 0.6)
        ax.axhline(study.rule.learned_at, color="#999999", lw=0.8, ls="--")
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("validation accuracy")
        ax.set_ylim(0, 1)
        if any(not line.get_label().startswith("_") for line in ax.lines):  # a run has a curve (not just the 90 % line)
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    png = save_figure(fig, out_dir / STUDY_PNG, dpi=110)
    return [md, png]
