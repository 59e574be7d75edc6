"""Seeds -> mean and standard deviation; metrics logs -> learning curves."""
from __future__ import annotations

import json
import math
from pathlib import Path

from poskit.training import RESULTS_FILE, read_metrics


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
        results = [json.loads((Path(d) / RESULTS_FILE).read_text()) for d in dirs]
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


def learning_curves(dirs: list[Path], metric: str) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std) of the periodic evaluation `metric` over the seeds' metrics logs (steps common to all)."""
    per_run = []
    for d in dirs:
        per_run.append({m["step"]: m[metric] for m in read_metrics(d) if "split" in m and metric in m})
    common = sorted(set.intersection(*(set(r) for r in per_run))) if per_run else []
    means, stds = [], []
    for s in common:
        mu, sd = mean_std([r[s] for r in per_run])
        means.append(mu)
        stds.append(sd)
    return common, means, stds
