"""Shared by the checkpoint-format tests (test_bad_input_runs.py, test_checkpoint_format.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from poskit.training import CHECKPOINT_FILE, CHECKPOINTS_DIR, LEGACY_CHECKPOINT_FILE, read_checkpoint


def to_legacy(run: Path) -> None:
    """Rewrite a run's checkpoint as the single checkpoint.pt that runs written before checkpoint.json hold:
    the same entries as the trainer's state dict of that time (no model_config, no world_size)."""
    state = read_checkpoint(run / CHECKPOINT_FILE)
    for key in ("model_config", "world_size"):
        state.pop(key)
    torch.save(state, run / LEGACY_CHECKPOINT_FILE)
    (run / CHECKPOINT_FILE).unlink()
    shutil.rmtree(run / CHECKPOINTS_DIR)
