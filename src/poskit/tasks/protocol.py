"""What the trainer may rely on in a task (:class:`Task`), and how a task describes itself (:class:`Described`)."""

from __future__ import annotations

import inspect
from typing import Callable, Protocol, runtime_checkable

import torch

from .data import Batch, Vocab

__all__ = ["Task", "Described"]


@runtime_checkable
class Task(Protocol):
    """What the trainer may rely on."""

    name: str
    vocab: Vocab
    metric: str  # "accuracy", "perplexity" or "loss" (masked-language modelling): a key of evaluate()
    accuracy_level: str  # "token" or "sequence": which accuracy is the headline
    split_names: tuple[str, ...]
    max_input_len: int  # longest T any batch of this task can have (train and eval splits)
    params: dict

    def train_batch(self, batch_size: int, generator: torch.Generator, step: int | None = None) -> Batch:
        """``step`` (the training step about to be taken) matters only to a task with a curriculum; every task
        accepts it so that the trainer can pass it to all of them."""
        ...

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]: ...

    def evaluate(
        self, model: Callable[[torch.Tensor], torch.Tensor], split: str = "validation", batch_size: int | None = None
    ) -> dict[str, float]: ...


class Described:
    """A task described by its constructor's arguments: ``params`` and ``repr`` list every parameter of
    ``__init__`` with the value the task holds in the attribute of the same name (the validated value), so
    ``type(task)(**task.params)`` rebuilds an equal task.  A subclass keeps each constructor argument in an
    attribute of that name; nothing else is to declare."""

    @property
    def params(self) -> dict:
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {p: getattr(self, p) for p in names}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"
