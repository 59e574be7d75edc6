"""Common interface of poskit's tasks: vocabularies, batches, splits, metrics.

Conventions shared by every task
--------------------------------
* A task produces :class:`Batch` objects of CPU tensors.  ``inputs`` (B, T) holds
  token ids, right-padded with ``task.vocab.pad_id``; ``targets`` (B, T) holds the
  next-token target of each input position, or ``IGNORE_INDEX`` (-100) where no loss
  is taken.  ``targets[b, t]`` is the token that follows ``inputs[b, t]``, so
  ``F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)``
  is the training loss (see :func:`lm_loss`).
* ``task.train_batch(batch_size, generator)`` draws fresh training examples; the
  only randomness used is one 62-bit integer drawn from ``generator``, so the
  batch is a deterministic function of the generator's state.  Training examples
  that equal an example of any evaluation split are dropped and replaced by the
  next ones of the same stream, so no model is ever trained on an example it is
  scored on (this matters where the example space is small: short counting
  programs recur often; for long flip-flop or copy sequences it never triggers
  and the stream is the generator's own).
* ``task.split(name, batch_size)`` returns the fixed evaluation split ``name`` (one
  of ``task.split_names``) as a list of batches.  Split examples come from numpy
  generators seeded with ``(eval_seed, crc32(task name), crc32(split name))``, a
  seed path distinct from the training path.  Splits are made in the order of
  ``split_names`` (validation first); each drops the examples that occur in an
  earlier split and tops itself up from its own stream, so every split keeps its
  documented size and all splits are pairwise disjoint.  A task whose example
  space is too small for that raises ValueError.
* ``task.evaluate(model, split)`` runs ``model(inputs) -> logits (B, T, V)`` over a
  split and returns the metrics of :func:`summarize`.

Metrics (computed only on positions whose target is not -100):
``loss`` (mean cross-entropy per target token, nats), ``perplexity`` (exp(loss)),
``token_accuracy`` (argmax correct per target token), ``sequence_accuracy`` (a row
counts as correct only if all its target tokens are), and ``accuracy``: the task's
headline number, ``token_accuracy`` or ``sequence_accuracy`` as the task's
``accuracy_level`` says.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
PAD_TOKEN = "<pad>"

__all__ = [
    "IGNORE_INDEX",
    "PAD_TOKEN",
    "Batch",
    "Vocab",
    "Example",
    "Task",
    "SyntheticTask",
    "Scores",
    "score_batch",
    "summarize",
    "evaluate_batches",
    "lm_loss",
    "collate",
    "rng_from_generator",
    "check_int",
    "check_float",
    "check_choice",
]


# ----------------------------------------------------------------------------- data


@dataclass
class Batch:
    """A batch of examples (CPU tensors).

    inputs:  (B, T) int64 token ids, right-padded with the vocabulary's pad id.
    targets: (B, T) int64 next-token targets, ``IGNORE_INDEX`` (-100) where no loss
             is taken (padding included).
    """

    inputs: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if self.inputs.shape != self.targets.shape or self.inputs.dim() != 2:
            raise ValueError(
                f"inputs and targets must both be (B, T); got {tuple(self.inputs.shape)} "
                f"and {tuple(self.targets.shape)}"
            )

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def target_mask(self) -> torch.Tensor:
        """(B, T) bool: positions that carry a target."""
        return self.targets != IGNORE_INDEX

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.inputs.to(device), self.targets.to(device))


class Example(NamedTuple):
    """One example as a full token sequence.

    tokens:      (n,) int64 ids of the whole sequence, answers included.
    answer_mask: (n,) bool, True at the tokens that are predicted (loss/metric
                 positions); ``answer_mask[0]`` is always False.
    """

    tokens: np.ndarray
    answer_mask: np.ndarray


class Vocab:
    """A fixed token list with ``<pad>`` at id 0.

    ``sep`` joins decoded tokens ("" for character-level tasks, " " for word-level).
    ``len(vocab)`` (pad included) is the embedding size a model needs.
    """

    def __init__(self, tokens: Sequence[str], sep: str = "") -> None:
        tokens = list(tokens)
        if PAD_TOKEN in tokens:
            raise ValueError(f"{PAD_TOKEN!r} is reserved")
        if len(set(tokens)) != len(tokens):
            raise ValueError("vocabulary tokens must be unique")
        self.tokens: list[str] = [PAD_TOKEN] + tokens
        self.sep = sep
        self.index: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        self.pad_id = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens incl. pad, sep={self.sep!r})"

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Encode a string (split by ``sep``; per character when ``sep == ""``) or a token list."""
        if isinstance(text, str):
            pieces: Sequence[str] = list(text) if self.sep == "" else text.split(self.sep)
        else:
            pieces = text
        try:
            return [self.index[p] for p in pieces]
        except KeyError as e:
            raise ValueError(f"token {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int] | torch.Tensor | np.ndarray, skip_pad: bool = True) -> str:
        """Decode ids to a string; ``-100`` and (by default) pad ids are skipped."""
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            ids = ids.tolist()
        out = [self.tokens[i] for i in ids if i != IGNORE_INDEX and not (skip_pad and i == self.pad_id)]
        return self.sep.join(out)


def collate(examples: Sequence[Example], pad_id: int = 0) -> Batch:
    """Turn full sequences into (inputs, targets): inputs = tokens[:-1], targets = tokens[1:]
    where the answer mask is set, right-padded to the longest example."""
    if len(examples) == 0:
        raise ValueError("cannot collate an empty list of examples")
    T = max(len(e.tokens) for e in examples) - 1
    B = len(examples)
    inputs = np.full((B, T), pad_id, dtype=np.int64)
    targets = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
    for b, (tok, mask) in enumerate(examples):
        n = len(tok) - 1
        inputs[b, :n] = tok[:-1]
        targets[b, :n] = np.where(mask[1:], tok[1:], IGNORE_INDEX)
    return Batch(torch.from_numpy(inputs), torch.from_numpy(targets))


def rng_from_generator(generator: torch.Generator) -> np.random.Generator:
    """A numpy generator seeded by one draw from a torch generator (deterministic)."""
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    return np.random.default_rng(seed)


def _stable_hash(s: str) -> int:
    return zlib.crc32(s.encode("utf-8"))


# ----------------------------------------------------------------------------- metrics


@dataclass
class Scores:
    """Sums over target positions; add batches with ``+=``, read with :meth:`summary`."""

    loss_sum: float = 0.0
    n_tokens: int = 0
    n_correct_tokens: int = 0
    n_sequences: int = 0
    n_correct_sequences: int = 0

    def __iadd__(self, other: "Scores") -> "Scores":
        self.loss_sum += other.loss_sum
        self.n_tokens += other.n_tokens
        self.n_correct_tokens += other.n_correct_tokens
        self.n_sequences += other.n_sequences
        self.n_correct_sequences += other.n_correct_sequences
        return self

    def summary(self, accuracy_level: str = "sequence") -> dict[str, float]:
        return summarize(self, accuracy_level)


def score_batch(logits: torch.Tensor, batch: Batch | torch.Tensor) -> Scores:
    """Loss and accuracy sums of ``logits`` (B, T, V) on the target positions of ``batch``.

    ``batch`` may also be the targets tensor itself.  Rows without any target do not
    count as sequences.
    """
    targets = batch.targets if isinstance(batch, Batch) else batch
    if logits.dim() != 3 or logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits must be (B, T, V) matching targets {tuple(targets.shape)}; got {tuple(logits.shape)}"
        )
    targets = targets.to(logits.device)
    mask = targets != IGNORE_INDEX
    logits = logits.detach().float()
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    correct = (logits.argmax(-1) == targets) & mask
    has_target = mask.any(dim=1)
    row_ok = (correct | ~mask).all(dim=1) & has_target
    return Scores(
        loss_sum=float(loss),
        n_tokens=int(mask.sum()),
        n_correct_tokens=int(correct.sum()),
        n_sequences=int(has_target.sum()),
        n_correct_sequences=int(row_ok.sum()),
    )


def summarize(scores: Scores, accuracy_level: str = "sequence") -> dict[str, float]:
    """Turn :class:`Scores` into metrics (see module docstring)."""
    check_choice("accuracy_level", accuracy_level, ("token", "sequence"))
    nt = max(scores.n_tokens, 1)
    ns = max(scores.n_sequences, 1)
    loss = scores.loss_sum / nt
    out = {
        "loss": loss,
        "perplexity": float(np.exp(min(loss, 700.0))),
        "token_accuracy": scores.n_correct_tokens / nt,
        "sequence_accuracy": scores.n_correct_sequences / ns,
        "n_tokens": scores.n_tokens,
        "n_sequences": scores.n_sequences,
    }
    out["accuracy"] = out["token_accuracy"] if accuracy_level == "token" else out["sequence_accuracy"]
    return out


@torch.no_grad()
def evaluate_batches(
    model: Callable[[torch.Tensor], torch.Tensor],
    batches: Iterable[Batch],
    accuracy_level: str = "sequence",
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Run ``model(inputs) -> logits (B, T, V)`` on each batch and summarize."""
    total = Scores()
    for batch in batches:
        inputs = batch.inputs if device is None else batch.inputs.to(device)
        total += score_batch(model(inputs), batch)
    return summarize(total, accuracy_level)


def lm_loss(logits: torch.Tensor, batch: Batch | torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over target positions (the training loss)."""
    targets = batch.targets if isinstance(batch, Batch) else batch
    targets = targets.to(logits.device)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


# ----------------------------------------------------------------------------- validation


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else str(lo)
        hi_s = "inf" if hi is None else str(hi)
        raise ValueError(f"{name} must be in [{lo_s}, {hi_s}], got {value}")
    return value


def check_float(name: str, value: object, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad or not np.isfinite(value):
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"{name} must be in {lb}{lo}, {hi}{rb}, got {value}")
    return value


def check_choice(name: str, value: object, allowed: Sequence[object]) -> object:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


# ----------------------------------------------------------------------------- tasks


@runtime_checkable
class Task(Protocol):
    """What the trainer may rely on."""

    name: str
    vocab: Vocab
    metric: str  # "accuracy" or "perplexity"
    accuracy_level: str  # "token" or "sequence": which accuracy is the headline
    split_names: tuple[str, ...]
    max_input_len: int  # longest T any batch of this task can have (train and eval splits)
    params: dict

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch: ...

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]: ...

    def evaluate(
        self, model: Callable[[torch.Tensor], torch.Tensor], split: str = "validation", batch_size: int | None = None
    ) -> dict[str, float]: ...


class SyntheticTask:
    """Base of the procedurally generated tasks.

    Subclasses set ``name``, ``vocab``, ``accuracy_level``, ``split_variants``
    (split name -> generation variant; "train" is the training variant), and
    implement ``_generate(rng, n, variant) -> list[Example]`` and ``max_input_len``.

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
        self.eval_size = check_int("eval_size", eval_size, 1)
        self.eval_seed = check_int("eval_seed", eval_seed, 0)
        self.eval_batch_size = check_int("eval_batch_size", eval_batch_size, 1)
        self.train_size = None if train_size is None else check_int("train_size", train_size, 1)
        self._split_cache: dict[str, list[Example]] = {}
        self._pool: list[Example] | None = None
        self._eval_keys: set[bytes] | None = None

    # -- to implement
    def _generate(self, rng: np.random.Generator, n: int, variant: str) -> list[Example]:
        raise NotImplementedError

    @property
    def max_input_len(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- common
    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(self.split_variants)

    @property
    def params(self) -> dict:
        return dict(self._params)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._params.items())
        return f"{type(self).__name__}({args})"

    def _split_rng(self, split: str) -> np.random.Generator:
        return np.random.default_rng([self.eval_seed, _stable_hash(self.name), _stable_hash(split)])

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` training examples, a deterministic function of ``generator``'s state, none of
        them an example of an evaluation split."""
        batch_size = check_int("batch_size", batch_size, 1)
        if self.train_size is None:
            rng = rng_from_generator(generator)
            examples = self._fill(rng, batch_size, "train", self.eval_keys(),
                                  "training examples disjoint from the evaluation splits")
            return collate(examples, self.vocab.pad_id)
        pool = self.train_pool()
        idx = torch.randint(0, len(pool), (batch_size,), generator=generator).tolist()
        return collate([pool[i] for i in idx], self.vocab.pad_id)

    def train_pool(self) -> list[Example]:
        """The fixed training set used when ``train_size`` is set."""
        if self.train_size is None:
            raise ValueError("train_pool() needs train_size to be set (train_size=None generates fresh data)")
        if self._pool is None:
            self._pool = self._fill(self._split_rng("train-pool"), self.train_size, "train", self.eval_keys(),
                                    "training examples disjoint from the evaluation splits")
        return self._pool

    def eval_keys(self) -> set[bytes]:
        """The token sequences of every evaluation split (what training examples must not be)."""
        if self._eval_keys is None:
            self._eval_keys = {e.tokens.tobytes() for s in self.split_names for e in self.examples(s)}
        return self._eval_keys

    def _fill(self, rng: np.random.Generator, n: int, variant: str, exclude: set[bytes], what: str) -> list[Example]:
        """``n`` examples of ``variant`` from ``rng`` whose tokens are not in ``exclude``; the first batch drawn
        is the generator's own output, so nothing changes where nothing collides."""
        out: list[Example] = []
        for _ in range(100):
            need = n - len(out)
            if need <= 0:
                break
            batch = self._generate(rng, need, variant)
            out.extend(e for e in batch if e.tokens.tobytes() not in exclude)
        if len(out) < n:
            raise ValueError(
                f"{self.name}: could not generate {n} {what}; the example space "
                f"is too small for eval_size={self.eval_size} (use larger sizes/lengths or a smaller eval_size)"
            )
        return out[:n]

    def examples(self, split: str) -> list[Example]:
        """The examples of evaluation split ``split`` (cached); disjoint from every earlier split."""
        check_choice("split", split, self.split_names)
        if split not in self._split_cache:
            earlier = self.split_names[: self.split_names.index(split)]
            exclude = {e.tokens.tobytes() for s in earlier for e in self.examples(s)}
            self._split_cache[split] = self._fill(self._split_rng(split), self.eval_size, self.split_variants[split],
                                                  exclude, f"examples of split {split!r} disjoint from {list(earlier)}")
        return self._split_cache[split]

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]:
        """Evaluation split ``name`` as a list of batches (fixed content and order)."""
        ex = self.examples(name)
        bs = self.eval_batch_size if batch_size is None else check_int("batch_size", batch_size, 1)
        return [collate(ex[i : i + bs], self.vocab.pad_id) for i in range(0, len(ex), bs)]

    def evaluate(
        self,
        model: Callable[[torch.Tensor], torch.Tensor],
        split: str = "validation",
        batch_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> dict[str, float]:
        """Metrics of ``model(inputs) -> logits`` on a split (see :func:`summarize`)."""
        return evaluate_batches(model, self.split(split, batch_size), self.accuracy_level, device)

    def decode(self, ids: Iterable[int] | torch.Tensor | np.ndarray) -> str:
        return self.vocab.decode(ids)
