"""One run, end to end: `run` (start, resume or return the results of a run directory, for any recipe), `train`
(a language-model run), `load_run` (a trained model back), `preflight`, `convert_legacy_checkpoint`."""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch

from poskit.util.config_check import ConfigError
from poskit.models import Transformer

from . import run_dir as run_dirs
from .checkpoint import checkpoint_config, metrics_at_checkpoint, read_checkpoint
from .checkpoint_store import (
    CHECKPOINTS_DIR,
    checkpoint_path,
    has_checkpoint,
    remove_uncommitted_checkpoints,
    write_checkpoint,
)
from .config import TrainConfig
from .distributed import Processes, barrier, peers_watched, processes_from_env, start_processes
from .files import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    LEGACY_CHECKPOINT_FILE,
    METRICS_FILE,
    RunFileError,
    atomic_write_bytes,
    atomic_write_json,
    check_writable_dir,
    code_version,
    does_not_fit,
    load_config,
    read_results,
    remove_stale_temp_files,
)
from .loop import Trainer
from .recipes.lm import LMRecipe
from .step import build_model, build_task_for


def preflight(cfg: TrainConfig, procs: Processes | None = None) -> None:
    """Check what a run of `cfg` needs, so that bad input (a task option's value, an example space too small
    for disjoint splits, an encoding option, a device that is not here) stops with its message before any
    directory is created or any step is taken. The task is cached, so its splits are not built twice in this
    process; the model is built on the meta device (no memory, no random numbers drawn): a run builds its own
    once. `procs` (default: the launch's, from the environment) must split the batch evenly."""
    LMRecipe(cfg).launch(processes_from_env() if procs is None else procs)
    with torch.device("meta"):
        Transformer(dataclasses.replace(cfg.model, vocab_size=len(build_task_for(cfg).vocab)))


def _committed(run_dir: Path, results_file: str) -> bool:
    """Whether `run_dir` holds a committed checkpoint. Committed state that is missing or inconsistent (a
    checkpoint directory without the checkpoint.json that commits it, results without a checkpoint) is refused
    saying what was found: only the run's own writes may be continued or removed."""
    if has_checkpoint(run_dir):
        return True
    found = sorted(p.name for p in (run_dir / CHECKPOINTS_DIR).iterdir()) if (run_dir / CHECKPOINTS_DIR).is_dir() else []
    if found:
        raise RunFileError(run_dir / CHECKPOINT_FILE, f"is missing, but {CHECKPOINTS_DIR}/ holds {', '.join(found)}: "
                                                      "the committed state of this run is incomplete; restore "
                                                      f"{CHECKPOINT_FILE}, or move {CHECKPOINTS_DIR}/ away to start over")
    if (run_dir / results_file).exists():
        raise RunFileError(run_dir / results_file, f"is there, but no checkpoint ({CHECKPOINT_FILE}): the run's "
                                                   "committed state is missing; restore it, or choose another directory")
    return False


def run(recipe, run_dir, *, resume: bool = False, stop_after: int | None = None, quiet: bool = False,
        label: str = "") -> dict | None:
    """Train `recipe` (recipes/) in `run_dir`; returns the final results (also written to its results file),
    or None when `stop_after` ended this invocation early.

    The run directory must be absent, empty, or a run poskit wrote (a run from before the marker files is
    adopted); anything else is refused untouched. Its lock is held for the whole call: a second process on it
    is refused at once. A directory that holds a committed checkpoint is refused without `resume`. With
    `resume` it is continued with the config saved beside it, which the recipe's config (None: the saved one)
    may change only by a larger max_steps (extending the run) and the recipe's free fields; a finished run
    resumed with the same config returns its saved results without training or evaluating. Every file is
    read and checked before the run directory changes: a refused call changes nothing.

    Launched by torchrun with several processes, every rank calls this with the same arguments: all of them
    read and check the run directory (so a multi-node resume needs it on a shared file system), rank 0 alone
    locks and writes it, and every rank returns the results (docs/distributed.md)."""
    run_dir = Path(run_dir)
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 1):
        raise ValueError(f"stop_after must be a positive int or None, got {stop_after!r}")
    found = run_dirs.check(run_dir, recipe.kind)
    procs = processes_from_env()
    with contextlib.ExitStack() as held:
        if found != "new" and procs.is_main:
            held.enter_context(run_dirs.locked(run_dir))
        resumed = found != "new" and _committed(run_dir, recipe.results_file)
        if resumed and not resume:
            raise ValueError(f"run_dir {str(run_dir)!r} already holds a run; pass resume=True (--resume) or choose "
                             "another directory")
        if resumed:
            # every file is read and checked before the run directory changes: a refused resume changes nothing
            saved = recipe.load_config(run_dir)
            recipe.config = recipe.resume_config(saved, str(run_dir / CONFIG_FILE))
            ckpt = checkpoint_path(run_dir)
            state = read_checkpoint(ckpt, recipe.device, recipe)
            checkpoint_config(run_dir, state, saved, recipe)
            metrics = metrics_at_checkpoint(run_dir, state)
            same = recipe.same_run(saved)
            if same and (run_dir / recipe.results_file).exists():
                return read_results(run_dir / recipe.results_file)
        elif recipe.config is None:
            raise ValueError(f"cfg is needed to start a run: run_dir {str(run_dir)!r} holds no checkpoint to resume")
        else:
            check_writable_dir(run_dir, "run_dir")
        recipe.launch(procs)
        procs = start_processes(recipe.device)
        held.enter_context(peers_watched(procs))  # a rank that dies is named on the others, not a backend traceback
        trainer = Trainer(recipe, run_dir, quiet=quiet, procs=procs, label=label)  # the one build of the model
        if resumed:
            trainer.restore(state, ckpt)
        elif trainer.loop.train_seconds is not None:
            # max_steps from a time budget, timed on this run's own model (put back afterwards)
            steps = trainer.steps_for_budget(trainer.loop.train_seconds)[0]
            recipe.config = dataclasses.replace(recipe.config, max_steps=steps)
            trainer.loop = recipe.loop()
        barrier(procs)  # every rank has read the checkpoint before rank 0 changes the directory
        if procs.is_main:
            # from here on the run directory changes
            if found == "new":
                run_dir.mkdir(parents=True, exist_ok=True)
                held.enter_context(run_dirs.locked(run_dir))
                if any(p.name != run_dirs.LOCK_FILE for p in run_dir.iterdir()):
                    raise run_dirs.RunDirError(f"{run_dir}: was written by another process meanwhile; choose "
                                               "another directory")
            run_dirs.claim(run_dir, recipe.kind)  # the marker (a run written before markers is adopted here)
            remove_stale_temp_files(run_dir)
            remove_uncommitted_checkpoints(run_dir)
            if not resumed or not same:
                # a new run, or an extended one: old results no longer describe it (and must not be returned
                # after a kill)
                (run_dir / recipe.results_file).unlink(missing_ok=True)
            if not resumed or recipe.config.to_dict() != saved.to_dict():
                atomic_write_json(run_dir / CONFIG_FILE, recipe.config.to_dict())
            if resumed:  # metrics the killed invocation logged after its checkpoint are logged again by this one
                atomic_write_bytes(run_dir / METRICS_FILE, lambda f: f.write(metrics))
            else:
                (run_dir / METRICS_FILE).unlink(missing_ok=True)
        if not trainer.run(stop_after):
            return None
        results = {**recipe.final_results(trainer), "poskit_version": code_version()}
        if procs.is_main:
            recipe.write_outputs(run_dir, results)
            atomic_write_json(run_dir / recipe.results_file, results)
        barrier(procs)
        return results


def train(cfg: TrainConfig | None, run_dir, *, resume: bool = False, stop_after: int | None = None,
          quiet: bool = False) -> dict | None:
    """Train language-model config `cfg` in `run_dir` (`run` with the LM recipe); returns the final results
    (also written to results.json), or None when `stop_after` ended this invocation early. With `resume`, the
    free fields world_size, tensorboard and compile may change too."""
    return run(LMRecipe(cfg), run_dir, resume=resume, stop_after=stop_after, quiet=quiet)


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
        raise does_not_fit(path, e, "the run's model") from None


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
