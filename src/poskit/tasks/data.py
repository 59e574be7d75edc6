"""What tasks produce: token vocabularies, examples, batches, and the collation between them.

A task produces :class:`Batch` objects of CPU tensors.  ``inputs`` (B, T) holds token ids, right-padded with
``task.vocab.pad_id``; ``targets`` (B, T) holds the next-token target of each input position, or
``IGNORE_INDEX`` (-100) where no loss is taken.  ``targets[b, t]`` is the token that follows ``inputs[b, t]``.
Synthetic tasks build batches from :class:`Example` s (whole token sequences with an answer mask) with
:func:`collate`; a fixed training set is stored as one :class:`PackedExamples` (compact arrays, not one Python
object per example: 1M Indirect Indexing examples take about 58 MB instead of about 700 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import torch

IGNORE_INDEX = -100
PAD_TOKEN = "<pad>"

__all__ = ["IGNORE_INDEX", "PAD_TOKEN", "Batch", "Example", "Vocab", "collate", "PackedExamples",
           "rng_from_generator"]


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


class PackedExamples(Sequence[Example]):
    """A list of examples stored as three arrays: tokens (N, L) in the smallest unsigned dtype that holds the
    vocabulary, answer masks (N, ceil(L/8)) as packed bits, and lengths (N,).  Indexing gives back the
    :class:`Example` (int64 tokens, bool mask) that was packed; :meth:`batch` collates rows directly from the
    arrays, with exactly the result of ``collate([self[i] for i in rows], pad_id)``."""

    def __init__(self, examples: Sequence[Example], vocab_size: int, pad_id: int = 0) -> None:
        if len(examples) == 0:
            raise ValueError("cannot pack an empty list of examples")
        self.pad_id = pad_id
        self.lengths = np.array([len(e.tokens) for e in examples], dtype=np.int32)
        width = int(self.lengths.max())
        dtype = np.uint8 if vocab_size <= 2**8 else np.uint16 if vocab_size <= 2**16 else np.int64
        self.tokens = np.full((len(examples), width), pad_id, dtype=dtype)
        mask = np.zeros((len(examples), width), dtype=bool)
        for k, (tok, m) in enumerate(examples):
            self.tokens[k, : len(tok)] = tok
            mask[k, : len(m)] = m
        self.mask_bits = np.packbits(mask, axis=1)

    @classmethod
    def concatenate(cls, parts: Sequence["PackedExamples"]) -> "PackedExamples":
        """One packed list holding the rows of ``parts`` in order."""
        if len(parts) == 0:
            raise ValueError("cannot concatenate an empty list of packed examples")
        width = max(p.tokens.shape[1] for p in parts)
        out = cls.__new__(cls)
        out.pad_id = parts[0].pad_id
        out.lengths = np.concatenate([p.lengths for p in parts])
        out.tokens = np.concatenate(
            [np.pad(p.tokens, ((0, 0), (0, width - p.tokens.shape[1])), constant_values=p.pad_id) for p in parts])
        nbytes = (width + 7) // 8
        out.mask_bits = np.concatenate(
            [np.pad(p.mask_bits, ((0, 0), (0, nbytes - p.mask_bits.shape[1]))) for p in parts])
        return out

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = int(self.lengths[k])
        mask = np.unpackbits(self.mask_bits[k], count=self.tokens.shape[1]).astype(bool)
        return Example(self.tokens[k, :n].astype(np.int64), mask[:n])

    def batch(self, rows: Sequence[int] | np.ndarray) -> Batch:
        """The examples ``rows`` as a :class:`Batch` (what :func:`collate` makes of them)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            raise ValueError("cannot collate an empty list of examples")
        T = int(self.lengths[rows].max()) - 1
        tokens = self.tokens[rows, : T + 1].astype(np.int64)
        mask = np.unpackbits(self.mask_bits[rows], axis=1, count=self.tokens.shape[1])[:, 1 : T + 1].astype(bool)
        # a row's inputs end before its last token, and its mask is False past its end: what lies beyond is
        # collate's padding (inputs pad_id, targets IGNORE_INDEX)
        inputs = np.where(np.arange(T) < self.lengths[rows, None] - 1, tokens[:, :-1], self.pad_id)
        targets = np.where(mask, tokens[:, 1:], IGNORE_INDEX)
        return Batch(torch.from_numpy(inputs), torch.from_numpy(targets))

