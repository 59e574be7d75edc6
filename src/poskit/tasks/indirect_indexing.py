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

What the paper leaves implicit, and poskit's reading:
* a shift that would leave the string never occurs: the shift is drawn first and the
  source character among those it fits (steps 3-4), so "shifts uniformly in [-15, +15]"
  holds literally.  Drawing (i, s) and rejecting the pairs that leave the string would
  instead make |s| = 15 about half as frequent as s = 0 on 20-letter strings;
* 0 is in the written range [-15, +15], so shift 0 occurs (1 in 31: copy the source
  character); ``allow_zero_shift=False`` leaves it out;
* the length is uniform over 20..40 (the paper does not name its distribution).
The paper's printed samples do not all follow its own definition (its first listed
sample is off by one: -8 from 'c' is 'n', not 'b'; its third repeats 'A', which sampling
without replacement cannot; the Sec. 4 example has a digit '1' inside the string); poskit
follows the written definition.

Format: character-level, no spaces (the paper's listing shows ", " for legibility,
but its tokenizer has only letters, digits, ',', '+' and '-').  The shift always
carries its sign, as in all of the paper's samples (``+4``, ``-8``); a zero shift
is written ``+0``.  Multi-digit shifts are one token per digit.
Loss and accuracy: the final (target) token only ("the model is given the entire
sequence except the target character").

Splits: ``validation``, ``test`` (paper: 10k each; default ``eval_size`` 1000).
Training: the paper's fixed 1M examples are ``train_size=1_000_000`` (the ``paper``
preset; drawn once from a fixed seed, disjoint from the splits, stored as uint8
arrays: about 58 MB, built in about 40 s on one CPU core); default: fresh examples
every batch.  Note the paper's Table 7 lists a sequence length of 40, shorter than its
longest examples (48 tokens); we never truncate.

Cheaper variants (options; each keeps the task's two steps, a content match that finds
the source character, then pointer arithmetic from it; numbers measured with any of them
are not the paper's Table 1):
* ``n_queries=k``: k queries on one string, ``<string>,<c1>,<s1>,<t1>,...,<ck>,<sk>,<tk>``,
  every target scored (k times the supervision per sequence).  The queries are drawn
  independently (steps 3-5 repeated); the headline accuracy becomes per query (token
  accuracy), each query being one paper example;
* ``alphabet_size=a``: strings over the first a letters of A-Z, a-z (a >= max_len, since
  letters are drawn without replacement); ``min_len``/``max_len`` shorten the strings;
* ``curriculum="length"`` or ``"shift"`` with ``curriculum_steps=N``: training batches
  of step t draw strings no longer than (or shifts no larger in magnitude than) a cap that
  grows in equal stages from ``min_len`` (from 0, or 1 without zero shifts) at step 0 to
  ``max_len`` (``max_shift``) by step N; from step N on, the paper's distribution.  The
  evaluation splits always use the full distribution.  Needs the step:
  ``train_batch(batch_size, generator, step=...)``; not combinable with ``train_size``.
"""

from __future__ import annotations

import string

import numpy as np

from ..util.validate import check_bool, check_choice, check_int
from .data import Example, Vocab
from .synthetic import SyntheticTask

LETTERS = string.ascii_uppercase + string.ascii_lowercase
DIGITS = string.digits
CURRICULA = ("length", "shift")


class IndirectIndexing(SyntheticTask):
    name = "indirect-indexing"
    accuracy_level = "sequence"  # one target per example: token == sequence accuracy (per query with n_queries)
    split_variants = {"validation": "in", "test": "in"}
    paper_params = {"min_len": 20, "max_len": 40, "max_shift": 15, "eval_size": 10_000, "train_size": 1_000_000}

    def __init__(
        self,
        min_len: int = 20,
        max_len: int = 40,
        max_shift: int = 15,
        allow_zero_shift: bool = True,
        alphabet_size: int = len(LETTERS),
        n_queries: int = 1,
        curriculum: str | None = None,
        curriculum_steps: int | None = None,
        eval_size: int = 1000,
        eval_seed: int = 0,
        eval_batch_size: int = 250,
        train_size: int | None = None,
    ) -> None:
        super().__init__(eval_size, eval_seed, eval_batch_size, train_size)
        self.alphabet_size = check_int(alphabet_size, "alphabet_size", minimum=2, maximum=len(LETTERS))
        self.min_len = check_int(min_len, "min_len", minimum=2, maximum=self.alphabet_size)
        self.max_len = check_int(max_len, "max_len", minimum=self.min_len, maximum=self.alphabet_size)
        self.allow_zero_shift = check_bool(allow_zero_shift, "allow_zero_shift")
        self.max_shift = check_int(max_shift, "max_shift", minimum=0 if allow_zero_shift else 1,
                                   maximum=self.min_len - 1)
        self.n_queries = check_int(n_queries, "n_queries", minimum=1)
        self.curriculum = None if curriculum is None else check_choice(curriculum, "curriculum", CURRICULA)
        if (curriculum is None) != (curriculum_steps is None):
            raise ValueError(f"curriculum and curriculum_steps go together (both set or both None), got "
                             f"curriculum={curriculum!r}, curriculum_steps={curriculum_steps!r}")
        self.curriculum_steps = None if curriculum_steps is None else check_int(
            curriculum_steps, "curriculum_steps", minimum=1)
        if curriculum is not None and train_size is not None:
            raise ValueError("a curriculum draws fresh training examples for each step; it cannot be combined with "
                             f"a fixed training set (train_size={train_size}): set train_size=None")
        if self.n_queries > 1:
            self.accuracy_level = "token"  # per query: each query is one example of the paper's task
        self.letters = LETTERS[: self.alphabet_size]
        self.vocab = Vocab(list(self.letters) + list(DIGITS) + [",", "+", "-"], sep="")
        self._shifts = self.shifts_up_to(self.max_shift)

    @property
    def max_input_len(self) -> int:
        # string, then per query: , char , sign digits , target   (minus the last token)
        return self.max_len + self.n_queries * (1 + 1 + 1 + 1 + len(str(self.max_shift)) + 1 + 1) - 1

    def shifts_up_to(self, limit: int) -> np.ndarray:
        """The shifts with magnitude <= ``limit`` that the task allows, in increasing order."""
        return np.array([s for s in range(-limit, limit + 1) if s != 0 or self.allow_zero_shift], dtype=np.int64)

    @staticmethod
    def format_shift(shift: int) -> str:
        return ("+" if shift >= 0 else "-") + str(abs(shift))

    # -- curriculum
    def curriculum_cap(self, step: int) -> int:
        """The largest string length (curriculum "length") or shift magnitude ("shift") of training step
        ``step``: equal stages from the smallest value to the paper's, reached by ``curriculum_steps``."""
        if self.curriculum is None:
            raise ValueError("curriculum_cap() needs a curriculum (curriculum='length' or 'shift')")
        lo, hi = ((self.min_len, self.max_len) if self.curriculum == "length"
                  else (0 if self.allow_zero_shift else 1, self.max_shift))
        return lo + min(hi - lo, step * (hi - lo + 1) // self.curriculum_steps)

    def train_variant(self, step: int | None) -> str:
        if self.curriculum is None:
            return "train"
        if step is None:
            raise ValueError(f"curriculum={self.curriculum!r} needs the training step: "
                             "call train_batch(batch_size, generator, step=...)")
        return f"{self.curriculum}<={self.curriculum_cap(step)}"

    def _limits(self, variant: str) -> tuple[int, np.ndarray]:
        """(longest string, allowed shifts) of a generation variant."""
        if "<=" not in variant:
            return self.max_len, self._shifts
        axis, cap = variant.split("<=")
        return (int(cap), self._shifts) if axis == "length" else (self.max_len, self.shifts_up_to(int(cap)))

    # -- generation
    def sample_raw(self, rng: np.random.Generator, max_len: int | None = None,
                   shifts: np.ndarray | None = None) -> tuple[str, list[tuple[int, int, str]]]:
        """(source string, [(source index, shift, target char)] for each of the ``n_queries`` queries)."""
        max_len = self.max_len if max_len is None else max_len
        shifts = self._shifts if shifts is None else shifts
        L = int(rng.integers(self.min_len, max_len + 1))
        src = "".join(self.letters[j] for j in rng.permutation(self.alphabet_size)[:L])
        queries = []
        for _ in range(self.n_queries):
            s = int(shifts[rng.integers(len(shifts))])
            i = int(rng.integers(max(0, -s), min(L - 1, L - 1 - s) + 1))
            queries.append((i, s, src[i + s]))
        return src, queries

    def format_query(self, src: str, i: int, s: int) -> str:
        """``,<source char>,<shift>,<target char>``: what follows the string for one query."""
        return f",{src[i]},{self.format_shift(s)},{src[i + s]}"

    def _generate(self, rng: np.random.Generator, n: int, variant: str) -> list[Example]:
        max_len, shifts = self._limits(variant)
        out = []
        for _ in range(n):
            src, queries = self.sample_raw(rng, max_len, shifts)
            parts = [src] + [self.format_query(src, i, s) for i, s, _ in queries]
            tokens = np.array(self.vocab.encode("".join(parts)), dtype=np.int64)
            mask = np.zeros(len(tokens), dtype=bool)
            mask[np.cumsum([len(p) for p in parts])[1:] - 1] = True  # the last token of each query: its target
            out.append(Example(tokens, mask))
        return out
