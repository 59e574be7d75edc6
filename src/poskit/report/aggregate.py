"""Seeds -> mean and standard deviation; metrics logs -> learning curves."""
from __future__ import annotations

import math
from pathlib import Path

from poskit.training import RESULTS_FILE, read_metrics
from poskit.training.files import read_results


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0.0 for a single value)."""
    if not values:
        raise ValueError("values must be a non-empty list")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def _summary(values: list[float]) -> dict:
    mean, std = mean_std(values)
    return {"mean": mean, "std": std, "per_seed": values}


def aggregate_compare(runs: dict[str, list[Path]], split: str = "test") -> dict:
    """`runs`: encoding -> run directories (one per seed, each holding results.json).

    Returns the compare schema {"task", "metric", "split", "encodings": {name: {"mean", "std", "per_seed",
    "splits": {split: {"mean", "std", "per_seed"}}, "steps", "train_seconds"}}}; the headline numbers are the
    task's metric on `split`.
    """
    out: dict = {"task": None, "metric": None, "split": split, "encodings": {}}
    for enc, dirs in runs.items():
        results = [read_results(Path(d) / RESULTS_FILE) for d in dirs]
        if not results:
            raise ValueError(f"no runs for encoding {enc!r}")
        task, metric = results[0]["task"], results[0]["metric"]
        if out["task"] not in (None, task) or out["metric"] not in (None, metric):
            raise ValueError(f"runs must share one task and metric, got {out['task']}/{out['metric']} and {task}/{metric}")
        out["task"], out["metric"] = task, metric
        if split not in results[0]["splits"]:
            raise ValueError(f"split must be one of {sorted(results[0]['splits'])}, got {split!r}")
        entry = _summary([r["splits"][split][metric] for r in results])
        entry["seeds"] = [r["seed"] for r in results]
        entry["splits"] = {s: _summary([r["splits"][s][metric] for r in results]) for s in results[0]["splits"]}
        entry["steps"] = [r["steps"] for r in results]
        entry["train_seconds"] = [r["train_seconds"] for r in results]
        out["encodings"][enc] = entry
    return out


def _numbers(values: dict) -> dict:
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def run_measurement(results: dict, run_dir, out_dir) -> dict:
    """One run's entry in a results record's measurements: its seed, its directory relative to the output
    directory, steps, training time and every numeric metric of every split."""
    from .record import relative_to

    return {"seed": results.get("seed"), "run": relative_to(run_dir, out_dir), "steps": results.get("steps"),
            "train_seconds": results.get("train_seconds"),
            "splits": {s: _numbers(m) for s, m in results.get("splits", {}).items() if isinstance(m, dict)}}


def compare_measurements(runs: dict[str, list[Path]], out_dir) -> dict[str, list[dict]]:
    """{label: [run_measurement, ...]} of a compare's run directories (each results.json read through the one
    checked reader)."""
    return {label: [run_measurement(read_results(Path(d) / RESULTS_FILE), d, out_dir) for d in dirs]
            for label, dirs in runs.items()}


def periodic_evaluations(log: list[dict], split: str | None = None) -> list[dict]:
    """The periodic evaluations of one metrics log on `split`; None: on the run's eval_split (the split every
    evaluation logs first, before its curve_splits)."""
    evaluations = [m for m in log if "split" in m and "step" in m]
    if split is None and evaluations:
        split = evaluations[0]["split"]
    return [m for m in evaluations if m["split"] == split]


def learning_curves(dirs: list[Path], metric: str, split: str | None = None) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std) of the periodic evaluation `metric` on `split` (None: the runs' eval_split) over the
    seeds' metrics logs (steps common to all)."""
    return _curve([read_metrics(d) for d in dirs], metric, split)


def split_learning_curves(dirs: list[Path], metric: str,
                          splits: list[str]) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """learning_curves for each of `splits`, reading each run's metrics log once."""
    logs = [read_metrics(d) for d in dirs]
    return {split: _curve(logs, metric, split) for split in splits}


def _curve(logs: list[list[dict]], metric: str, split: str | None) -> tuple[list[int], list[float], list[float]]:
    per_run = [{m["step"]: m[metric] for m in periodic_evaluations(log, split) if metric in m} for log in logs]
    common = sorted(set.intersection(*(set(r) for r in per_run))) if per_run else []
    means, stds = [], []
    for s in common:
        mu, sd = mean_std([r[s] for r in per_run])
        means.append(mu)
        stds.append(sd)
    return common, means, stds
