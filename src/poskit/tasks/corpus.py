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

import numpy as np
import torch

from ..util.validate import check_int, check_real
from .data import Vocab
from .passkey import check_passkey_fraction
from .protocol import Described
from .windows import WindowedLM

__all__ = ["CorpusLM", "CORPUS_TASKS"]


class CorpusLM(WindowedLM, Described):
    """Token-level LM on ``corpus`` (a name of ``poskit data list`` or ``hf:<dataset>``) with ``tokenizer``
    (default: the corpus's).  ``max_documents`` takes only the first documents (a quick slice).
    ``passkey_fraction`` > 0 replaces that fraction of the training windows by passkey-retrieval windows
    (:mod:`poskit.tasks.passkey`; a text corpus only)."""

    name = "corpus"
    metric = "perplexity"
    accuracy_level = "token"
    split_names = ("validation", "test")
    paper_params: dict = {}

    def __init__(self, corpus: str = "plays", tokenizer: str | None = None, context: int = 128,
                 max_documents: int | None = None, eval_batch_size: int = 32, passkey_fraction: float = 0.0) -> None:
        from ..data import load_corpus

        self.context = check_int(context, "context", minimum=1)
        check_real(passkey_fraction, "passkey_fraction", minimum=0.0, maximum=1.0)
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
        self.passkey_fraction = check_passkey_fraction(self, passkey_fraction)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (a text corpus's tokenizer; others read documents that are not text)."""
        tokenizer = self.data.tokenizer
        if tokenizer.payload != "text":
            raise ValueError(f"tokenizer {tokenizer.name!r} of corpus {self.corpus!r} reads {tokenizer.payload} "
                             "documents, not text")
        return [int(i) for i in tokenizer.encode(text)]

    def decode(self, ids):
        return self.data.tokenizer.decode(ids)


def _corpus_task(corpus: str, paper_context: int | None) -> type:
    """A registered task for one corpus: ``corpus`` is fixed; the paper preset sets the paper's context."""

    class _Task(CorpusLM):
        name = f"lm-{corpus}"
        paper_params = {"context": paper_context} if paper_context else {}

        def __init__(self, tokenizer: str | None = None, context: int = 128, max_documents: int | None = None,
                     eval_batch_size: int = 32, passkey_fraction: float = 0.0) -> None:
            super().__init__(corpus, tokenizer, context, max_documents, eval_batch_size, passkey_fraction)

    _Task.__name__ = _Task.__qualname__ = "LM" + corpus.capitalize()
    return _Task


def _registry() -> dict[str, type]:
    from ..data.corpora import CORPORA

    tasks = {"corpus": CorpusLM}
    tasks.update({f"lm-{n}": _corpus_task(n, s.paper_context) for n, s in CORPORA.items()})
    return tasks


CORPUS_TASKS = _registry()
