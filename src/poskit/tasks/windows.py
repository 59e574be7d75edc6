"""Language modelling on one long token stream per split: random training windows and non-overlapping
evaluation windows (perplexity), shared by the Shakespeare task and the real-corpus tasks.

A subclass sets ``train_ids`` (a torch tensor or a numpy array, e.g. a memory-mapped token cache),
``_regions`` (split name -> token tensor), ``context``, ``eval_batch_size``, ``split_names``,
``accuracy_level`` and ``unit`` (what a token is called in error messages: "characters", "tokens").  A subclass
that offers the ``passkey_fraction`` option (:mod:`.passkey`) sets that attribute; at 0, the default, training
batches are plain windows, drawn exactly as without the option."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..util.validate import check_int, check_real
from .data import IGNORE_INDEX, Batch
from .metrics import evaluate_batches
from .passkey import mix_passkey_windows


class WindowedLM:
    unit = "tokens"
    passkey_fraction = 0.0  # fraction of training windows replaced by passkey-retrieval windows

    @property
    def max_input_len(self) -> int:
        return self.context

    def region(self, split: str) -> torch.Tensor:
        """Token ids of the held-out stream of a split."""
        if split not in self._regions:
            raise ValueError(f"split must be one of {list(self.split_names)}, got {split!r}")
        return self._regions[split]

    def train_batch(self, batch_size: int, generator: torch.Generator, step: int | None = None) -> Batch:
        """Uniformly random windows; ``step`` is accepted (the Task protocol) and does not matter here."""
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        if step is not None:
            check_int(step, "step", minimum=0)
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        starts = torch.randint(0, len(self.train_ids) - self.context, (batch_size,), generator=generator)
        index = starts[:, None] + torch.arange(self.context + 1)
        if isinstance(self.train_ids, np.ndarray):  # a memory-mapped uint16/uint32 cache: gather, then widen
            seq = torch.from_numpy(self.train_ids[index.numpy()].astype(np.int64))
        else:
            seq = self.train_ids[index]
        if self.passkey_fraction > 0:  # only then are more random numbers drawn
            seq = mix_passkey_windows(self, seq, generator)
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())

    def eval_windows(self, length: int, split: str = "test", n_chars: int | None = None,
                     last_fraction: float | None = None, batch_size: int | None = None) -> list[Batch]:
        """Non-overlapping windows of ``length`` inputs over the first ``n_chars`` tokens of a split's held-out
        stream (all of it by default). ``last_fraction`` keeps only the targets in that final fraction of each
        window (where positions beyond the training context live)."""
        length = check_int(length, "length", minimum=1)
        ids = self.region(split)
        if n_chars is not None:
            ids = ids[: check_int(n_chars, "n_chars", minimum=2, maximum=len(ids))]
        n_win = (len(ids) - 1) // length
        if n_win == 0:
            raise ValueError(f"length={length} leaves no complete window in {len(ids)} {self.unit} of {split!r}")
        inputs = ids[: n_win * length].view(n_win, length)
        targets = ids[1: n_win * length + 1].view(n_win, length).clone()
        if last_fraction is not None:
            frac = check_real(last_fraction, "last_fraction", minimum=0.0, maximum=1.0, strict=True)
            targets[:, : int(round(length * (1.0 - frac)))] = IGNORE_INDEX
        bs = self.eval_batch_size if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        return [Batch(inputs[i: i + bs], targets[i: i + bs]) for i in range(0, n_win, bs)]

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]:
        """Windows of the training context over a split's whole held-out stream."""
        return self.eval_windows(self.context, name, batch_size=batch_size)

    def evaluate(self, model: Callable[[torch.Tensor], torch.Tensor], split: str = "validation",
                 batch_size: int | None = None, device: torch.device | str | None = None, length: int | None = None,
                 n_chars: int | None = None, last_fraction: float | None = None) -> dict[str, float]:
        """Metrics (``perplexity`` first of all) on windows of ``length`` (default: the context)."""
        batches = self.eval_windows(length or self.context, split, n_chars, last_fraction, batch_size)
        return evaluate_batches(model, batches, self.accuracy_level, device)
