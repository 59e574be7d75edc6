"""The procedurally generated tasks' common machinery: fixed evaluation splits, the training stream or fixed
training set, and the guarantees between them.

* ``task.train_batch(batch_size, generator)`` draws fresh training examples; the only randomness used is one
  62-bit integer drawn from ``generator``, so the batch is a deterministic function of the generator's state.
  Training examples that equal an example of any evaluation split are dropped and replaced by the next ones
  of the same stream, so no model is ever trained on an example it is scored on (this matters where the
  example space is small: short counting programs recur often; for long flip-flop or copy sequences it never
  triggers and the stream is the generator's own).
* With ``train_size`` set, training draws (with replacement, by ``generator``) from a fixed training set of
  that many examples, generated once from its own seed path and kept as :class:`PackedExamples`.
* ``task.split(name, batch_size)`` returns the fixed evaluation split ``name`` (one of ``task.split_names``)
  as a list of batches.  Split examples come from numpy generators seeded with ``(eval_seed, crc32(task
  name), crc32(split name))``, a seed path distinct from the training path.  Splits are made in the order of
  ``split_names`` (validation first); each drops the examples that occur in an earlier split or earlier in
  itself and tops itself up from its own stream, so every split keeps its documented size, holds no example
  twice, and all splits are pairwise disjoint.  A task whose example space is too small for that raises
  ValueError.
* ``task.evaluate(model, split)`` runs ``model(inputs) -> logits (B, T, V)`` over a split and returns the
  metrics of :func:`poskit.tasks.metrics.summarize`.
"""

from __future__ import annotations

import zlib
from typing import Callable, Iterable

import numpy as np
import torch

from ..util.validate import check_choice, check_int
from .data import Batch, Example, PackedExamples, Vocab, collate, rng_from_generator
from .metrics import evaluate_batches
from .protocol import Described

__all__ = ["SyntheticTask", "POOL_CHUNK"]

#: the fixed training set is generated and packed this many examples at a time, so that building 1M examples
#: never holds 1M Python objects at once.  A per-example generator (Indirect Indexing) draws the same examples
#: in chunks as in one go; a vectorised one draws different ones, but only for sets larger than one chunk.
POOL_CHUNK = 65_536


def _stable_hash(s: str) -> int:
    return zlib.crc32(s.encode("utf-8"))


class SyntheticTask(Described):
    """Base of the procedurally generated tasks.

    Subclasses set ``name``, ``vocab``, ``accuracy_level``, ``split_variants``
    (split name -> generation variant; "train" is the training variant), and
    implement ``_generate(rng, n, variant) -> list[Example]`` and ``max_input_len``;
    a task whose training distribution changes with the step (a curriculum)
    overrides :meth:`train_variant`.

    Shared parameters: ``eval_size`` (examples per evaluation split), ``eval_seed``
    (base seed of the evaluation splits), ``eval_batch_size`` (default batch size of
    :meth:`split`), ``train_size`` (None: every training batch is fresh; an integer:
    training examples are drawn with replacement from a fixed pool of that many
    examples, generated once from its own fixed seed, with evaluation examples
    removed - the papers' finite training sets).
    """

    name: str = ""
    metric: str = "accuracy"
    accuracy_level: str = "sequence"
    split_variants: dict[str, str] = {}
    paper_params: dict = {}
    vocab: Vocab

    def __init__(self, eval_size: int = 1000, eval_seed: int = 0, eval_batch_size: int = 250,
                 train_size: int | None = None) -> None:
        self.eval_size = check_int(eval_size, "eval_size", minimum=1)
        self.eval_seed = check_int(eval_seed, "eval_seed", minimum=0)
        self.eval_batch_size = check_int(eval_batch_size, "eval_batch_size", minimum=1)
        self.train_size = None if train_size is None else check_int(train_size, "train_size", minimum=1)
        self._split_cache: dict[str, list[Example]] = {}
        self._pool: PackedExamples | None = None
        self._eval_keys: set[bytes] | None = None

    # -- to implement
    def _generate(self, rng: np.random.Generator, n: int, variant: str) -> list[Example]:
        raise NotImplementedError

    @property
    def max_input_len(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def train_variant(self, step: int | None) -> str:
        """The generation variant of the training batch for ``step``: "train" unless a curriculum says
        otherwise."""
        return "train"

    # -- common
    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.split_variants)

    def _split_rng(self, split: str) -> np.random.Generator:
        return np.random.default_rng([self.eval_seed, _stable_hash(self.name), _stable_hash(split)])

    def train_batch(self, batch_size: int, generator: torch.Generator, step: int | None = None) -> Batch:
        """``batch_size`` training examples, a deterministic function of ``generator``'s state (and of ``step``
        for a task with a curriculum), none of them an example of an evaluation split."""
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        if step is not None:
            check_int(step, "step", minimum=0)
        variant = self.train_variant(step)
        if self.train_size is None:
            rng = rng_from_generator(generator)
            examples = self._fill(rng, batch_size, variant, self.eval_keys(),
                                  "training examples disjoint from the evaluation splits")
            return collate(examples, self.vocab.pad_id)
        pool = self.train_pool()
        idx = torch.randint(0, len(pool), (batch_size,), generator=generator).tolist()
        return pool.batch(idx)

    def train_pool(self) -> PackedExamples:
        """The fixed training set used when ``train_size`` is set (built on first use, then kept)."""
        if self.train_size is None:
            raise ValueError("train_pool() needs train_size to be set (train_size=None generates fresh data)")
        if self._pool is None:
            rng, parts = self._split_rng("train-pool"), []
            for start in range(0, self.train_size, POOL_CHUNK):
                n = min(POOL_CHUNK, self.train_size - start)
                examples = self._fill(rng, n, "train", self.eval_keys(),
                                      "training examples disjoint from the evaluation splits")
                parts.append(PackedExamples(examples, len(self.vocab), self.vocab.pad_id))
            self._pool = parts[0] if len(parts) == 1 else PackedExamples.concatenate(parts)
        return self._pool

    def eval_keys(self) -> set[bytes]:
        """The token sequences of every evaluation split (what training examples must not be)."""
        if self._eval_keys is None:
            self._eval_keys = {e.tokens.tobytes() for s in self.split_names for e in self.examples(s)}
        return self._eval_keys

    def _fill(self, rng: np.random.Generator, n: int, variant: str, exclude: set[bytes], what: str,
              unique: bool = False) -> list[Example]:
        """``n`` examples of ``variant`` from ``rng`` whose tokens are not in ``exclude`` (nor, with ``unique``,
        repeated among themselves); the first batch drawn is the generator's own output, so nothing changes
        where nothing collides.  A top-up draws at least min(n, 256) examples, not only the missing ones: where
        the allowed examples are a small part of the distribution, ever smaller draws would run dry."""
        out: list[Example] = []
        seen = set(exclude) if unique else exclude
        for attempt in range(100):
            need = n - len(out)
            if need <= 0:
                break
            for e in self._generate(rng, need if attempt == 0 else max(need, min(n, 256)), variant):
                key = e.tokens.tobytes()
                if key not in seen:
                    out.append(e)
                    if unique:
                        seen.add(key)
        if len(out) < n:
            raise ValueError(
                f"{self.name}: could not generate {n} {what}; the example space "
                f"is too small for eval_size={self.eval_size} (use larger sizes/lengths or a smaller eval_size)"
            )
        return out[:n]

    def examples(self, split: str) -> list[Example]:
        """The examples of evaluation split ``split`` (cached); no example twice, none of an earlier split."""
        check_choice(split, "split", self.split_names)
        if split not in self._split_cache:
            earlier = self.split_names[: self.split_names.index(split)]
            exclude = {e.tokens.tobytes() for s in earlier for e in self.examples(s)}
            self._split_cache[split] = self._fill(
                self._split_rng(split), self.eval_size, self.split_variants[split], exclude,
                f"distinct examples of split {split!r} disjoint from {list(earlier)}", unique=True)
        return self._split_cache[split]

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]:
        """Evaluation split ``name`` as a list of batches (fixed content and order)."""
        ex = self.examples(name)
        bs = self.eval_batch_size if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        return [collate(ex[i : i + bs], self.vocab.pad_id) for i in range(0, len(ex), bs)]

    def evaluate(
        self,
        model: Callable[[torch.Tensor], torch.Tensor],
        split: str = "validation",
        batch_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> dict[str, float]:
        """Metrics of ``model(inputs) -> logits`` on a split (see :func:`poskit.tasks.metrics.summarize`)."""
        return evaluate_batches(model, self.split(split, batch_size), self.accuracy_level, device)

    def decode(self, ids: Iterable[int] | torch.Tensor | np.ndarray) -> str:
        return self.vocab.decode(ids)
