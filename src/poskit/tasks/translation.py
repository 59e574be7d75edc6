"""Sentence-pair batches for the encoder-decoder (poskit.data.translation's corpus, or any id lists).

Training batches are formed as fairseq does: the pairs are shuffled, sorted by length within large chunks,
cut into batches of at most `batch_tokens` target tokens (padding included), and the batches shuffled,
so that a batch holds sentences of similar length and little padding. The order is a function of
(seed, epoch) alone, so a resumed run continues with the batches an uninterrupted one would draw.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..util.validate import check_int

__all__ = ["PairBatch", "PairSet", "make_batch"]

PAD, BOS, EOS = 0, 1, 2  # poskit.data.translation.SubwordTokenizer's special ids


@dataclass
class PairBatch:
    src: torch.Tensor  # (B, Ts) source ids, right-padded with PAD
    src_mask: torch.Tensor  # (B, Ts) bool, True = real token
    tgt_in: torch.Tensor  # (B, Tt) BOS + target
    tgt_out: torch.Tensor  # (B, Tt) target + EOS (PAD where tgt_in is padding)
    tgt_mask: torch.Tensor  # (B, Tt) bool
    index: list  # the pairs' indices in their PairSet

    @property
    def n_target_tokens(self) -> int:
        return int(self.tgt_mask.sum())


def _pad(rows: list[np.ndarray], width: int) -> torch.Tensor:
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def make_batch(src: list[np.ndarray], tgt: list[np.ndarray], index: list) -> PairBatch:
    """Pad one batch: targets become (BOS + y) as input and (y + EOS) as labels."""
    if len(src) != len(tgt) or not src:
        raise ValueError(f"src and tgt must be equally long, non-empty lists of id arrays, got {len(src)} and {len(tgt)}")
    s = _pad(src, max(len(x) for x in src))
    tin = _pad([np.concatenate(([BOS], y)) for y in tgt], max(len(y) for y in tgt) + 1)
    tout = _pad([np.concatenate((y, [EOS])) for y in tgt], tin.shape[1])
    lengths = torch.tensor([len(x) for x in src])
    src_mask = torch.arange(s.shape[1])[None] < lengths[:, None]
    tgt_mask = torch.arange(tin.shape[1])[None] < torch.tensor([len(y) + 1 for y in tgt])[:, None]
    return PairBatch(s, src_mask, tin, tout, tgt_mask, list(index))


class PairSet:
    """The (source ids, target ids) pairs of one split. Pairs with an empty side are refused; pairs longer
    than `max_len` tokens on either side can be dropped for training (`drop_longer_than`)."""

    def __init__(self, src: list[np.ndarray], tgt: list[np.ndarray]):
        if len(src) != len(tgt):
            raise ValueError(f"src and tgt must have one entry per pair, got {len(src)} and {len(tgt)}")
        empty = [i for i, (a, b) in enumerate(zip(src, tgt)) if len(a) == 0 or len(b) == 0]
        if empty:
            raise ValueError(f"pairs {empty[:5]} have an empty side: every sentence needs at least one token")
        self.src, self.tgt = list(src), list(tgt)

    def __len__(self) -> int:
        return len(self.src)

    def drop_longer_than(self, max_len: int) -> "PairSet":
        check_int(max_len, "max_len", minimum=1)
        keep = [i for i in range(len(self)) if len(self.src[i]) <= max_len and len(self.tgt[i]) <= max_len]
        return PairSet([self.src[i] for i in keep], [self.tgt[i] for i in keep])

    def _size(self, i: int) -> int:
        return max(len(self.src[i]), len(self.tgt[i]) + 1)

    def _cut(self, order, batch_tokens: int) -> list[list[int]]:
        batches, current, width = [], [], 0
        for i in order:
            w = max(width, self._size(i))
            if current and w * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current, w = [], self._size(i)
            current.append(i)
            width = w
        if current:
            batches.append(current)
        return batches

    def epoch_batches(self, batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
        """The training batches of one epoch (lists of pair indices), a function of (seed, epoch) only."""
        check_int(batch_tokens, "batch_tokens", minimum=1)
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(self))
        chunk = 64 * max(1, batch_tokens // 16)  # sort within chunks: similar lengths, still random
        sorted_order = np.concatenate([sorted(order[i:i + chunk], key=self._size)
                                       for i in range(0, len(order), chunk)]) if len(order) else order
        batches = self._cut(sorted_order.tolist(), batch_tokens)
        return [batches[j] for j in rng.permutation(len(batches))]

    def eval_batches(self, batch_size: int) -> list[list[int]]:
        """Deterministic evaluation batches of at most `batch_size` pairs, sorted by length (less padding)."""
        check_int(batch_size, "batch_size", minimum=1)
        order = sorted(range(len(self)), key=self._size)
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]

    def batch(self, index: list[int]) -> PairBatch:
        return make_batch([self.src[i] for i in index], [self.tgt[i] for i in index], index)
