"""Nucleotide Transformer tokenisation: non-overlapping 6-mers of A/C/G/T; a 6-base chunk holding any other base
(N, or IUPAC codes such as R/Y), and the last ``len % 6`` bases, become single-base tokens.  Vocabulary:
``<pad>`` + 4096 6-mers + A, C, G, T, N + ``<unk>``, ``<mask>``, ``<cls>``, ``<eos>``, ``<bos>`` = 4107, the
paper's size.  Sequences are upper-cased first (soft-masked lower case is lost: decode returns upper case);
IUPAC codes other than N become ``<unk>``."""
from __future__ import annotations

import itertools

import numpy as np

from .base import Tokenizer, fingerprint_of

__all__ = ["DNA6"]

K = 6
_BASES = "ACGT"
_SINGLES = "ACGTN"
_SPECIALS = ["<unk>", "<mask>", "<cls>", "<eos>", "<bos>"]


class DNA6(Tokenizer):
    name = "dna6"
    payload = "dna"

    def __init__(self) -> None:
        kmers = ["".join(p) for p in itertools.product(_BASES, repeat=K)]  # id of a k-mer = 1 + its base-4 value
        self.tokens = kmers + list(_SINGLES) + _SPECIALS
        self._single0 = 1 + len(kmers)
        self.unk_id = self._single0 + len(_SINGLES)
        self.eos_id = self.unk_id + _SPECIALS.index("<eos>")
        self.fingerprint = fingerprint_of("dna6", self.tokens)
        code = np.full(256, 5, dtype=np.int64)  # 0-3 ACGT, 4 N, 5 anything else
        for i, b in enumerate(_SINGLES):
            code[ord(b)] = code[ord(b.lower())] = i
        self._code = code

    def encode(self, document: str | bytes) -> np.ndarray:
        raw = document.encode("ascii") if isinstance(document, str) else document
        codes = self._code[np.frombuffer(raw, dtype=np.uint8)]
        n_full = len(codes) // K
        chunks = codes[: n_full * K].reshape(n_full, K)
        clean = (chunks < 4).all(axis=1)
        kmer_ids = 1 + (chunks * (4 ** np.arange(K - 1, -1, -1))).sum(axis=1)
        singles = np.where(chunks < 5, self._single0 + chunks, self.unk_id)
        # a clean chunk keeps only its k-mer (column 0); a dirty chunk keeps its six single-base tokens
        grid = np.where(clean[:, None], kmer_ids[:, None], singles)
        keep = np.where(clean[:, None], np.arange(K) == 0, True)
        tail = codes[n_full * K:]
        tail_ids = np.where(tail < 5, self._single0 + tail, self.unk_id)
        return np.concatenate([grid[keep], tail_ids])

    def decode(self, ids) -> str:
        return "".join(self.tokens[int(i) - 1] if int(i) != self.eos_id else "\n" for i in ids)
