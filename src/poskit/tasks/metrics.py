"""Scoring a model's logits on a task's batches.

Metrics (computed only on positions whose target is not -100):
``loss`` (mean cross-entropy per target token, nats), ``perplexity`` (exp(loss)),
``token_accuracy`` (argmax correct per target token), ``sequence_accuracy`` (a row
counts as correct only if all its target tokens are), and ``accuracy``: the task's
headline number, ``token_accuracy`` or ``sequence_accuracy`` as the task's
``accuracy_level`` says.  The training loss is :func:`lm_loss`:
``F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from ..util.validate import check_choice
from .data import IGNORE_INDEX, Batch

__all__ = ["Scores", "score_batch", "summarize", "evaluate_batches", "lm_loss"]


@dataclass
class Scores:
    """Sums over target positions; add batches with ``+=``, read with :meth:`summary`."""

    loss_sum: float = 0.0
    n_tokens: int = 0
    n_correct_tokens: int = 0
    n_sequences: int = 0
    n_correct_sequences: int = 0

    def __iadd__(self, other: "Scores") -> "Scores":
        self.loss_sum += other.loss_sum
        self.n_tokens += other.n_tokens
        self.n_correct_tokens += other.n_correct_tokens
        self.n_sequences += other.n_sequences
        self.n_correct_sequences += other.n_correct_sequences
        return self

    def summary(self, accuracy_level: str = "sequence") -> dict[str, float]:
        return summarize(self, accuracy_level)


def score_batch(logits: torch.Tensor, batch: Batch | torch.Tensor) -> Scores:
    """Loss and accuracy sums of ``logits`` (B, T, V) on the target positions of ``batch``.

    ``batch`` may also be the targets tensor itself.  Rows without any target do not
    count as sequences.
    """
    targets = batch.targets if isinstance(batch, Batch) else batch
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits must be (B, T, V) matching targets {tuple(targets.shape)}; got {tuple(logits.shape)}"
        )
    targets = targets.to(logits.device)
    mask = targets != IGNORE_INDEX
    logits = logits.detach().float()
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    correct = (logits.argmax(-1) == targets) & mask
    has_target = mask.any(dim=1)
    row_ok = (correct | ~mask).all(dim=1) & has_target
    return Scores(
        loss_sum=float(loss),
        n_tokens=int(mask.sum()),
        n_correct_tokens=int(correct.sum()),
        n_sequences=int(has_target.sum()),
        n_correct_sequences=int(row_ok.sum()),
    )


def summarize(scores: Scores, accuracy_level: str = "sequence") -> dict[str, float]:
    """Turn :class:`Scores` into metrics (see module docstring)."""
    check_choice(accuracy_level, "accuracy_level", ("token", "sequence"))
    nt = max(scores.n_tokens, 1)
    ns = max(scores.n_sequences, 1)
    loss = scores.loss_sum / nt
    out = {
        "loss": loss,
        "perplexity": float(np.exp(min(loss, 700.0))),
        "token_accuracy": scores.n_correct_tokens / nt,
        "sequence_accuracy": scores.n_correct_sequences / ns,
        "n_tokens": scores.n_tokens,
        "n_sequences": scores.n_sequences,
    }
    out["accuracy"] = out["token_accuracy"] if accuracy_level == "token" else out["sequence_accuracy"]
    return out


@torch.no_grad()
def evaluate_batches(
    model: Callable[[torch.Tensor], torch.Tensor],
    batches: Iterable[Batch],
    accuracy_level: str = "sequence",
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Run ``model(inputs) -> logits (B, T, V)`` on each batch and summarize."""
    total = Scores()
    for batch in batches:
        inputs = batch.inputs if device is None else batch.inputs.to(device)
        total += score_batch(model(inputs), batch)
    return summarize(total, accuracy_level)


def lm_loss(logits: torch.Tensor, batch: Batch | torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over target positions (the training loss)."""
    targets = batch.targets if isinstance(batch, Batch) else batch
    targets = targets.to(logits.device)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)
