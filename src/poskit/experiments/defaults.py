"""Per-task default training configurations (CPU scale), used by `poskit train` and `poskit compare`.

The synthetic tasks default to their reproduction's settings, Shakespeare to the demo's character-level LM;
both live in experiments/configs/ (the demo's sizes were measured to fit it in about five minutes on 2 cores).
"""
from __future__ import annotations

import copy

from .configs import LM_MODEL, LM_TRAIN, Reproduction
from .registry import experiments

__all__ = ["LM_MODEL", "LM_TRAIN", "task_defaults"]


def task_defaults(task: str) -> dict:
    """A fresh TrainConfig dict for `task` (callers may mutate it)."""
    from poskit.tasks import available_tasks

    if task not in available_tasks():
        raise ValueError(f"task must be one of {available_tasks()}, got {task!r}")
    if task == LM_TRAIN["task"]:
        return copy.deepcopy(LM_TRAIN)
    for e in experiments("reproduction"):  # the first decoder reproduction of the task
        if isinstance(e.settings, Reproduction) and e.settings.config["task"] == task:
            return copy.deepcopy(e.settings.config)
    from poskit.tasks import task_model_defaults

    # a task may declare the model it needs (masked-language modelling: a bidirectional model)
    model = task_model_defaults(task)
    return {"task": task, "model": model} if model else {"task": task}
