"""Masked-language modelling (BERT's pre-training objective) on a real corpus of :mod:`poskit.data`: ``mlm``
(``corpus`` an option, default ``wiki``) and ``mlm-wiki``.

Train a bidirectional model on it (``model.causal=false``). Training batches are uniformly random windows of
``context`` tokens of the training stream (documents joined by the end-of-document token, packed across
documents as RoBERTa's FULL-SENTENCES input does), corrupted by BERT's 15 % selection and 80/10/10 replacement
(:mod:`.masking`; end-of-document tokens are never chosen). The loss is taken only at the chosen positions.
Evaluation: non-overlapping windows of the held-out stream, masked once with ``eval_seed`` (the same positions
and replacements for every model and every evaluation). Metrics: ``loss`` (the MLM loss, mean cross-entropy per
masked token: RoFormer's comparison metric, sec. 4.2) and ``accuracy`` (masked-token accuracy).

Token ids: the corpus tokenizer's (GPT-2 BPE for wiki) reduced to ``vocab_size`` ids (:mod:`.mlm_vocab`: the
most frequent tokens of the training split, rarer ones spelled as bytes), or all of them with
``vocab_size=None``; ``[MASK]`` is the last id.
"""
from __future__ import annotations

import zlib
from typing import Callable

import numpy as np
import torch

from ..util.validate import check_int, is_int
from .data import Batch, Vocab
from .masking import bert_mask, check_mask_probabilities
from .metrics import evaluate_batches
from .protocol import Described
from .mlm_vocab import MIN_REDUCED, MLMVocabulary, full_vocabulary, reduced_vocabulary

__all__ = ["MaskedLM", "MaskedLMWiki", "MLM_TASKS"]


class MaskedLM(Described):
    """BERT-style MLM on ``corpus`` (a name of ``poskit data list`` or ``hf:<dataset>``) with ``tokenizer``
    (default: the corpus's), ``vocab_size`` ids in all (None: the tokenizer's, plus ``[MASK]``)."""

    name = "mlm"
    metric = "loss"
    accuracy_level = "token"
    split_names = ("validation", "test")
    paper_params = {"context": 512, "vocab_size": None}  # RoFormer 4.2: sequences of 512; BERT's ~30k vocabulary
    model_defaults = {"causal": False}  # BERT: every token sees the whole window (`poskit train` default)

    def __init__(self, corpus: str = "wiki", tokenizer: str | None = None, vocab_size: int | None = 8192,
                 context: int = 128, select_prob: float = 0.15, mask_prob: float = 0.8, random_prob: float = 0.1,
                 max_documents: int | None = None, eval_batch_size: int = 32, eval_seed: int = 0) -> None:
        from ..data import build_tokenizer, get_corpus, load_corpus

        # every argument is checked before the corpus is read
        if not isinstance(corpus, str):
            raise ValueError(f"corpus must be a corpus name (see `poskit data list`), got {corpus!r}")
        if tokenizer is not None and not isinstance(tokenizer, str):
            raise ValueError(f"tokenizer must be a tokenizer name or None, got {tokenizer!r}")
        if vocab_size is not None and not (is_int(vocab_size) and vocab_size >= MIN_REDUCED):
            raise ValueError(f"vocab_size must be an int >= {MIN_REDUCED} or None (the tokenizer's full "
                             f"vocabulary), got {vocab_size!r}")
        self.context = check_int(context, "context", minimum=2)
        self.select_prob, self.mask_prob, self.random_prob = check_mask_probabilities(select_prob, mask_prob,
                                                                                      random_prob)
        if max_documents is not None:
            check_int(max_documents, "max_documents", minimum=3)
        self.eval_batch_size = check_int(eval_batch_size, "eval_batch_size", minimum=1)
        self.eval_seed = check_int(eval_seed, "eval_seed", minimum=0)
        self.corpus, self.tokenizer, self.vocab_size, self.max_documents = corpus, tokenizer, vocab_size, max_documents
        if vocab_size is not None and not hasattr(build_tokenizer(tokenizer or get_corpus(corpus).tokenizer),
                                                  "token_bytes"):
            raise ValueError(f"vocab_size: a reduced vocabulary spells rare tokens as bytes, which tokenizer "
                             f"{tokenizer!r} cannot do; use the gpt2 tokenizer or vocab_size=None (its full vocabulary)")

        self.data = load_corpus(corpus, tokenizer, max_documents)
        source = {s: self.data.tokens(s) for s in ("train", *self.split_names)}
        tok = self.data.tokenizer
        self.ids: MLMVocabulary = (full_vocabulary(tok) if vocab_size is None
                                   else reduced_vocabulary(tok, source["train"], vocab_size))
        self.vocab = Vocab(self.ids.tokens, sep="")
        self.mask_id = self.ids.mask_id
        self._ordinary = torch.from_numpy(self.ids.ordinary_ids)
        self.streams = {s: torch.from_numpy(self.ids.map_stream(a)) for s, a in source.items()}
        if len(self.streams["train"]) <= self.context:
            raise ValueError(f"the training stream of {corpus!r} ({len(self.streams['train'])} tokens) is shorter "
                             f"than one window of context={self.context}")
        self._eval_cache: dict[str, list] = {}

    @property
    def max_input_len(self) -> int:
        return self.context

    def decode(self, ids) -> str:
        return self.ids.decode(ids)

    def encode_text(self, text: str) -> np.ndarray:
        """A text's ids in this task's vocabulary (what fine-tuning on GLUE feeds the pretrained encoder)."""
        return self.ids.map_stream(self.data.tokenizer.encode(text))

    def corrupt(self, windows: torch.Tensor, generator: torch.Generator):
        """BERT's masking of (B, context) windows with ``generator``: a Batch (corrupted inputs, targets)."""
        return bert_mask(windows, generator, mask_id=self.mask_id, ordinary_ids=self._ordinary,
                         eligible=windows != self.ids.eos_id, select_prob=self.select_prob,
                         mask_prob=self.mask_prob, random_prob=self.random_prob)

    def train_batch(self, batch_size: int, generator: torch.Generator, step: int | None = None):
        """Random windows, masked with draws from ``generator``; ``step`` is accepted (the Task protocol)."""
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        if step is not None:
            check_int(step, "step", minimum=0)
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        stream = self.streams["train"]
        starts = torch.randint(0, len(stream) - self.context + 1, (batch_size,), generator=generator)
        return self.corrupt(stream[starts[:, None] + torch.arange(self.context)], generator)

    def split(self, name: str, batch_size: int | None = None) -> list:
        """The held-out stream of ``name`` in non-overlapping windows of ``context``, masked with a generator
        seeded by ``eval_seed`` and the split's name: the same batches on every call."""
        if name not in self.split_names:
            raise ValueError(f"split must be one of {list(self.split_names)}, got {name!r}")
        bs = self.eval_batch_size if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        if name not in self._eval_cache:
            stream = self.streams[name]
            n_win = len(stream) // self.context
            if n_win == 0:
                raise ValueError(f"the {name} stream ({len(stream)} tokens) holds no window of context={self.context}")
            windows = stream[: n_win * self.context].view(n_win, self.context)
            gen = torch.Generator().manual_seed(self.eval_seed * 1_000_003 + zlib.crc32(name.encode()))
            self._eval_cache[name] = [self.corrupt(windows, gen)]
        (whole,) = self._eval_cache[name]
        return [Batch(whole.inputs[i: i + bs], whole.targets[i: i + bs]) for i in range(0, len(whole), bs)]

    def evaluate(self, model: Callable[[torch.Tensor], torch.Tensor], split: str = "validation",
                 batch_size: int | None = None, device: torch.device | str | None = None) -> dict[str, float]:
        """``loss`` (MLM loss per masked token), ``accuracy`` (masked-token accuracy), ``perplexity``."""
        return evaluate_batches(model, self.split(split, batch_size), self.accuracy_level, device)


class MaskedLMWiki(MaskedLM):
    """``mlm`` on the offline Wikipedia extract (``poskit data fetch wiki``)."""

    name = "mlm-wiki"

    def __init__(self, tokenizer: str | None = None, vocab_size: int | None = 8192, context: int = 128,
                 select_prob: float = 0.15, mask_prob: float = 0.8, random_prob: float = 0.1,
                 max_documents: int | None = None, eval_batch_size: int = 32, eval_seed: int = 0) -> None:
        super().__init__("wiki", tokenizer, vocab_size, context, select_prob, mask_prob, random_prob, max_documents,
                         eval_batch_size, eval_seed)


MLM_TASKS = {"mlm": MaskedLM, "mlm-wiki": MaskedLMWiki}
