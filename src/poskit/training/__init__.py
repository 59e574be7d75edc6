"""Training any poskit model reproducibly and resumably: one `Trainer` (loop.py) and one run lifecycle
(run.py), with a recipe per kind of run (recipes/: the language model, translation, the ViT digits, the GLUE
fine-tune).

One run lives in one directory:

    .poskit.json    the marker: poskit wrote this directory, a "run" (run_dir.py; other commands' directories
                    carry their own kind); .poskit.lock is its lock, held by the one process writing it
    config.json     the recipe's full config (a TrainConfig for the language model; max_steps resolved when a
                    time budget was given)
    metrics.jsonl   one JSON object per line: {"step", "train_loss", "lr", "elapsed"} every log_every steps,
                    {"step", "split", <metrics>} after every evaluation
    checkpoint.json the commit record of the latest checkpoint: its step, world_size, directory, the run it
                    belongs to (task, encoding, seed, code version), and the size and SHA-256 of each of its
                    files (checkpoint_store.py)
    checkpoints/step-<step>-<id>/
                    model.safetensors (weights), model_config.json (their config), training_state.pt
                    (optimizer, step, torch/numpy/python (and, once CUDA is in use, CUDA) RNG states of every
                    rank, the data stream's position)
    results.json    the final results (the recipe's results file), checked against config.json and
                    checkpoint.json whenever it is read (files.read_results)
    tensorboard/    with tensorboard=True: the metrics as TensorBoard scalars

Runs written by older versions (no marker; a single checkpoint.pt instead of checkpoint.json) resume and are
adopted; `poskit convert-checkpoint RUN` rewrites their checkpoint.

Exact resume: everything random (initialisation, dropout, data) flows from `seed` through RNG states that are
saved in the checkpoint, evaluation draws no random numbers, and the metrics log is cut back to the
checkpoint's step on resume; a run killed and resumed ends with the same numbers as an uninterrupted one.
A resumed run keeps its saved config; the only change allowed is a larger max_steps (`resume_config`).

Under `torchrun --nproc_per_node N` the same `train` runs as one run of N processes (DDP or FSDP2; rank 0
writes the run directory): `distributed` and docs/distributed.md.

The package is split by concern: `config` (TrainConfig, its validation, resume rules), `files` (the run
directory's files, atomic writes, checked reads), `run_dir` (markers and locks of the directories poskit
writes), `checkpoint_store` (a checkpoint's files, written and committed, read and verified), `checkpoint` (a
checkpoint's content checked against the run), `rng` (seeding and RNG states), `distributed` (processes,
model wrappers, the rank's rows, collectives), `step` (one optimizer step, the optimizer's groups, the
language model's schedule, loss and evaluation), `loop` (Trainer), `tensorboard_log` (optional scalars),
`run` (run, train, load_run, convert_legacy_checkpoint), `convert` (convert-checkpoint for either kind of
checkpointed run) and `recipes`.
"""
from .config import LOSS_ON_ALLOWED, TrainConfig, loss_positions
from .files import (
    CHECKPOINT_FILE,
    LEGACY_CHECKPOINT_FILE,
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
from .checkpoint_store import CHECKPOINTS_DIR, checkpoint_path, has_checkpoint, write_checkpoint
from .distributed import Processes, processes_from_env
from .loop import Trainer
from .rng import rng_state, seed_everything, set_rng_state
from .recipes import LMRecipe, Recipe
from .recipes.lm import resume_config
from .run import convert_legacy_checkpoint, load_run, preflight, run, train
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

__all__ = ["CHECKPOINT_FILE", "CHECKPOINTS_DIR", "CONFIG_FILE", "LEGACY_CHECKPOINT_FILE", "Processes",
           "checkpoint_path", "convert_legacy_checkpoint", "has_checkpoint", "processes_from_env", "write_checkpoint", "LOSS_ON_ALLOWED", "METRICS_FILE", "RESULTS_FILE",
           "NonFiniteLossError", "RunFileError", "TrainConfig", "Trainer", "atomic_write_bytes",
           "atomic_write_json", "build_model", "build_task_for", "check_writable_dir", "checkpoint_config",
           "evaluate", "load_config", "load_run", "loss_positions", "loss_targets", "lr_at", "make_optimizer",
           "metrics_at_checkpoint", "optimizer_step", "preflight", "read_checkpoint", "read_metrics",
           "restrict_targets", "restrict_to_last", "resume_config", "rng_state", "seed_everything",
           "set_rng_state", "train", "run", "Recipe", "LMRecipe"]
