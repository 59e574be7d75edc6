"""Training a `poskit.models.Transformer` on a `poskit.tasks` task, reproducibly and resumably.

One run lives in one directory:

    config.json     the full TrainConfig (with max_steps resolved when a time budget was given)
    metrics.jsonl   one JSON object per line: {"step", "train_loss", "lr", "elapsed"} every log_every steps,
                    {"step", "split", <metrics>} after every evaluation
    checkpoint.json the commit record of the latest checkpoint: its step, world_size, directory, and the size and
                    SHA-256 of each of its files (checkpoint_store.py)
    checkpoints/step-<step>-<id>/
                    model.safetensors (weights), model_config.json (their ModelConfig), training_state.pt
                    (optimizer, step, torch/numpy/python (and, once CUDA is in use, CUDA) RNG states of every
                    rank, data-generator state)
    results.json    the final evaluation on every split of the task
    tensorboard/    with tensorboard=True: the metrics as TensorBoard scalars

Runs written by older versions hold a single checkpoint.pt instead; they resume (and are rewritten in the
current format at their next checkpoint) or are converted by `poskit convert-checkpoint RUN`.

Exact resume: everything random (initialisation, dropout, data) flows from `seed` through RNG states that are
saved in the checkpoint, evaluation draws no random numbers, and the metrics log is cut back to the
checkpoint's step on resume; a run killed and resumed ends with the same numbers as an uninterrupted one.
A resumed run keeps its saved config; the only change allowed is a larger max_steps (`resume_config`).

Under `torchrun --nproc_per_node N` the same `train` runs as one run of N processes (DDP or FSDP2; rank 0
writes the run directory): `distributed` and docs/distributed.md.

The package is split by concern: `config` (TrainConfig, its validation, resume rules), `files` (the run
directory's files, atomic writes, checked reads), `checkpoint_store` (a checkpoint's files, written and
committed, read and verified), `checkpoint` (a checkpoint's content checked against the run), `rng`
(seeding and RNG states), `distributed` (processes, model wrappers, the rank's rows, collectives), `step`
(schedule, optimizer, loss, evaluation), `loop` (Trainer, time budget), `tensorboard_log` (optional scalars)
`run` (train, load_run, convert_legacy_checkpoint), `convert` (convert-checkpoint for a training or a
translation run) and `seq2seq` (the encoder-decoder translation trainer, on the same checkpoint store).
"""
from .config import LOSS_ON_ALLOWED, TrainConfig, loss_positions, resume_config
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
from .loop import Trainer, steps_for_budget
from .rng import rng_state, seed_everything, set_rng_state
from .run import convert_legacy_checkpoint, load_run, preflight, train
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
           "set_rng_state", "steps_for_budget", "train"]
