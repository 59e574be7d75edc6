"""Reading a run's checkpoint back, checked before anything is loaded: its structure, that it belongs to the
run's config.json, and the part of metrics.jsonl it was written after. (The files themselves, the current
format and the legacy checkpoint.pt: checkpoint_store.py.)"""
from __future__ import annotations

import json
from pathlib import Path

from .config import config_difference
from .checkpoint_store import check_entries, read_state
from .files import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE, RunFileError, parse_metrics, read_bytes
from .rng import check_rng_state

# what every checkpoint's state holds: key -> accepted types (a recipe adds its own: Recipe.state_entries)
_ENTRIES = {"model": dict, "optimizer": dict, "step": int, "rng": dict}
_RNG_ENTRIES = ("torch", "numpy", "python")


def read_checkpoint(path, device: str = "cpu", recipe=None) -> dict:
    """The state saved in checkpoint `path` (a run's checkpoint.json, or the checkpoint.pt of a run written
    before it), on `device`, with the entries of `recipe` (a Recipe class or instance; default the language
    model's); a RunFileError naming the file when one of its files is truncated, zero-filled, corrupt, not a
    checkpoint or missing one of its entries. Nothing is loaded anywhere."""
    return read_run_state(path, device, recipe)[0]


def read_run_state(path, device: str = "cpu", recipe=None) -> tuple[dict, Path]:
    """(state, the file its entries came from: training_state.pt or checkpoint.pt), as `read_checkpoint`."""
    if recipe is None:
        from .recipes.lm import LMRecipe as recipe
    state, path = read_state(path, device)  # entries of the current format are checked naming training_state.pt
    entries = {**_ENTRIES, **recipe.state_entries}
    check_entries(path, state, entries, recipe.writer)
    negative = [k for k, kind in entries.items() if kind is int and state[k] < 0]
    if negative or len(state.get("loss_acc", (0, 0))) != 2:
        raise RunFileError(path, f"has a malformed {negative[0] if negative else 'loss_acc'} (step {state['step']})")
    check_rng_entries(path, state["rng"])
    return state, path


def check_rng_entries(path: Path, rng: dict) -> None:
    """Refuse (naming `path`) saved RNG states that lack one of torch/numpy/python or would not be accepted."""
    missing = [k for k in _RNG_ENTRIES if k not in rng]
    if missing:
        raise RunFileError(path, f"lacks the RNG state(s) {missing}: not a checkpoint written by poskit")
    try:
        check_rng_state(rng)
    except ValueError as e:
        raise RunFileError(path, f"has a malformed RNG state ({e})") from None


def checkpoint_config(run_dir, state: dict, saved, recipe=None):
    """The config the checkpoint was trained with, which config.json (`saved`) must still describe: only a
    larger max_steps (an extension whose first checkpoint is not written yet) may differ. A mismatch (e.g.
    config.json edited from rope to alibi) is refused naming the field, since the weights would otherwise
    run under the new name. (A legacy checkpoint without its config: None, nothing to compare.)"""
    if recipe is None:
        from .recipes.lm import LMRecipe as recipe
    if "config" not in state:
        return None
    run_dir = Path(run_dir)
    try:
        own = recipe.config_type.from_dict(state["config"])
    except (ValueError, TypeError) as e:
        raise RunFileError(run_dir / CHECKPOINT_FILE, f"holds an invalid config: {e}") from None
    difference = config_difference(own, saved, recipe.resume_free_fields)
    if difference is not None:
        key, theirs, ours = difference
        raise RunFileError(run_dir / CONFIG_FILE,
                           f"{key} is {ours}, but {CHECKPOINT_FILE} was trained with {theirs}; config.json was "
                           "changed after the run started: restore it, or start a new run directory")
    return own


def metrics_at_checkpoint(run_dir, state: dict) -> bytes:
    """The bytes metrics.jsonl must hold to continue from `state`: what was logged up to the checkpoint.
    Lines the killed invocation logged after its checkpoint are dropped (this invocation logs them again); a
    log shorter than the checkpoint recorded, or one with a malformed line before that point, is refused."""
    path = Path(run_dir) / METRICS_FILE
    data = read_bytes(path) if path.exists() else b""
    if "metrics_bytes" in state:
        size = int(state["metrics_bytes"])
        if len(data) < size:
            raise RunFileError(path, f"is truncated: {len(data)} bytes, but {CHECKPOINT_FILE} (step {state['step']}) "
                                     f"was written when it held {size}")
        kept = data[:size]
        parse_metrics(path, kept)  # checks every line
        return kept
    # a checkpoint from before metrics_bytes was recorded: keep the records up to its step
    records = [m for m in parse_metrics(path, data) if m["step"] <= state["step"]]
    return "".join(json.dumps(m) + "\n" for m in records).encode()
