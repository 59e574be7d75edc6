"""Job records and the functions run in worker processes (top-level, so that "spawn" can pickle them by name)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from poskit.training import RESULTS_FILE, TrainConfig, load_run, train
from poskit.training.files import read_results


@dataclass(frozen=True)
class ExtrapolationJob:
    """Evaluate one trained LM at several window lengths."""

    run_dir: str
    lengths: list
    """Window lengths in tokens."""
    split: str = "test"
    n_chars: int | None = None
    """Evaluate on the first n_chars characters of the split (None: all)."""
    last_fraction: float = 0.25
    """The last_perplexity column covers this last fraction of each window."""
    scalings: tuple = ()
    """Test-time rope scalings to evaluate as well (rope models only)."""


@dataclass(frozen=True)
class TrainJob:
    """Train one run (or reuse its results when resuming a finished run), optionally followed by a
    length-extrapolation sweep of the trained model (`extrapolation`, whose run_dir is this job's)."""

    config: dict
    """TrainConfig fields (a dict: it crosses the process boundary as plain data)."""
    run_dir: str
    resume: bool = False
    quiet: bool = True
    extrapolation: ExtrapolationJob | None = None


@dataclass(frozen=True)
class TrainOutcome:
    results: dict
    """The run's results.json."""
    sweep: list | None
    """The extrapolation sweep's rows, as trained (None without an extrapolation)."""
    run_dir: str


def train_job(job: TrainJob) -> TrainOutcome:
    # resuming a finished run with the same config returns its saved results without retraining (train())
    results = train(TrainConfig.from_dict(job.config), job.run_dir, resume=job.resume, quiet=job.quiet)
    sweep = None
    if job.extrapolation is not None:
        sweep = extrapolation_job(job.extrapolation)["sweeps"]["as-is"]
    return TrainOutcome(results, sweep, str(job.run_dir))


def takes_rope_scaling(model) -> bool:
    """Whether the test-time rope scalings apply to `model`: its encodings declare an unscaled rotation (the
    `scaling` option of the rope family is "none"; a model trained with a scaled variant keeps its own)."""
    return all(getattr(enc, "scaling", None) == "none" for enc in model.encoding_modules())


def extrapolation_job(job: ExtrapolationJob) -> dict:
    """Evaluate one trained LM at every window length, as trained and with each test-time rope scaling
    (rope models only). Returns {"run_dir", "encoding", "seed", "context", "steps", "sweeps": {variant: rows}}
    (a dict: it goes into extrapolation.json as it is)."""
    from poskit.evaluate import evaluate_lengths

    model, task, cfg = load_run(job.run_dir)
    context = task.max_input_len
    variants: dict = {"as-is": None}
    if takes_rope_scaling(model):
        variants.update({s: s for s in job.scalings})
    sweeps = {name: evaluate_lengths(model, task, job.lengths, context=context, split=job.split,
                                     n_chars=job.n_chars, last_fraction=job.last_fraction, scaling=scaling)
              for name, scaling in variants.items()}
    results_path = Path(job.run_dir) / RESULTS_FILE
    steps = read_results(results_path)["steps"] if results_path.exists() else None
    return {"run_dir": str(job.run_dir), "encoding": cfg.model.encoding, "seed": cfg.seed, "context": context,
            "steps": steps, "sweeps": sweeps}
