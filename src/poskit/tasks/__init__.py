"""Tasks: synthetic generators from the PoPE and CoPE papers, and Shakespeare.

    >>> from poskit.tasks import build_task, available_tasks
    >>> task = build_task("indirect-indexing")          # CPU-scale defaults
    >>> task = build_task("selective-copy", preset="paper", eval_size=500)
    >>> batch = task.train_batch(64, torch.Generator().manual_seed(0))
    >>> logits = model(batch.inputs)                      # (B, T, V), V = len(task.vocab)
    >>> loss = lm_loss(logits, batch)
    >>> task.evaluate(model, "test")["accuracy"]

Every task has ``name``, ``vocab`` (:class:`Vocab`, ``pad_id == 0``), ``metric``
("accuracy" or "perplexity"), ``accuracy_level``, ``split_names``,
``max_input_len``, ``params``, ``train_batch(batch_size, generator)``,
``split(name, batch_size=None)`` and ``evaluate(model, split, batch_size=None)``;
see :mod:`poskit.tasks.base` (which gathers :mod:`.data`, :mod:`.metrics`,
:mod:`.protocol` and :mod:`.synthetic`).  Shakespeare adds ``eval_windows(length, split,
n_chars, last_fraction)`` for length extrapolation; so do the real-corpus tasks of
:mod:`.corpus` (``corpus``, ``lm-jsb``, ``lm-wiki``, ...; data from :mod:`poskit.data`).  :mod:`.mlm`
(``mlm``, ``mlm-wiki``) is BERT's masked-language modelling, for bidirectional models (``causal=False``).
:mod:`.passkey` (``passkey``; ``passkey_fraction`` of the language-modelling tasks) is passkey retrieval.
"""

from __future__ import annotations

import inspect

from ..util.validate import check_choice
from .data import IGNORE_INDEX, Batch, Example, PackedExamples, Vocab, collate
from .metrics import Scores, evaluate_batches, lm_loss, score_batch, summarize
from .protocol import Task
from .synthetic import SyntheticTask
from .counting import Counting
from .flip_flop import FlipFlop
from .indirect_indexing import IndirectIndexing
from .selective_copy import SelectiveCopy
from .shakespeare import Shakespeare, load_plays, strip_markdown
from .corpus import CORPUS_TASKS, CorpusLM
from .mlm import MLM_TASKS, MaskedLM
from .passkey import PasskeyTask

_REGISTRY: dict[str, type] = {
    "indirect-indexing": IndirectIndexing,
    "flip-flop": FlipFlop,
    "selective-copy": SelectiveCopy,
    "counting": Counting,
    "shakespeare": Shakespeare,
    **CORPUS_TASKS,  # language modelling on real corpora (poskit.data): corpus, lm-jsb, lm-genome, ...
    **MLM_TASKS,  # masked-language modelling (BERT's objective, bidirectional models): mlm, mlm-wiki
    "passkey": PasskeyTask,  # passkey retrieval over a language-modelling task's text
}

PRESETS = ("default", "paper")


def available_tasks() -> list[str]:
    """Names accepted by :func:`build_task`."""
    return sorted(_REGISTRY)


def task_parameters(name: str) -> list[str]:
    """The keyword parameters a task accepts."""
    cls = _lookup(name)
    return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]


def task_split_names(name: str) -> tuple[str, ...]:
    """The evaluation splits of a task, known without building it (configs check their eval split with it)."""
    cls = _lookup(name)
    variants = getattr(cls, "split_variants", None)
    return tuple(variants) if variants else tuple(cls.split_names)


def task_model_defaults(name: str) -> dict:
    """ModelConfig fields a task needs by default (its class's ``model_defaults``, e.g. {"causal": False})."""
    return dict(getattr(_lookup(name), "model_defaults", {}))


def _lookup(name: str) -> type:
    if name not in _REGISTRY:
        raise ValueError(f"unknown task name {name!r}; available tasks: {available_tasks()}")
    return _REGISTRY[name]


def build_task(name: str, preset: str = "default", **params) -> Task:
    """Build a task by name.

    ``preset="default"`` uses the CPU-scale defaults; ``preset="paper"`` first applies
    the paper's sizes (the task class's ``paper_params``); explicit ``params`` override
    both.  Unknown names, presets or parameters raise ValueError.
    """
    cls = _lookup(name)
    check_choice(preset, "preset", PRESETS)
    allowed = task_parameters(name)
    for key in params:
        if key not in allowed:
            raise ValueError(f"unknown parameter {key!r} for task {name!r}; allowed parameters: {allowed}")
    kwargs = dict(getattr(cls, "paper_params", {})) if preset == "paper" else {}
    kwargs.update(params)
    return cls(**kwargs)


__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "Example",
    "PackedExamples",
    "Scores",
    "SyntheticTask",
    "Task",
    "Vocab",
    "collate",
    "evaluate_batches",
    "lm_loss",
    "score_batch",
    "summarize",
    "Counting",
    "FlipFlop",
    "IndirectIndexing",
    "SelectiveCopy",
    "Shakespeare",
    "CorpusLM",
    "MaskedLM",
    "PasskeyTask",
    "load_plays",
    "strip_markdown",
    "PRESETS",
    "available_tasks",
    "build_task",
    "task_parameters",
    "task_split_names",
    "task_model_defaults",
]
