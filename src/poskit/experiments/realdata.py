"""What a language-model reproduction adds to its compare: the NLL per token table (the papers' Tables 2-3
report NLL, not perplexity) and, where the reproduction declares one, a zero-shot length-extrapolation sweep of
the trained runs through `poskit extrapolate` (PoPE paper Fig. 2)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from poskit.evaluate import ROPE_SCALINGS, parse_lengths
from poskit.report import markdown_table, mean_std
from poskit.training import RESULTS_FILE, atomic_write_json, check_writable_dir
from poskit.training.files import read_results

from .outputs import COMPARE_JSON, COMPARE_MD, EXTRAPOLATION_DIR, EXTRAPOLATION_MD

__all__ = ["EXTRAPOLATION_DIR", "SweepPlan", "add_nll", "plan_sweep", "run_sweep"]


def _pm(values: list[float]) -> str:
    mean, std = mean_std(values)
    return f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} ± {std:.4f}"


def add_nll(results: dict, plan, out: Path) -> None:
    """Put the NLL per token of every split (mean, std and per seed, from each run's results.json `loss`) into
    `results["nll"]`, rewrite results.json, and append the NLL table to results.md."""
    nll, rows = {}, []
    splits = None
    for label, dirs in plan.dirs.items():
        runs = [read_results(Path(d) / RESULTS_FILE) for d in dirs]
        splits = splits or [plan.split] + [s for s in runs[0]["splits"] if s != plan.split]
        nll[label] = {}
        for s in splits:
            values = [r["splits"][s]["loss"] for r in runs]
            mean, std = mean_std(values)
            nll[label][s] = {"mean": mean, "std": std, "per_seed": values}
        rows.append([label] + [_pm(nll[label][s]["per_seed"]) for s in splits]
                    + [", ".join(f"{v:.4f}" for v in nll[label][plan.split]["per_seed"])])
    results["nll"] = nll
    atomic_write_json(out / COMPARE_JSON, results)
    table = markdown_table(["encoding"] + [f"{s} NLL per token" for s in splits] + ["per seed"], rows)
    with open(out / COMPARE_MD, "a") as f:
        f.write(f"\nNLL per token (nats; the metric of the PoPE paper's Tables 2-3), mean ± std over seeds:\n\n"
                f"{table}\n")


@dataclass(frozen=True)
class SweepPlan:
    run_dirs: list
    lengths: str
    scalings: tuple
    n_chars: int | None
    out_dir: Path
    workers: int | None


def plan_sweep(r, plan, out: Path, workers: int | None) -> SweepPlan:
    """Check the reproduction's extrapolation settings before anything trains; the sweep covers every run."""
    spec = r.extrapolation
    parse_lengths(spec["lengths"], 2)  # a bad length spec stops here, not after the training
    scalings = tuple(spec.get("scalings", ()))
    for s in scalings:
        if s not in ROPE_SCALINGS:
            raise ValueError(f"extrapolation scalings must be among {list(ROPE_SCALINGS)}, got {s!r}")
    out_dir = out / EXTRAPOLATION_DIR
    check_writable_dir(out_dir, "out")
    dirs = [str(d) for ds in plan.dirs.values() for d in ds]
    return SweepPlan(dirs, spec["lengths"], scalings, spec.get("n_chars"), out_dir, workers)


def run_sweep(sweep: SweepPlan, quiet: bool) -> dict:
    """`poskit extrapolate` over the trained runs; appends its tables to the reproduction's results.md."""
    from .extrapolate import run_extrapolate

    report = run_extrapolate(sweep.run_dirs, sweep.lengths, scalings=sweep.scalings, out_dir=sweep.out_dir,
                             n_chars=sweep.n_chars, workers=sweep.workers, quiet=quiet)
    with open(sweep.out_dir.parent / COMPARE_MD, "a") as f:
        f.write(f"\n{report['table']}\n(plot: {EXTRAPOLATION_DIR}/extrapolation.png; {EXTRAPOLATION_DIR}/"
                f"{EXTRAPOLATION_MD})\n")
    return {"dir": EXTRAPOLATION_DIR, "lengths": sweep.lengths, "scalings": list(sweep.scalings),
            "n_chars": sweep.n_chars, "sweeps": report["sweeps"]}
