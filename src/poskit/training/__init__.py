"""Training a `poskit.model.Transformer` on a `poskit.tasks` task, reproducibly and resumably.

One run lives in one directory:

    config.json     the full TrainConfig (with max_steps resolved when a time budget was given)
    metrics.jsonl   one JSON object per line: {"step", "train_loss", "lr", "elapsed"} every log_every steps,
                    {"step", "split", <metrics>} after every evaluation
    checkpoint.pt   model, optimizer, step, torch/numpy/python (and, once CUDA is in use, CUDA) RNG states,
                    data-generator state (atomic)
    results.json    the final evaluation on every split of the task

Exact resume: everything random (initialisation, dropout, data) flows from `seed` through RNG states that are
saved in the checkpoint, evaluation draws no random numbers, and the metrics log is cut back to the
checkpoint's step on resume; a run killed and resumed ends with the same numbers as an uninterrupted one.
A resumed run keeps its saved config; the only change allowed is a larger max_steps (`resume_config`).

The package is split by concern: `config` (TrainConfig, its validation, resume rules), `files` (the run
directory's files, atomic writes, checked reads), `checkpoint` (a checkpoint read back and checked), `rng`
(seeding and RNG states), `step` (schedule, optimizer, loss, evaluation), `loop` (Trainer, time budget) and
`run` (train, load_run).
"""
from .config import LOSS_ON_ALLOWED, TrainConfig, loss_positions, resume_config
from .files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    RESULTS_FILE,
    RunFileError,
    atomic_write_bytes,
    atomic_write_json,
    check_writable_dir,
    load_config,
    read_metrics,
)
from .checkpoint import checkpoint_config, metrics_at_checkpoint, read_checkpoint
from .loop import Trainer, steps_for_budget
from .rng import rng_state, seed_everything, set_rng_state
from .run import load_run, preflight, train
from .step import (
    NonFiniteLossError,
    build_model,
    build_task_for,
    evaluate,
    loss_targets,
    lr_at,
    make_optimizer,
    optimizer_step,
    restrict_targets,
    restrict_to_last,
)

__all__ = ["CHECKPOINT_FILE", "CONFIG_FILE", "LOSS_ON_ALLOWED", "METRICS_FILE", "RESULTS_FILE",
           "NonFiniteLossError", "RunFileError", "TrainConfig", "Trainer", "atomic_write_bytes",
           "atomic_write_json", "build_model", "build_task_for", "check_writable_dir", "checkpoint_config",
           "evaluate", "load_config", "load_run", "loss_positions", "loss_targets", "lr_at", "make_optimizer",
           "metrics_at_checkpoint", "optimizer_step", "preflight", "read_checkpoint", "read_metrics",
           "restrict_targets", "restrict_to_last", "resume_config", "rng_state", "seed_everything",
           "set_rng_state", "steps_for_budget", "train"]
