"""Language modelling on a real corpus of :mod:`poskit.data` (``corpus``, and one registered name per corpus:
``lm-jsb``, ``lm-maestro``, ``lm-genome``, ``lm-wiki``, ``lm-plays``, ``lm-code``).

Like ``shakespeare``, with tokens instead of characters: training batches are uniformly random windows of
``context + 1`` tokens of the training stream (documents joined by the tokenizer's end-of-document token, so a
window may cross a boundary, as in GPT-2 training); evaluation windows are non-overlapping windows of the
validation or test stream (held-out whole documents).  Metric: perplexity per token (``loss``, its log, is the
NLL per token that the papers report for music and genome).  ``eval_windows(length, split, n_chars, last_fraction)`` serves
``poskit extrapolate`` (``n_chars`` counts tokens here).  ``preset="paper"`` sets the paper's sequence length.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..validate import check_int, check_real
from .data import IGNORE_INDEX, Batch, Vocab
from .metrics import evaluate_batches
from .protocol import Described

__all__ = ["CorpusLM", "CORPUS_TASKS"]


class CorpusLM(Described):
    """Token-level LM on ``corpus`` (a name of ``poskit data list`` or ``hf:<dataset>``) with ``tokenizer``
    (default: the corpus's).  ``max_documents`` takes only the first documents (a quick slice)."""

    name = "corpus"
    metric = "perplexity"
    accuracy_level = "token"
    split_names = ("validation", "test")
    paper_params: dict = {}

    def __init__(self, corpus: str = "plays", tokenizer: str | None = None, context: int = 128,
                 max_documents: int | None = None, eval_batch_size: int = 32) -> None:
        from ..data import load_corpus

        self.context = check_int(context, "context", minimum=1)
        self.eval_batch_size = check_int(eval_batch_size, "eval_batch_size", minimum=1)
        if max_documents is not None:
            check_int(max_documents, "max_documents", minimum=3)
        if not isinstance(corpus, str):
            raise ValueError(f"corpus must be a corpus name (see `poskit data list`), got {corpus!r}")
        if tokenizer is not None and not isinstance(tokenizer, str):
            raise ValueError(f"tokenizer must be a tokenizer name or None, got {tokenizer!r}")
        self.corpus, self.tokenizer, self.max_documents = corpus, tokenizer, max_documents
        self.data = load_corpus(corpus, tokenizer, max_documents)
        self.vocab = Vocab(self.data.tokenizer.tokens, sep="")
        # int64 copies of the (small) held-out streams; training windows are gathered from the memory map
        self.train_ids = self.data.tokens("train")
        self._regions = {s: torch.from_numpy(self.data.tokens(s).astype(np.int64)) for s in self.split_names}
        if len(self.train_ids) <= self.context + 1:
            raise ValueError(f"the training stream of {corpus!r} ({len(self.train_ids)} tokens) is shorter than "
                             f"one window of context={self.context}")

    @property
    def max_input_len(self) -> int:
        return self.context

    def region(self, split: str) -> torch.Tensor:
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
        starts = torch.randint(0, len(self.train_ids) - self.context, (batch_size,), generator=generator).numpy()
        seq = torch.from_numpy(self.train_ids[starts[:, None] + np.arange(self.context + 1)].astype(np.int64))
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())

    def eval_windows(self, length: int, split: str = "test", n_chars: int | None = None,
                     last_fraction: float | None = None, batch_size: int | None = None) -> list[Batch]:
        """Non-overlapping windows of ``length`` inputs over the first ``n_chars`` tokens of a split (all by
        default); ``last_fraction`` keeps only the targets in that final fraction of each window."""
        length = check_int(length, "length", minimum=1)
        ids = self.region(split)
        if n_chars is not None:
            ids = ids[: check_int(n_chars, "n_chars", minimum=2, maximum=len(ids))]
        n_win = (len(ids) - 1) // length
        if n_win == 0:
            raise ValueError(f"length={length} leaves no complete window in {len(ids)} tokens of {split!r}")
        inputs = ids[: n_win * length].view(n_win, length)
        targets = ids[1: n_win * length + 1].view(n_win, length).clone()
        if last_fraction is not None:
            frac = check_real(last_fraction, "last_fraction", minimum=0.0, maximum=1.0, strict=True)
            targets[:, : int(round(length * (1.0 - frac)))] = IGNORE_INDEX
        bs = self.eval_batch_size if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        return [Batch(inputs[i: i + bs], targets[i: i + bs]) for i in range(0, n_win, bs)]

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]:
        return self.eval_windows(self.context, name, batch_size=batch_size)

    def evaluate(self, model: Callable[[torch.Tensor], torch.Tensor], split: str = "validation",
                 batch_size: int | None = None, device: torch.device | str | None = None, length: int | None = None,
                 n_chars: int | None = None, last_fraction: float | None = None) -> dict[str, float]:
        batches = self.eval_windows(length or self.context, split, n_chars, last_fraction, batch_size)
        return evaluate_batches(model, batches, self.accuracy_level, device)

    def decode(self, ids):
        return self.data.tokenizer.decode(ids)


def _corpus_task(corpus: str, paper_context: int | None) -> type:
    """A registered task for one corpus: ``corpus`` is fixed; the paper preset sets the paper's context."""

    class _Task(CorpusLM):
        name = f"lm-{corpus}"
        paper_params = {"context": paper_context} if paper_context else {}

        def __init__(self, tokenizer: str | None = None, context: int = 128, max_documents: int | None = None,
                     eval_batch_size: int = 32) -> None:
            super().__init__(corpus, tokenizer, context, max_documents, eval_batch_size)

    _Task.__name__ = _Task.__qualname__ = "LM" + corpus.capitalize()
    return _Task


def _registry() -> dict[str, type]:
    from ..data.corpora import CORPORA

    tasks = {"corpus": CorpusLM}
    tasks.update({f"lm-{n}": _corpus_task(n, s.paper_context) for n, s in CORPORA.items()})
    return tasks


CORPUS_TASKS = _registry()
