"""One run, end to end: `train` (start or resume a run directory) and `load_run` (a trained model back)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from poskit.config_check import ConfigError
from poskit.models import Transformer

from .checkpoint import checkpoint_config, metrics_at_checkpoint, read_checkpoint
from .checkpoint_store import (
    checkpoint_path,
    has_checkpoint,
    remove_uncommitted_checkpoints,
    write_checkpoint,
)
from .config import RESUME_FREE_FIELDS, TrainConfig, resume_config
from .distributed import Processes, barrier, check_batch_split, from_main, processes_from_env, start_processes
from .files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    LEGACY_CHECKPOINT_FILE,
    METRICS_FILE,
    RESULTS_FILE,
    RunFileError,
    atomic_write_bytes,
    atomic_write_json,
    check_writable_dir,
    load_config,
    read_json,
    remove_stale_temp_files,
)
from .loop import Trainer, steps_for_budget
from .step import build_model, build_task_for, loss_targets
from .tensorboard_log import check_tensorboard_available


def preflight(cfg: TrainConfig, procs: Processes | None = None) -> None:
    """Build what a run needs once, so that bad input (a task option's value, an example space too small for
    disjoint splits, an encoding option, a device that is not here) stops with its message before any
    directory is created or any step is taken. The task is cached, so its splits are not built twice in this
    process; the model is built on the CPU under a forked RNG, leaving the caller's random state as it was.
    `procs` (default: the launch's, from the environment) must split the batch evenly."""
    if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", '"cpu" (CUDA is not available on this machine)', cfg.device)
    procs = processes_from_env() if procs is None else procs
    check_batch_split(cfg.batch_size, procs)
    if cfg.world_size is not None and cfg.world_size != procs.world_size:
        raise ConfigError("world_size", f"{procs.world_size}, the number of processes of this launch (or null: the "
                                        "trainer records it)", cfg.world_size)
    if cfg.tensorboard:
        check_tensorboard_available()
    task = build_task_for(cfg)
    for split in task.split_names:
        task.split(split)
    loss_targets(task.train_batch(cfg.batch_size, torch.Generator().manual_seed(0), step=0).targets, cfg)
    with torch.random.fork_rng(devices=[]):
        Transformer(dataclasses.replace(cfg.model, vocab_size=len(task.vocab)))


def train(cfg: TrainConfig | None, run_dir, *, resume: bool = False, stop_after: int | None = None,
          quiet: bool = False) -> dict | None:
    """Train `cfg` in `run_dir`; returns the final results (also written to results.json), or None when
    `stop_after` ended this invocation early. A directory that already holds a run is refused without `resume`.

    With `resume`, a checkpoint in `run_dir` is continued with the config saved beside it: `cfg` (None: the
    saved one) must equal it except for a larger max_steps, which extends the run (see `resume_config`), and
    the free fields world_size, tensorboard and compile. A finished run resumed with the same config returns its saved
    results without training or evaluating.

    Launched by torchrun with several processes, every rank calls this with the same arguments: all of them
    read and check the run directory (so a multi-node resume needs it on a shared file system), rank 0 alone
    writes it, and every rank returns the results (docs/distributed.md)."""
    run_dir = Path(run_dir)
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 1):
        raise ValueError(f"stop_after must be a positive int or None, got {stop_after!r}")
    if has_checkpoint(run_dir) and not resume:
        raise ValueError(f"run_dir {str(run_dir)!r} already holds a run; pass resume=True (--resume) or choose another directory")
    if resume and has_checkpoint(run_dir):
        # every file is read and checked before the run directory changes: a refused resume changes nothing
        saved = load_config(run_dir)
        cfg = resume_config(saved, cfg, str(run_dir / CONFIG_FILE))
        procs = processes_from_env()
        cfg = dataclasses.replace(cfg, world_size=procs.world_size)
        ckpt = checkpoint_path(run_dir)
        state = read_checkpoint(ckpt, cfg.device)
        checkpoint_config(run_dir, state, saved)
        metrics = metrics_at_checkpoint(run_dir, state)
        same = dataclasses.replace(cfg, **{f: getattr(saved, f) for f in RESUME_FREE_FIELDS}) == saved
        if same and (run_dir / RESULTS_FILE).exists():
            return read_json(run_dir / RESULTS_FILE, "a run's final results")
        preflight(cfg, procs)
        procs = start_processes(cfg.device)
        trainer = Trainer(cfg, run_dir, quiet=quiet, procs=procs)
        _restore(trainer, state, ckpt)
        barrier(procs)  # every rank has read the checkpoint before rank 0 changes the directory
        if procs.is_main:
            # from here on the run directory changes
            remove_stale_temp_files(run_dir)
            remove_uncommitted_checkpoints(run_dir)
            if not same:
                # extended: the old results no longer describe the run (and must not be returned after a kill)
                (run_dir / RESULTS_FILE).unlink(missing_ok=True)
            if cfg != saved:
                atomic_write_json(run_dir / CONFIG_FILE, cfg.to_dict())
            # metrics the killed invocation logged after its checkpoint are logged again by this one
            atomic_write_bytes(run_dir / METRICS_FILE, lambda f: f.write(metrics))
    else:
        if cfg is None:
            raise ValueError(f"cfg is needed to start a run: run_dir {str(run_dir)!r} holds no checkpoint to resume")
        check_writable_dir(run_dir, "run_dir")
        procs = processes_from_env()
        preflight(cfg, procs)
        procs = start_processes(cfg.device)
        cfg = dataclasses.replace(cfg, world_size=procs.world_size)
        if cfg.train_seconds is not None:
            # each rank times its own share of the batch; rank 0's plan is everyone's
            share = dataclasses.replace(cfg, batch_size=cfg.batch_size // procs.world_size)
            steps = from_main(steps_for_budget(share, cfg.train_seconds)[0], procs)
            cfg = dataclasses.replace(cfg, max_steps=steps)
        if procs.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temp_files(run_dir)
            remove_uncommitted_checkpoints(run_dir)
            (run_dir / METRICS_FILE).unlink(missing_ok=True)
            (run_dir / RESULTS_FILE).unlink(missing_ok=True)
            atomic_write_json(run_dir / CONFIG_FILE, cfg.to_dict())
        trainer = Trainer(cfg, run_dir, quiet=quiet, procs=procs)
        barrier(procs)
    if not trainer.run(stop_after):
        return None
    results = trainer.final_results()
    if procs.is_main:
        atomic_write_json(run_dir / RESULTS_FILE, results)
    barrier(procs)
    return results


def _restore(trainer: Trainer, state: dict, path: Path) -> None:
    """Load a checked checkpoint state into a fresh trainer; a state that does not fit its model or optimizer
    (a checkpoint of another model) is a RunFileError naming the checkpoint, and the trainer is discarded."""
    try:
        trainer.restore(state)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise RunFileError(path, f"does not fit the run's model and optimizer ({reason})") from None


def load_run(run_dir, device: str = "cpu"):
    """(model in eval mode, task, config) of a trained run directory, from its checkpoint (checked as a resume
    checks it: a bad file is a RunFileError naming it, and no half-loaded model is returned)."""
    run_dir = Path(run_dir)
    if not has_checkpoint(run_dir) or not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"run_dir {str(run_dir)!r} must contain {CONFIG_FILE} and {CHECKPOINT_FILE} (a `poskit train` run)")
    saved = load_config(run_dir)
    ckpt = checkpoint_path(run_dir)
    state = read_checkpoint(ckpt, device)
    checkpoint_config(run_dir, state, saved)
    cfg = dataclasses.replace(saved, device=device)
    task = build_task_for(cfg)
    model = build_model(cfg, task)
    _load_weights(model, state, ckpt)
    return model.eval(), task, cfg


def _load_weights(model: Transformer, state: dict, path: Path) -> None:
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise RunFileError(path, f"does not fit the run's model ({reason})") from None


def convert_legacy_checkpoint(run_dir) -> Path:
    """Rewrite the checkpoint.pt of a run written before checkpoint.json in the current format (safetensors
    weights, model_config.json, training_state.pt, committed by checkpoint.json), then remove checkpoint.pt.
    The old file is read and checked in full first: a bad one is a RunFileError and nothing changes. Returns
    the new checkpoint.json. (Resuming an old run converts it too, at its next checkpoint.)"""
    run_dir = Path(run_dir)
    legacy = run_dir / LEGACY_CHECKPOINT_FILE
    if not legacy.exists():
        where = f"it already has {CHECKPOINT_FILE}" if (run_dir / CHECKPOINT_FILE).exists() else "no checkpoint at all"
        raise ValueError(f"run_dir {str(run_dir)!r} has no {LEGACY_CHECKPOINT_FILE} to convert ({where})")
    saved = load_config(run_dir)
    state = read_checkpoint(legacy)
    checkpoint_config(run_dir, state, saved)
    model = build_model(dataclasses.replace(saved, device="cpu"), build_task_for(saved))
    _load_weights(model, state, legacy)
    remove_stale_temp_files(run_dir)
    remove_uncommitted_checkpoints(run_dir)
    write_checkpoint(run_dir, {"world_size": 1, **state}, model.config.to_dict())
    return run_dir / CHECKPOINT_FILE
