"""The common interface of poskit's tasks, gathered from the modules that define it (kept so that
``from poskit.tasks.base import X`` keeps working):

* :mod:`.data`: :class:`Vocab`, :class:`Example`, :class:`Batch`, :func:`collate`, :class:`PackedExamples`;
* :mod:`.metrics`: :class:`Scores`, :func:`score_batch`, :func:`summarize`, :func:`evaluate_batches`, :func:`lm_loss`;
* :mod:`.protocol`: the :class:`Task` protocol and :class:`Described` (``params`` and ``repr`` from the constructor);
* :mod:`.synthetic`: :class:`SyntheticTask`, the procedurally generated tasks' splits and training data.

Argument checks live in :mod:`poskit.validate`.
"""

from __future__ import annotations

from .data import IGNORE_INDEX, PAD_TOKEN, Batch, Example, PackedExamples, Vocab, collate, rng_from_generator
from .metrics import Scores, evaluate_batches, lm_loss, score_batch, summarize
from .protocol import Described, Task
from .synthetic import SyntheticTask

__all__ = [
    "IGNORE_INDEX",
    "PAD_TOKEN",
    "Batch",
    "Vocab",
    "Example",
    "PackedExamples",
    "Task",
    "Described",
    "SyntheticTask",
    "Scores",
    "score_batch",
    "summarize",
    "evaluate_batches",
    "lm_loss",
    "collate",
    "rng_from_generator",
]
