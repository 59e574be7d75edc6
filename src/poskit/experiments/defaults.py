"""Per-task default training configurations (CPU scale), used by `poskit train` and `poskit compare`.

The synthetic tasks default to their reproduction's settings (experiments/reproduce.py); Shakespeare to the
demo's character-level LM, whose sizes come from the measurements that chose the demo (docs/cli.md).
"""
from __future__ import annotations

import copy

# the demo's LM: 2 layers, d_model 128, 4 heads, GELU MLP, untied head (about 415 k parameters at 81 chars)
LM_MODEL = {"d_model": 128, "n_layers": 2, "n_heads": 4, "mlp": "gelu", "encoding": "rope"}
LM_TRAIN = {"task": "shakespeare", "task_options": {"context": 64}, "model": LM_MODEL, "batch_size": 32,
            "max_steps": 2000, "lr": 2e-3, "min_lr": 2e-4, "warmup_fraction": 0.05, "beta2": 0.98,
            "weight_decay": 0.01, "grad_clip": 1.0, "eval_every": 250, "eval_batches": 8, "log_every": 25,
            "checkpoint_every": 250}


def task_defaults(task: str) -> dict:
    """A fresh TrainConfig dict for `task` (callers may mutate it)."""
    from poskit.tasks import available_tasks

    from .reproduce import REPRODUCTIONS

    if task not in available_tasks():
        raise ValueError(f"task must be one of {available_tasks()}, got {task!r}")
    if task == "shakespeare":
        return copy.deepcopy(LM_TRAIN)
    for r in REPRODUCTIONS.values():
        if r.config["task"] == task:
            return copy.deepcopy(r.config)
    return {"task": task}
