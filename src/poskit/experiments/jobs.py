"""Job functions run in worker processes (top-level, so that "spawn" can pickle them by name)."""
from __future__ import annotations

import json
from pathlib import Path

from poskit.train import RESULTS_FILE, TrainConfig, load_run, train


def train_job(config: dict, run_dir: str, resume: bool = False, quiet: bool = True,
              extrapolation: dict | None = None) -> dict:
    """Train one run (or reuse its results when resuming a finished run); optionally follow with a
    length-extrapolation sweep `extrapolation` = {"lengths": [...], "split", "n_chars", "last_fraction"}.
    Returns {"results": ..., "sweep": [...] or None, "run_dir": ...}."""
    # resuming a finished run with the same config returns its saved results without retraining (train())
    results = train(TrainConfig.from_dict(config), run_dir, resume=resume, quiet=quiet)
    sweep = None
    if extrapolation is not None:
        sweep = extrapolation_job(str(run_dir), **extrapolation)["sweeps"]["as-is"]
    return {"results": results, "sweep": sweep, "run_dir": str(run_dir)}


def extrapolation_job(run_dir: str, lengths: list[int], split: str = "test", n_chars: int | None = None,
                      last_fraction: float = 0.25, scalings: tuple[str, ...] = ()) -> dict:
    """Evaluate one trained LM at every window length, as trained and with each test-time rope scaling
    (rope models only). Returns {"run_dir", "encoding", "context", "steps", "sweeps": {variant: rows}}."""
    from poskit.evaluate import evaluate_lengths

    model, task, cfg = load_run(run_dir)
    context = task.max_input_len
    variants: dict = {"as-is": None}
    if cfg.model.encoding == "rope":
        variants.update({s: s for s in scalings})
    sweeps = {name: evaluate_lengths(model, task, lengths, context=context, split=split, n_chars=n_chars,
                                     last_fraction=last_fraction, scaling=scaling)
              for name, scaling in variants.items()}
    results_path = Path(run_dir) / RESULTS_FILE
    steps = json.loads(results_path.read_text())["steps"] if results_path.exists() else None
    return {"run_dir": str(run_dir), "encoding": cfg.model.encoding, "seed": cfg.seed, "context": context,
            "steps": steps, "sweeps": sweeps}
