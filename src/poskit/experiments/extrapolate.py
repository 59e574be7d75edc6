"""`poskit extrapolate`: perplexity of trained LMs at windows longer than their training context."""
from __future__ import annotations

from pathlib import Path

from poskit.evaluate import ROPE_SCALINGS, parse_lengths
from poskit.report import extrapolation_table, plot_extrapolation
from poskit.tasks import task_split_names
from poskit.training import CONFIG_FILE, atomic_write_json, build_task_for, check_writable_dir, load_config

from .jobs import ExtrapolationJob, extrapolation_job
from .outputs import EXTRAPOLATION_JSON, EXTRAPOLATION_MD, EXTRAPOLATION_PLOT
from .parallel import check_workers, run_parallel


def _context_of(run_dir: Path) -> int:
    if not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"runs must be `poskit train` run directories (with {CONFIG_FILE}), got {str(run_dir)!r}")
    cfg = load_config(run_dir)  # checked: a bad config.json is an error naming it
    task = build_task_for(cfg)
    # a language-model task declares its long evaluation windows (shakespeare, the corpus tasks lm-*)
    if not callable(getattr(task, "eval_windows", None)):
        raise ValueError(f"runs must be language-model runs (a task with eval_windows: shakespeare, corpus, lm-*), "
                         f"{str(run_dir)!r} is {cfg.task!r}")
    return task.max_input_len


def sweep_labels(results: list[dict]) -> dict[str, list[dict]]:
    """Label each (run, variant) sweep: the encoding name; + the seed where encodings repeat; the run directory
    instead where encoding and seed both repeat, so that every run keeps its own rows; + the rope variant."""
    names = [r["encoding"] for r in results]
    keys = [(r["encoding"], r["seed"]) for r in results]
    out = {}
    for r in results:
        if names.count(r["encoding"]) == 1:
            base = r["encoding"]
        elif keys.count((r["encoding"], r["seed"])) == 1:
            base = f"{r['encoding']} seed {r['seed']}"
        else:
            base = f"{r['encoding']} ({r['run_dir']})"
        for variant, rows in r["sweeps"].items():
            out[base if variant == "as-is" else f"{base}+{variant}"] = rows
    return out


def run_extrapolate(run_dirs: list, lengths: str = "1x,2x,4x,8x", *, scalings: tuple[str, ...] = (),
                    out_dir=None, split: str = "test", n_chars: int | None = None, last_fraction: float = 0.25,
                    workers: int | None = None, quiet: bool = False) -> dict:
    """Evaluate each run at every length ("Nx" = N times that run's training context); write
    extrapolation.{json,md,png} to out_dir (default: the first run's parent directory)."""
    if not run_dirs:
        raise ValueError("runs must list at least one run directory")
    check_workers(workers)
    if split not in task_split_names("shakespeare"):  # the held-out splits every language-model task has
        raise ValueError(f"split must be one of {list(task_split_names('shakespeare'))}, got {split!r}")
    if n_chars is not None and (isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 2):
        raise ValueError(f"n_chars must be an int >= 2 or unset (all), got {n_chars!r}")
    for s in scalings:
        if s not in ROPE_SCALINGS:
            raise ValueError(f"rope scaling must be one of {list(ROPE_SCALINGS)}, got {s!r}")
    run_dirs = [Path(d) for d in run_dirs]
    resolved = [d.resolve() for d in run_dirs]
    repeated = sorted({str(d) for d, r in zip(run_dirs, resolved) if resolved.count(r) > 1})
    if repeated:
        raise ValueError(f"runs must not repeat (each run is one row), got {repeated} more than once")
    out_dir = Path(out_dir) if out_dir is not None else run_dirs[0].parent
    check_writable_dir(out_dir, "out")  # before the evaluation, not after it
    contexts = [_context_of(d) for d in run_dirs]
    jobs = [ExtrapolationJob(str(d), parse_lengths(lengths, c), split, n_chars, last_fraction, tuple(scalings))
            for d, c in zip(run_dirs, contexts)]
    results = run_parallel(extrapolation_job, jobs, workers=workers, labels=[str(d) for d in run_dirs], quiet=quiet)
    sweeps = sweep_labels(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"split": split, "n_chars": n_chars, "last_fraction": last_fraction, "runs": results, "sweeps": sweeps}
    atomic_write_json(out_dir / EXTRAPOLATION_JSON, report)
    context = contexts[0] if len(set(contexts)) == 1 else None
    md = ("# zero-shot length extrapolation\n\nperplexity per token (character or corpus token), all positions:\n\n"
          + extrapolation_table(sweeps, "perplexity")
          + f"\n\nlast {last_fraction:g} of each window:\n\n" + extrapolation_table(sweeps, "last_perplexity") + "\n")
    (out_dir / EXTRAPOLATION_MD).write_text(md)
    plot_extrapolation(sweeps, out_dir / EXTRAPOLATION_PLOT, context=context)
    report["table"] = md
    return report
