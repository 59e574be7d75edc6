"""`poskit compare`: train every (encoding, seed) pair, then one results.json, a markdown table and a plot."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

from poskit.report import aggregate_compare, compare_table, learning_curves, plot_compare
from poskit.train import TrainConfig, atomic_write_json

from .jobs import train_job
from .parallel import run_parallel
from .specs import safe_label


def run_compare(base: TrainConfig, encodings: list[tuple[str, str, dict]], seeds: list[int], out_dir, *,
                workers: int | None = None, resume: bool = False, quiet: bool = False, split: str = "test",
                title: str | None = None) -> dict:
    """Train `base` once per encoding spec (label, name, options) and seed, in parallel single-thread
    processes; write out_dir/{results.json, results.md, compare.png}. Returns the results dict.

    The run of encoding `label` and seed s lives in out_dir/<label>/seed<s>; with `resume`, finished runs are
    reused and interrupted ones continue from their checkpoints."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs, labels, dirs = [], [], {}
    for label, name, options in encodings:
        for seed in seeds:
            cfg = copy.deepcopy(base)
            cfg.model.encoding, cfg.model.encoding_options, cfg.seed = name, dict(options), seed
            cfg = TrainConfig.from_dict(cfg.to_dict())  # re-validate with the new encoding
            run_dir = out_dir / safe_label(label) / f"seed{seed}"
            dirs.setdefault(label, []).append(run_dir)
            jobs.append({"config": cfg.to_dict(), "run_dir": str(run_dir), "resume": resume, "quiet": True})
            labels.append(f"{label} seed {seed}")
    if not quiet:
        print(f"compare: {base.task}, {len(jobs)} runs ({len(encodings)} encodings x {len(seeds)} seeds) "
              f"-> {out_dir}", file=sys.stderr, flush=True)
    run_parallel(train_job, jobs, workers=workers, labels=labels, quiet=quiet)
    results = aggregate_compare(dirs, split=split)
    results["seeds"] = list(seeds)
    results["config"] = base.to_dict()
    results["runs"] = {label: [str(d) for d in ds] for label, ds in dirs.items()}
    eval_metric = results["metric"]
    curves = {label: learning_curves(ds, eval_metric) for label, ds in dirs.items()}
    atomic_write_json(out_dir / "results.json", results)
    table = compare_table(results)
    (out_dir / "results.md").write_text(f"# {title or 'compare: ' + results['task']}\n\n{table}\n")
    plot_compare(results, curves, out_dir / "compare.png", title=title)
    return results
