"""Flip-flop language modeling (Liu et al. 2023, "Exposing attention glitches with
flip-flop language modeling"; CoPE paper Sec. 5.1 and App. C).

A sequence is ``length`` tokens: ``length / 2`` (instruction, bit) pairs.
Instructions are ``w`` (write), ``r`` (read), ``i`` (ignore).  The first
instruction is always ``w`` and the last always ``r``; the ones in between are
i.i.d. with probabilities (p_w, p_r, p_i) = ((1 - p_i) / 2, (1 - p_i) / 2, p_i)
(Liu et al.'s FFL(T, p) family).  The bit after ``w`` or ``i`` is uniform; the bit
after ``r`` is the bit of the most recent ``w``.  Example: ``w0i1r0w1i0i1r1``.

Loss and accuracy: the bits that follow ``r`` (the only deterministic tokens),
every read including the final one.  ``accuracy`` is per read
(``token_accuracy``); ``sequence_accuracy`` (all reads of a sequence right) is
reported too.  ``train_loss_on="all"`` trains on every next token instead (Liu et
al.'s plain LM objective); evaluation splits always score reads only.

Distributions (Liu et al.): in-distribution FFL(p_i = 0.8), sequence length
T = 512; the out-of-distribution "sparse" set has p_i = 0.98 (longer distances to
the last write: the OOD set the CoPE paper uses, "increasing the number of ignore
instructions"); Liu et al.'s "dense" set has p_i = 0.1.

Defaults: ``length=256`` (CPU scale); ``preset="paper"`` gives 512.
Splits: ``validation``, ``test`` (p_i = p_ignore), ``ood_sparse`` (p_i =
ood_sparse_p_ignore), ``ood_dense`` (p_i = ood_dense_p_ignore).
"""

from __future__ import annotations

import numpy as np

from ..util.validate import check_choice, check_int, check_real
from .data import Example, Vocab
from .synthetic import SyntheticTask

INSTR = ("w", "r", "i")


class FlipFlop(SyntheticTask):
    name = "flip-flop"
    accuracy_level = "token"
    split_variants = {"validation": "in", "test": "in", "ood_sparse": "sparse", "ood_dense": "dense"}
    paper_params = {"length": 512, "p_ignore": 0.8, "ood_sparse_p_ignore": 0.98, "ood_dense_p_ignore": 0.1}

    def __init__(
        self,
        length: int = 256,
        p_ignore: float = 0.8,
        ood_sparse_p_ignore: float = 0.98,
        ood_dense_p_ignore: float = 0.1,
        train_loss_on: str = "reads",
        eval_size: int = 1000,
        eval_seed: int = 0,
        eval_batch_size: int = 250,
        train_size: int | None = None,
    ) -> None:
        super().__init__(eval_size, eval_seed, eval_batch_size, train_size)
        self.length = check_int(length, "length", minimum=4)
        if self.length % 2:
            raise ValueError(f"length must be even (instruction/bit pairs), got {length}")
        # probabilities of an ignore instruction; 1 would leave no write or read to learn from
        self.p_ignore, self.ood_sparse_p_ignore, self.ood_dense_p_ignore = (
            check_real(value, name, minimum=0.0, maximum=1.0, strict_maximum=True)
            for value, name in ((p_ignore, "p_ignore"), (ood_sparse_p_ignore, "ood_sparse_p_ignore"),
                                (ood_dense_p_ignore, "ood_dense_p_ignore"))
        )
        self.train_loss_on = check_choice(train_loss_on, "train_loss_on", ("reads", "all"))
        self.vocab = Vocab(["w", "r", "i", "0", "1"], sep="")
        self._instr_ids = np.array(self.vocab.encode(list(INSTR)), dtype=np.int64)
        self._bit_ids = np.array(self.vocab.encode(["0", "1"]), dtype=np.int64)

    @property
    def max_input_len(self) -> int:
        return self.length - 1

    def p_ignore_of(self, variant: str) -> float:
        return {"train": self.p_ignore, "in": self.p_ignore, "sparse": self.ood_sparse_p_ignore,
                "dense": self.ood_dense_p_ignore}[variant]

    def sample_arrays(self, rng: np.random.Generator, n: int, p_ignore: float) -> tuple[np.ndarray, np.ndarray]:
        """(n, length/2) instruction codes (0=w, 1=r, 2=i) and bits, consistent reads."""
        m = self.length // 2
        p_w = (1.0 - p_ignore) / 2
        u = rng.random((n, m))
        instr = np.where(u < p_w, 0, np.where(u < 2 * p_w, 1, 2))
        instr[:, 0] = 0
        instr[:, -1] = 1
        bits = rng.integers(0, 2, size=(n, m))
        idx = np.arange(m)
        last_w = np.maximum.accumulate(np.where(instr == 0, idx, -1), axis=1)  # >= 0 since instr[:, 0] == w
        bits = np.where(instr == 1, np.take_along_axis(bits, last_w, axis=1), bits)
        return instr, bits

    def _generate(self, rng: np.random.Generator, n: int, variant: str) -> list[Example]:
        instr, bits = self.sample_arrays(rng, n, self.p_ignore_of(variant))
        tokens = np.empty((n, self.length), dtype=np.int64)
        tokens[:, 0::2] = self._instr_ids[instr]
        tokens[:, 1::2] = self._bit_ids[bits]
        mask = np.zeros((n, self.length), dtype=bool)
        if variant == "train" and self.train_loss_on == "all":
            mask[:, 1:] = True
        else:
            mask[:, 1::2] = instr == 1
        return [Example(tokens[k], mask[k]) for k in range(n)]
