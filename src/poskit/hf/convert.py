"""Conversion both ways between poskit models and Hugging Face directories.

from_poskit(transformer)        -> PoskitForCausalLM holding the same weights
to_poskit(directory)            -> poskit.models.Transformer of a saved PoskitForCausalLM directory
export_run(run_dir, directory)  -> a `poskit train` or `poskit extend` run as a Hugging Face directory
                                   (`poskit export RUN --hf DIR`)
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from poskit.models import Transformer
from poskit.training import run_dir as run_dirs

from .config import PoskitConfig
from .model import PoskitForCausalLM

#: written beside the weights by export_run: where the model came from and the task's vocabulary
RUN_INFO_FILE = "poskit_run.json"


def from_poskit(model: Transformer, **config_kwargs) -> PoskitForCausalLM:
    """A PoskitForCausalLM holding a copy of `model` (weights, dtypes, device as they are).
    config_kwargs: other PretrainedConfig fields (e.g. max_position_embeddings, eos_token_id)."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a poskit.models.Transformer, got {type(model).__name__}")
    config = PoskitConfig.from_model_config(model.config, **config_kwargs)
    with torch.device("meta"):  # the wrapper's own Transformer is replaced below: no memory for it
        hf = PoskitForCausalLM(config)
    # a deep copy keeps everything as it is in `model`: weights, tying, dtypes (float64 frequency buffers of a
    # float32 model included, which a cast of the whole module would round), device
    hf.model = copy.deepcopy(model)
    return hf.eval()


def to_poskit(directory, *, dtype: torch.dtype | None = None) -> Transformer:
    """The poskit.models.Transformer saved in a PoskitForCausalLM directory (config.json + safetensors), in
    eval mode; dtype: as saved when None. A missing or unreadable directory is an error naming it."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise ValueError(f"directory {str(directory)!r} must hold a saved PoskitForCausalLM (config.json and "
                         "model.safetensors, from save_pretrained or `poskit export --hf`)")
    try:
        config = PoskitConfig.from_pretrained(directory)
        hf = PoskitForCausalLM.from_pretrained(directory, config=config, dtype=dtype or "auto")
    except Exception as e:  # whatever the reader raised (safetensors' own errors included): name the directory
        raise ValueError(f"cannot load a poskit model from {str(directory)!r} (config.json and its weights files): "
                         f"{type(e).__name__}: {e}") from None
    return hf.model.eval()


def load_for_export(run_dir):
    """(model, task, TrainConfig, extension) of a run to export: a `poskit train` run (extension None) or a
    `poskit extend` run (its TrainConfig view at the new context, and its ExtendConfig as a dict: the parent's
    provenance travels with the export). A bad file is an error naming it."""
    from poskit.training.recipes.extend import load_trained

    model, task, cfg, extension = load_trained(run_dir)
    return model, task, cfg, None if extension is None else extension.to_dict()


def export_run(run_dir, directory, *, overwrite: bool = False, progress: bool = False) -> Path:
    """Write the trained run `run_dir` (a `poskit train` or `poskit extend` directory) as a Hugging Face
    directory: config.json
    (with `poskit_fingerprint`, what the run was trained as: a config edited later to another architecture or
    encoding is refused on load), model.safetensors, generation_config.json, poskit_run.json (the run's config,
    task and vocabulary), the auto-class module (PoskitConfig.save_pretrained) and poskit's marker of an export
    directory (training.run_dir).

    Everything is checked before anything is written: `directory` may not be the run, inside it or above it
    (`overwrite` included), must be a directory path that can be created and written, and must be absent, empty
    or an earlier export; an earlier export is replaced only with `overwrite`, and a directory poskit did not
    write (or wrote as something else) never is. The directory is written under a temporary name beside it and
    renamed when complete, so it never holds half an export. progress: transformers' progress bar while writing."""
    directory = Path(directory)
    _check_destination(Path(run_dir), directory, overwrite)
    model, task, cfg, extension = load_for_export(run_dir)  # checks every run file, naming the bad one
    hf = from_poskit(model, max_position_embeddings=task.max_input_len, pad_token_id=task.vocab.pad_id)
    hf.config.poskit_fingerprint = hf.config.fingerprint()
    return write_export(run_dir, directory, hf, task, cfg, overwrite=overwrite, progress=progress,
                        extension=extension)


def write_export(run_dir, directory: Path, hf, task, cfg, *, overwrite: bool, progress: bool,
                 extension: dict | None = None) -> Path:
    """Write the transformers model `hf` of run `run_dir` (its task and config beside it in poskit_run.json, and
    for an extension run its ExtendConfig as "extension") as the export directory `directory`, whatever its
    format (poskit's own or a native one): staged under a temporary name, marked as poskit's export, then
    renamed; an existing destination is locked and checked again (`_check_destination`) while it is replaced.
    The caller checked the destination before loading."""
    info = {"run_dir": str(Path(run_dir).resolve()), "task": task.name, "task_params": _jsonable(task.params),
            "vocab": {"tokens": list(task.vocab.tokens), "sep": task.vocab.sep, "pad_id": task.vocab.pad_id},
            "train_config": _jsonable(cfg.to_dict() if hasattr(cfg, "to_dict") else {})}
    if extension is not None:
        info["extension"] = _jsonable(extension)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError as e:  # the staging path is ours, not the user's: name what they gave
        raise ValueError(f"--hf directory {str(directory)!r} cannot be written: {e.strerror or e}") from None
    try:
        run_dirs.claim(staging, "export")
        with _progress_bars(progress):
            hf.save_pretrained(staging)
        (staging / RUN_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        # an existing destination is locked while it is replaced, and checked again under the lock: another
        # export may have written it since the first check
        with run_dirs.locked(directory) if directory.is_dir() else contextlib.nullcontext():
            _check_destination(Path(run_dir), directory, overwrite)
            if directory.is_dir():  # empty, or an earlier export with `overwrite`
                shutil.rmtree(directory)
            os.replace(staging, directory)
    except OSError as e:
        raise ValueError(f"--hf directory {str(directory)!r} cannot be written: {e.strerror or e}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return directory


def is_legacy_export(directory: Path) -> bool:
    """An export written before directories carried poskit's marker: a config.json beside poskit_run.json."""
    return (directory / "config.json").is_file() and (directory / RUN_INFO_FILE).is_file()


def _check_destination(run_dir: Path, directory: Path, overwrite: bool) -> str:
    """Refuse, before anything is written, a destination that would replace or mix with the run, cannot be a
    writable directory, or holds anything but an earlier export (that only with `overwrite`); each error names
    --hf. Returns run_dir.check's verdict: "new", "own" or "legacy"."""
    run_dirs.check_apart(directory, run_dir, "--hf")
    dest = directory.resolve()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--hf directory {str(directory)!r} is a file; choose a directory path")
    existing = next(p for p in (dest, *dest.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--hf directory {str(directory)!r} cannot be created: {str(existing)!r} is a file, not a "
                         "directory")
    if not os.access(existing if existing != dest else dest.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--hf directory {str(directory)!r} cannot be written: no write permission in "
                         f"{str(existing if existing != dest else dest.parent)!r}")
    try:
        state = run_dirs.check(directory, "export", legacy=is_legacy_export)
    except run_dirs.RunDirError as e:
        raise ValueError(f"--hf {e}") from None
    if state != "new" and not overwrite:
        raise ValueError(f"--hf directory {str(directory)!r} holds an earlier export; choose another directory "
                         "(or --overwrite to replace it)")
    return state


@contextlib.contextmanager
def _progress_bars(enabled: bool):
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def _jsonable(value):
    """value with anything JSON cannot hold (numpy scalars, tuples, paths) turned into what it can."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
