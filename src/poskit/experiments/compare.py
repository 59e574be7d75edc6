"""`poskit compare`: train every (encoding, seed) pair, then one results.json, a markdown table and a plot.

The output directory is poskit's own (training/run_dir.py): checked before anything is written (a directory
that is not empty and not a compare directory is refused), then claimed and locked for the whole compare."""
from __future__ import annotations

import contextlib
import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from poskit.encodings.spec import EncodingSpec
from poskit.report import aggregate_compare, compare_table, plot_compare, plot_split_curves, split_learning_curves
from poskit.report.record import relative_to
from poskit.tasks import task_split_names
from poskit.training import (
    CONFIG_FILE,
    TrainConfig,
    atomic_write_json,
    check_writable_dir,
    load_config,
    preflight,
    resume_config,
)
from poskit.training.checkpoint_store import has_checkpoint
from poskit.training.distributed import processes_from_env
from poskit.training.run_dir import check, owned

from .jobs import TrainJob, train_job
from .outputs import COMPARE_JSON, COMPARE_MD, COMPARE_PLOT, CURVES_PLOT, is_legacy_compare, safe_label
from .parallel import check_workers, run_parallel


@dataclass
class ComparePlan:
    """The runs of one compare, laid out and checked but not started."""

    base: TrainConfig
    out_dir: Path
    split: str
    seeds: list[int]
    jobs: list[TrainJob]
    labels: list[str]
    dirs: dict[str, list[Path]]


def plan_compare(base: TrainConfig, encodings: list[EncodingSpec | str], seeds: list[int], out_dir, *,
                 workers: int | None = None, resume: bool = False, split: str = "test") -> ComparePlan:
    """Check everything a compare needs and lay out its runs, touching nothing on disk: a bad split, worker
    count, encoding option, task option, an existing run without `resume` or a resumed run whose saved config
    differs all stop here, before any directory exists or any model trains."""
    check_workers(workers)
    splits = task_split_names(base.task)
    if split not in splits:
        raise ValueError(f"split must be one of the splits of task {base.task!r}: {list(splits)}, got {split!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must list at least one seed, none twice (one run directory each), got {list(seeds)}")
    specs = [EncodingSpec.of(e) for e in encodings]
    names = [safe_label(s.label) for s in specs]
    if not specs or len(set(names)) != len(names):
        raise ValueError(f"encodings must list at least one spec, each with a directory of its own, got "
                         f"{[s.label for s in specs]}")
    out_dir = Path(out_dir)
    check_writable_dir(out_dir, "out")
    check(out_dir, "compare", legacy=is_legacy_compare)  # not empty and not a compare directory: refused here
    jobs, labels, dirs = [], [], {}
    for spec in specs:
        label = spec.label
        for i, seed in enumerate(seeds):
            cfg = copy.deepcopy(base)
            (cfg.model.encoding, cfg.model.encoding_options), cfg.seed = spec.to_config(), seed
            cfg = TrainConfig.from_dict(cfg.to_dict())  # re-validate with the new encoding
            if i == 0:
                preflight(cfg)  # the model does not depend on the seed: once per encoding
            run_dir = out_dir / safe_label(label) / f"seed{seed}"
            if has_checkpoint(run_dir):
                if not resume:
                    raise ValueError(f"out {str(out_dir)!r} already holds runs (e.g. {str(run_dir)!r}); "
                                     "resume them (--resume) or choose another output directory (--out)")
                resume_config(load_config(run_dir), cfg, str(run_dir / CONFIG_FILE))
            dirs.setdefault(label, []).append(run_dir)
            jobs.append(TrainJob(cfg.to_dict(), str(run_dir), resume=resume, quiet=True))
            labels.append(f"{label} seed {seed}")
    return ComparePlan(base, out_dir, split, list(seeds), jobs, labels, dirs)


@contextlib.contextmanager
def compare_dir(out_dir):
    """Own and lock a compare's output directory for the block (on the main process: under torchrun the other
    ranks train the same runs and leave the directory to rank 0)."""
    if not processes_from_env().is_main:
        yield Path(out_dir)
        return
    with owned(out_dir, "compare", legacy=is_legacy_compare) as directory:
        yield directory


def execute_compare(plan: ComparePlan, *, workers: int | None = None, quiet: bool = False,
                    title: str | None = None) -> dict:
    """Train the planned runs in parallel single-thread processes; write out_dir/{results.json, results.md,
    compare.png}, results.json as a results record (kind "compare", report/record.py). Returns the results dict.

    Under torchrun (several processes) the runs are trained one after another, each by all the processes
    together, and rank 0 alone writes the outputs (the other ranks return an empty dict)."""
    started = time.perf_counter()
    with compare_dir(plan.out_dir):
        results = train_and_report(plan, workers=workers, quiet=quiet, title=title)
        if results:
            from .evidence import compare_record

            arguments = {"base": plan.base.to_dict(), "encodings": list(plan.dirs), "seeds": plan.seeds}
            compare_record(plan.out_dir, results, plan.dirs, kind="compare", name=plan.base.task,
                           arguments=arguments, started=started, files=[COMPARE_MD, COMPARE_PLOT])
    return results


def train_and_report(plan: ComparePlan, *, workers: int | None = None, quiet: bool = False,
                     title: str | None = None) -> dict:
    """The work of a compare inside its owned directory: train, then results.json (the summary; the caller
    turns it into its results record), results.md and compare.png. Returns the summary ({} on ranks other
    than 0 under torchrun)."""
    out_dir, dirs = plan.out_dir, plan.dirs
    procs = processes_from_env()
    if procs.active:
        workers = 1
    if not quiet and procs.is_main:
        print(f"compare: {plan.base.task}, {len(plan.jobs)} runs ({len(dirs)} encodings x {len(plan.seeds)} "
              f"seeds) -> {out_dir}", file=sys.stderr, flush=True)
    run_parallel(train_job, plan.jobs, workers=workers, labels=plan.labels, quiet=quiet or not procs.is_main)
    if not procs.is_main:
        return {}
    results = aggregate_compare(dirs, split=plan.split)
    results["seeds"] = plan.seeds
    results["config"] = plan.base.to_dict()
    # run directories relative to the output directory: a results file holds no machine path
    results["runs"] = {label: [relative_to(d, out_dir) for d in ds] for label, ds in dirs.items()}
    eval_metric = results["metric"]
    # the learning curve of every periodically evaluated split is kept in the results (convergence is compared
    # from them, as the CoPE paper's Fig. 5 compares error every 500 steps)
    splits = [plan.base.eval_split, *plan.base.curve_splits]
    by_label = {label: split_learning_curves(ds, eval_metric, splits) for label, ds in dirs.items()}
    results["curves"] = {split: {label: dict(zip(("steps", "mean", "std"), by_label[label][split])) for label in dirs}
                         for split in splits}
    curves = {label: (c["steps"], c["mean"], c["std"]) for label, c in results["curves"][plan.base.eval_split].items()}
    atomic_write_json(out_dir / COMPARE_JSON, results)
    table = compare_table(results)
    (out_dir / COMPARE_MD).write_text(f"# {title or 'compare: ' + results['task']}\n\n{table}\n")
    plot_compare(results, curves, out_dir / COMPARE_PLOT, title=title)
    if plan.base.curve_splits:
        plot_split_curves(results, out_dir / CURVES_PLOT, title=title)
    return results


def run_compare(base: TrainConfig, encodings: list[EncodingSpec | str], seeds: list[int], out_dir, *,
                workers: int | None = None, resume: bool = False, quiet: bool = False, split: str = "test",
                title: str | None = None) -> dict:
    """Train `base` once per encoding spec (an EncodingSpec, or its text) and seed, in parallel single-thread
    processes; write out_dir/{results.json, results.md, compare.png}. Returns the results dict.

    The run of encoding spec `label` and seed s lives in out_dir/<label>/seed<s>; with `resume`, finished runs are
    reused and interrupted ones continue from their checkpoints (their saved configs must match, see
    `poskit.training.resume_config`). Everything is checked before anything is written (`plan_compare`)."""
    plan = plan_compare(base, encodings, seeds, out_dir, workers=workers, resume=resume, split=split)
    return execute_compare(plan, workers=workers, quiet=quiet, title=title)
