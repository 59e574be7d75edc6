"""Indirect Indexing (PoPE paper, Sec. 4 and App. B.1).

An example is ``<source string>,<source char>,<shift>,<target char>``, e.g.
``NZTUIGWkXFrhCJDzscat,N,+4,I``: the target is the character ``shift`` places
right (+) or left (-) of the source character in the source string.

Generation (paper: "source strings of length between 20 and 40 characters from
[A-Z] and [a-z] by uniform sampling without replacement; shifts uniformly in
[-15, +15]"):

1. length L ~ Uniform{min_len..max_len};
2. the string is L distinct letters drawn uniformly without replacement from the
   52 letters;
3. shift s ~ Uniform{-max_shift..+max_shift} (0 excluded if ``allow_zero_shift`` is
   False).  ``max_shift <= min_len - 1`` is required so that every shift fits every
   string, which keeps the marginal of s exactly uniform;
4. the source index i ~ Uniform over the indices with 0 <= i + s < L;
5. target = string[i + s].

Format: character-level, no spaces (the paper's listing shows ", " for legibility,
but its tokenizer has only letters, digits, ',', '+' and '-').  The shift always
carries its sign, as in all of the paper's samples (``+4``, ``-8``); a zero shift
is written ``+0``.  Multi-digit shifts are one token per digit.
Loss and accuracy: the final (target) token only.

Splits: ``validation``, ``test`` (paper: 10k each; default ``eval_size`` 1000).
Paper training set: 1M examples (``train_size=1_000_000`` reproduces a finite set;
default: fresh examples every batch).  Note the paper's Table 7 lists a sequence
length of 40, shorter than its longest examples (48 tokens); we never truncate.
"""

from __future__ import annotations

import string

import numpy as np

from .base import Example, SyntheticTask, Vocab, check_int

LETTERS = string.ascii_uppercase + string.ascii_lowercase
DIGITS = string.digits


class IndirectIndexing(SyntheticTask):
    name = "indirect-indexing"
    accuracy_level = "sequence"  # one target per example: token == sequence accuracy
    split_variants = {"validation": "in", "test": "in"}
    paper_params = {"min_len": 20, "max_len": 40, "max_shift": 15, "eval_size": 10_000}

    def __init__(
        self,
        min_len: int = 20,
        max_len: int = 40,
        max_shift: int = 15,
        allow_zero_shift: bool = True,
        eval_size: int = 1000,
        eval_seed: int = 0,
        eval_batch_size: int = 250,
        train_size: int | None = None,
    ) -> None:
        super().__init__(eval_size, eval_seed, eval_batch_size, train_size)
        self.min_len = check_int("min_len", min_len, 2, len(LETTERS))
        self.max_len = check_int("max_len", max_len, self.min_len, len(LETTERS))
        if not isinstance(allow_zero_shift, bool):
            raise ValueError(f"allow_zero_shift must be True or False, got {allow_zero_shift!r}")
        self.allow_zero_shift = allow_zero_shift
        self.max_shift = check_int("max_shift", max_shift, 0 if allow_zero_shift else 1, self.min_len - 1)
        self._params = dict(
            min_len=self.min_len, max_len=self.max_len, max_shift=self.max_shift,
            allow_zero_shift=allow_zero_shift, eval_size=self.eval_size, eval_seed=self.eval_seed,
            eval_batch_size=self.eval_batch_size, train_size=self.train_size,
        )
        self.vocab = Vocab(list(LETTERS) + list(DIGITS) + [",", "+", "-"], sep="")
        self._shifts = np.array(
            [s for s in range(-self.max_shift, self.max_shift + 1) if s != 0 or allow_zero_shift], dtype=np.int64
        )

    @property
    def max_input_len(self) -> int:
        # string , char , sign digits , target   (minus the last token)
        return self.max_len + 1 + 1 + 1 + 1 + len(str(self.max_shift)) + 1 + 1 - 1

    @staticmethod
    def format_shift(shift: int) -> str:
        return ("+" if shift >= 0 else "-") + str(abs(shift))

    def sample_raw(self, rng: np.random.Generator) -> tuple[str, int, int, str]:
        """(source string, source index, shift, target char) of one example."""
        L = int(rng.integers(self.min_len, self.max_len + 1))
        letters = rng.permutation(len(LETTERS))[:L]
        s = int(self._shifts[rng.integers(len(self._shifts))])
        lo, hi = max(0, -s), min(L - 1, L - 1 - s)
        i = int(rng.integers(lo, hi + 1))
        src = "".join(LETTERS[j] for j in letters)
        return src, i, s, src[i + s]

    def format_example(self, src: str, i: int, s: int) -> str:
        return f"{src},{src[i]},{self.format_shift(s)},{src[i + s]}"

    def _generate(self, rng: np.random.Generator, n: int, variant: str) -> list[Example]:
        out = []
        for _ in range(n):
            src, i, s, _ = self.sample_raw(rng)
            tokens = np.array(self.vocab.encode(self.format_example(src, i, s)), dtype=np.int64)
            mask = np.zeros(len(tokens), dtype=bool)
            mask[-1] = True
            out.append(Example(tokens, mask))
        return out
