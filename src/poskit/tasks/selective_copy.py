"""Selective copying (Gu & Dao 2023, Mamba; CoPE paper Sec. 5.2).

A context of ``n_tokens + n_blanks`` positions holds ``n_tokens`` data tokens at
uniformly random positions (in order) and the blank token everywhere else; then
a delimiter; then the data tokens again, in order, which the model must produce:

    ``.C..F.FB.A|CFFBA``     ('.' blank, '|' delimiter)

Vocabulary of 16 task symbols as in the paper / Mamba's generator: 14 data
tokens ``A``-``N`` (i.i.d. uniform), the blank ``.``, the delimiter ``|``
(plus ``<pad>``, unused here since all sequences of a split have one length).
Loss and accuracy: the ``n_tokens`` copied tokens.  ``accuracy`` is per example
(all copied tokens right, which is what the paper's 100 % errors imply);
``token_accuracy`` is reported too.

Paper sizes (``preset="paper"``): 256 data tokens; 256 blanks for training and the
in-distribution test; 128 blanks (``ood_dense``) and 512 blanks (``ood_sparse``).
Defaults are the same ratios at 1/8 scale: 32 tokens, 32 / 16 / 64 blanks.
Splits: ``validation``, ``test``, ``ood_dense``, ``ood_sparse``.
"""

from __future__ import annotations

import string

import numpy as np

from ..util.validate import check_int
from .data import Example, Vocab
from .synthetic import SyntheticTask

BLANK = "."
DELIM = "|"


class SelectiveCopy(SyntheticTask):
    name = "selective-copy"
    accuracy_level = "sequence"
    split_variants = {"validation": "in", "test": "in", "ood_dense": "dense", "ood_sparse": "sparse"}
    paper_params = {"n_tokens": 256, "n_blanks": 256, "ood_dense_blanks": 128, "ood_sparse_blanks": 512}

    def __init__(
        self,
        n_tokens: int = 32,
        n_blanks: int = 32,
        ood_dense_blanks: int = 16,
        ood_sparse_blanks: int = 64,
        n_symbols: int = 14,
        eval_size: int = 1000,
        eval_seed: int = 0,
        eval_batch_size: int = 250,
        train_size: int | None = None,
    ) -> None:
        super().__init__(eval_size, eval_seed, eval_batch_size, train_size)
        self.n_tokens = check_int(n_tokens, "n_tokens", minimum=1)
        self.n_blanks = check_int(n_blanks, "n_blanks", minimum=0)
        self.ood_dense_blanks = check_int(ood_dense_blanks, "ood_dense_blanks", minimum=0)
        self.ood_sparse_blanks = check_int(ood_sparse_blanks, "ood_sparse_blanks", minimum=0)
        self.n_symbols = check_int(n_symbols, "n_symbols", minimum=2, maximum=26)
        self.symbols = string.ascii_uppercase[: self.n_symbols]
        self.vocab = Vocab([BLANK, DELIM] + list(self.symbols), sep="")
        self._blank_id = self.vocab.index[BLANK]
        self._delim_id = self.vocab.index[DELIM]
        self._symbol_ids = np.array(self.vocab.encode(self.symbols), dtype=np.int64)

    def blanks_of(self, variant: str) -> int:
        return {"train": self.n_blanks, "in": self.n_blanks, "dense": self.ood_dense_blanks,
                "sparse": self.ood_sparse_blanks}[variant]

    @property
    def max_input_len(self) -> int:
        return 2 * self.n_tokens + max(self.n_blanks, self.ood_dense_blanks, self.ood_sparse_blanks)

    def _generate(self, rng: np.random.Generator, n: int, variant: str) -> list[Example]:
        k, nb = self.n_tokens, self.blanks_of(variant)
        ctx = k + nb
        data = self._symbol_ids[rng.integers(0, self.n_symbols, size=(n, k))]
        pos = np.sort(np.argsort(rng.random((n, ctx)), axis=1)[:, :k], axis=1)  # uniform k-subset
        tokens = np.empty((n, ctx + 1 + k), dtype=np.int64)
        tokens[:, :ctx] = self._blank_id
        np.put_along_axis(tokens[:, :ctx], pos, data, axis=1)
        tokens[:, ctx] = self._delim_id
        tokens[:, ctx + 1 :] = data
        mask = np.zeros(tokens.shape, dtype=bool)
        mask[:, ctx + 1 :] = True
        return [Example(tokens[j], mask[j]) for j in range(n)]
