"""The token ids a masked-language model sees: a corpus tokenizer's ids plus ``[MASK]``, optionally reduced to a
small vocabulary of the training split's most frequent GPT-2 tokens with a byte fallback.

Why a reduced vocabulary: GPT-2's 50,257 BPE tokens make the output layer (d_model x 50k) cost several times the
rest of a CPU-scale model, and most of them never occur in the 0.55M-token wiki training split. Keeping the
``size - 259`` most frequent multi-byte tokens of the training split and spelling every other token as its bytes
(GPT-2 has a token for each of the 256 bytes) keeps the tokenisation lossless, with no unknown token, and needs
nothing beyond the GPT-2 vocabulary; the counts come from the training split only, so nothing is learned from the
held-out text.

Id layout (both forms): 0 ``<pad>``; the ordinary tokens; the corpus's end-of-document token; ``[MASK]`` last.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..util.validate import check_int

__all__ = ["MASK_TOKEN", "MLMVocabulary", "full_vocabulary", "reduced_vocabulary", "BYTE_TOKENS", "MIN_REDUCED"]

MASK_TOKEN = "[MASK]"
BYTE_TOKENS = 256
MIN_REDUCED = BYTE_TOKENS + 3  # pad + 256 bytes + end-of-document + [MASK]


@dataclass(frozen=True)
class MLMVocabulary:
    """``tokens``: strings of ids 1..V-1 (for :class:`poskit.tasks.Vocab`); ``ordinary_ids``: the ids a random
    replacement may draw (not pad, end-of-document or mask); ``eos_id``, ``mask_id``. ``_offsets`` / ``_targets``
    map a tokenizer id s to the ids ``_targets[_offsets[s]:_offsets[s + 1]]`` (one id, or a token's bytes)."""

    tokens: list
    ordinary_ids: np.ndarray
    eos_id: int
    mask_id: int
    _offsets: np.ndarray
    _targets: np.ndarray
    _bytes: list  # id -> the bytes it stands for (b"" for pad / eos / mask)

    @property
    def size(self) -> int:
        return len(self.tokens) + 1

    def map_stream(self, ids: np.ndarray) -> np.ndarray:
        """Tokenizer ids (any int array) -> this vocabulary's ids (int64), a rare token becoming its bytes."""
        ids = np.asarray(ids, dtype=np.int64)
        starts, ends = self._offsets[ids], self._offsets[ids + 1]
        lengths = ends - starts
        # position k of the output reads _targets[starts[i] + (k - first output index of token i)]
        first = np.cumsum(lengths) - lengths
        within = np.arange(int(lengths.sum())) - np.repeat(first, lengths)
        return self._targets[np.repeat(starts, lengths) + within]

    def decode(self, ids) -> str:
        data = b"".join(self._bytes[int(i)] for i in ids)
        return data.decode("utf-8", errors="replace")


def full_vocabulary(tokenizer) -> MLMVocabulary:
    """Every id of ``tokenizer`` unchanged, plus ``[MASK]`` after them (its end-of-document id stays where it is)."""
    n = tokenizer.vocab_size  # tokens + pad
    tokens = list(tokenizer.tokens) + [MASK_TOKEN]
    ordinary = np.array([i for i in range(1, n) if i != tokenizer.eos_id], dtype=np.int64)
    to_bytes = getattr(tokenizer, "token_bytes", None)
    as_bytes = [b""] + [to_bytes(i) if to_bytes and i != tokenizer.eos_id else b"" for i in range(1, n)] + [b""]
    identity = np.arange(n, dtype=np.int64)
    return MLMVocabulary(tokens, ordinary, tokenizer.eos_id, n, np.arange(n + 1, dtype=np.int64), identity, as_bytes)


def reduced_vocabulary(tokenizer, train_ids: np.ndarray, size: int) -> MLMVocabulary:
    """``size`` ids in all: pad, the 256 bytes, the ``size - 259`` multi-byte tokens that occur most often in
    ``train_ids`` (ties: the lower tokenizer id first), end-of-document and ``[MASK]``. ``tokenizer`` must say
    what bytes each id stands for (``token_bytes``, as the gpt2 tokenizer does)."""
    size = check_int(size, "vocab_size", minimum=MIN_REDUCED)
    if not hasattr(tokenizer, "token_bytes"):
        raise ValueError(f"vocab_size: a reduced vocabulary spells rare tokens as bytes, which tokenizer "
                         f"{tokenizer.name!r} cannot do; use the gpt2 tokenizer or vocab_size=null (its full vocabulary)")
    n_src = tokenizer.vocab_size
    source_bytes = [b""] + [b"" if i == tokenizer.eos_id else tokenizer.token_bytes(i) for i in range(1, n_src)]
    byte_source = {b[0]: i for i, b in enumerate(source_bytes) if len(b) == 1}
    if len(byte_source) != BYTE_TOKENS:
        raise ValueError(f"tokenizer {tokenizer.name!r} lacks single-byte tokens: a byte fallback needs all 256")
    counts = np.bincount(np.asarray(train_ids, dtype=np.int64), minlength=n_src)
    multi = np.array([i for i in range(1, n_src) if len(source_bytes[i]) > 1], dtype=np.int64)
    multi = multi[counts[multi] > 0]
    keep = size - MIN_REDUCED
    if keep > len(multi):
        raise ValueError(f"vocab_size must be at most {MIN_REDUCED + len(multi)} (the training split has "
                         f"{len(multi)} distinct multi-byte tokens), got {size}")
    # most frequent first; a stable sort of ids by descending count keeps the lower id first on ties
    kept = multi[np.argsort(-counts[multi], kind="stable")[:keep]]
    new_id = {byte_source[b]: 1 + b for b in range(BYTE_TOKENS)}
    new_id.update({int(s): 1 + BYTE_TOKENS + k for k, s in enumerate(kept)})
    eos_id, mask_id = size - 2, size - 1
    pieces = []
    for s in range(n_src):
        if s == 0:
            pieces.append([0])
        elif s == tokenizer.eos_id:
            pieces.append([eos_id])
        elif s in new_id:
            pieces.append([new_id[s]])
        else:  # a rare token: its bytes
            pieces.append([1 + b for b in source_bytes[s]])
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    targets = np.array([t for p in pieces for t in p], dtype=np.int64)
    tokens = ([f"<byte 0x{b:02X}>" for b in range(BYTE_TOKENS)] + [tokenizer.tokens[s - 1] for s in kept]
              + ["<end of document>", MASK_TOKEN])
    as_bytes = [b""] + [bytes([b]) for b in range(BYTE_TOKENS)] + [source_bytes[s] for s in kept] + [b"", b""]
    ordinary = np.arange(1, eos_id, dtype=np.int64)
    return MLMVocabulary(tokens, ordinary, eos_id, mask_id, offsets, targets, as_bytes)
