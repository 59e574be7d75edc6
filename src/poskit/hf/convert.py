"""Conversion both ways between poskit models and Hugging Face directories.

from_poskit(transformer)        -> PoskitForCausalLM holding the same weights
to_poskit(directory)            -> poskit.models.Transformer of a saved PoskitForCausalLM directory
export_run(run_dir, directory)  -> a `poskit train` run as a Hugging Face directory (`poskit export RUN --hf DIR`)
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


def export_run(run_dir, directory, *, overwrite: bool = False, progress: bool = False) -> Path:
    """Write the trained run `run_dir` (a `poskit train` directory) as a Hugging Face directory: config.json
    (with `poskit_fingerprint`, what the run was trained as: a config edited later to another architecture or
    encoding is refused on load), model.safetensors, generation_config.json, poskit_run.json (the run's config,
    task and vocabulary) and the auto-class module (PoskitConfig.save_pretrained).

    Everything is checked before anything is written: `directory` may not be the run, inside it or above it
    (`overwrite` included), must be a directory path that can be created and written, and an existing non-empty
    one is refused unless `overwrite`. The directory is written under a temporary name beside it and renamed
    when complete, so it never holds half an export. progress: transformers' progress bar while writing."""
    from poskit.training.run import load_run

    directory = Path(directory)
    _check_destination(Path(run_dir), directory, overwrite)
    model, task, cfg = load_run(run_dir)  # checks every run file, naming the bad one
    hf = from_poskit(model, max_position_embeddings=task.max_input_len, pad_token_id=task.vocab.pad_id)
    hf.config.poskit_fingerprint = hf.config.fingerprint()
    info = {"run_dir": str(Path(run_dir).resolve()), "task": task.name, "task_params": _jsonable(task.params),
            "vocab": {"tokens": list(task.vocab.tokens), "sep": task.vocab.sep, "pad_id": task.vocab.pad_id},
            "train_config": _jsonable(cfg.to_dict() if hasattr(cfg, "to_dict") else {})}
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError as e:  # the staging path is ours, not the user's: name what they gave
        raise ValueError(f"--hf directory {str(directory)!r} cannot be written: {e.strerror or e}") from None
    try:
        with _progress_bars(progress):
            hf.save_pretrained(staging)
        (staging / RUN_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    except OSError as e:
        raise ValueError(f"--hf directory {str(directory)!r} cannot be written: {e.strerror or e}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return directory


def _check_destination(run_dir: Path, directory: Path, overwrite: bool) -> None:
    """Refuse, before anything is written, a destination that would replace or mix with the run or cannot be a
    writable directory; each error names --hf."""
    run, dest = run_dir.resolve(), directory.resolve()
    where = ("is the run itself" if dest == run else "is inside the run" if run in dest.parents
             else "is above the run" if dest in run.parents else None)
    if where is not None:
        raise ValueError(f"--hf directory {str(directory)!r} {where} {str(run_dir)!r} (an export there"
                         f"{' with --overwrite' if overwrite else ''} would mix with or replace the run's files); "
                         "choose a directory outside the run")
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--hf directory {str(directory)!r} is a file; choose a directory path")
    existing = next(p for p in (dest, *dest.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--hf directory {str(directory)!r} cannot be created: {str(existing)!r} is a file, not a "
                         "directory")
    if not os.access(existing if existing != dest else dest.parent, os.W_OK | os.X_OK):
        raise ValueError(f"--hf directory {str(directory)!r} cannot be written: no write permission in "
                         f"{str(existing if existing != dest else dest.parent)!r}")
    if directory.exists() and any(directory.iterdir()) and not overwrite:
        raise ValueError(f"--hf directory {str(directory)!r} exists and is not empty; choose another (or overwrite)")


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
