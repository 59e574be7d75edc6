"""Translation-run checkpoints as older poskit wrote them (one torch.save'd checkpoint.pt), for the legacy
resume and convert-checkpoint tests (test_seq2seq_checkpoint.py, test_translation_reproduce.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from poskit.training import CHECKPOINT_FILE, CHECKPOINTS_DIR, LEGACY_CHECKPOINT_FILE

# the entries of the state the translation trainer saved before checkpoint.json (and nothing else)
LEGACY_ENTRIES = ("model", "optimizer", "step", "epoch", "position", "rng")


def write_legacy(run: Path, state: dict) -> None:
    """Write `state`'s legacy entries as the run's checkpoint.pt, as the old trainer did (torch.save of one
    dict), and remove any current-format checkpoint."""
    torch.save({k: state[k] for k in LEGACY_ENTRIES}, run / LEGACY_CHECKPOINT_FILE)
    (run / CHECKPOINT_FILE).unlink(missing_ok=True)
    shutil.rmtree(run / CHECKPOINTS_DIR, ignore_errors=True)


def to_legacy(run: Path) -> None:
    """Rewrite a translation run's current checkpoint as the legacy checkpoint.pt."""
    from poskit.training.recipes.seq2seq import read_seq2seq_checkpoint

    state, _ = read_seq2seq_checkpoint(run)
    write_legacy(run, state)
