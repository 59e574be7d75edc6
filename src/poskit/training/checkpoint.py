"""Reading a run's checkpoint back, checked before anything is loaded: its structure, that it belongs to the
run's config.json, and the part of metrics.jsonl it was written after. (The files themselves, the current
format and the legacy checkpoint.pt: checkpoint_store.py.)"""
from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from .config import TrainConfig, config_difference
from .checkpoint_store import read_checkpoint_files
from .files import CHECKPOINT_FILE, CONFIG_FILE, LEGACY_CHECKPOINT_FILE, METRICS_FILE, RunFileError, parse_metrics, read_bytes
from .rng import check_rng_state

# what Trainer.state_dict saves: key -> accepted types
_ENTRIES = {"model": dict, "optimizer": dict, "step": int, "elapsed": (int, float), "loss_acc": (list, tuple),
            "rng": dict, "data_generator": torch.Tensor, "config": dict}
_RNG_ENTRIES = ("torch", "numpy", "python")


def read_checkpoint(path, device: str = "cpu") -> dict:
    """The state saved in checkpoint `path` (a run's checkpoint.json, or the checkpoint.pt of a run written
    before it), on `device`; a RunFileError naming the file when one of its files is truncated, zero-filled,
    corrupt, not a checkpoint or missing one of its entries. Nothing is loaded anywhere."""
    path = Path(path)
    if path.name == LEGACY_CHECKPOINT_FILE:
        state = _read_legacy(path, device)
    else:
        state, path = read_checkpoint_files(path, device)  # entries are checked naming training_state.pt
    return _check_state(path, state)


def _read_legacy(path: Path, device: str) -> dict:
    data = read_bytes(path)
    if not data.strip(b"\x00"):
        raise RunFileError(path, f"holds only zero bytes ({len(data)}), not a checkpoint (a write was cut short)")
    try:
        state = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    except Exception as e:  # torch raises many types for a torn zip archive or pickle; all mean the same here
        # the first sentence of torch's message (its zip reader appends a paragraph of advice to one line)
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        reason = first_line.split(". ")[0].rstrip(".")[:200]
        raise RunFileError(path, f"is not a readable checkpoint (truncated or corrupt: {reason})") from None
    if not isinstance(state, dict):
        raise RunFileError(path, f"holds a {type(state).__name__}, not a checkpoint's dict of training state")
    return state


def _check_state(path: Path, state: dict) -> dict:
    for key, kind in _ENTRIES.items():
        if not isinstance(state.get(key), kind) or (kind is int and isinstance(state.get(key), bool)):
            problem = "lacks" if key not in state else "has a malformed"
            raise RunFileError(path, f"{problem} entry {key!r}: not a checkpoint written by poskit's trainer")
    if state["step"] < 0 or len(state["loss_acc"]) != 2:
        raise RunFileError(path, f"has a malformed step or loss_acc (step {state['step']})")
    missing = [k for k in _RNG_ENTRIES if k not in state["rng"]]
    if missing:
        raise RunFileError(path, f"lacks the RNG state(s) {missing}: not a checkpoint written by poskit's trainer")
    try:
        check_rng_state(state["rng"])
    except ValueError as e:
        raise RunFileError(path, f"has a malformed RNG state ({e})") from None
    return state


def checkpoint_config(run_dir, state: dict, saved: TrainConfig) -> TrainConfig:
    """The config the checkpoint was trained with, which config.json (`saved`) must still describe: only a
    larger max_steps (an extension whose first checkpoint is not written yet) may differ. A mismatch (e.g.
    config.json edited from rope to alibi) is refused naming the field, since the weights would otherwise
    run under the new name."""
    run_dir = Path(run_dir)
    try:
        own = TrainConfig.from_dict(state["config"])
    except (ValueError, TypeError) as e:
        raise RunFileError(run_dir / CHECKPOINT_FILE, f"holds an invalid config: {e}") from None
    difference = config_difference(own, saved)
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
