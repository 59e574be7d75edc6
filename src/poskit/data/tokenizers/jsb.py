"""Bach chorales as in the Music Transformer: a 4 x T matrix of MIDI pitches (Soprano, Alto, Tenor, Bass; -1 a
rest) per 16th note, serialised raster-scan: time step by time step, four voices each (S A T B S A T B ...).
Vocabulary: ``<pad>``, ``rest``, the 88 piano pitches 21..108 (the paper's 90) and ``<eos>`` between chorales."""
from __future__ import annotations

import numpy as np

from .base import Tokenizer, fingerprint_of

__all__ = ["JSBPitch", "LOWEST", "HIGHEST"]

LOWEST, HIGHEST = 21, 108


class JSBPitch(Tokenizer):
    name = "jsb-pitch"
    payload = "pitch-matrix"

    def __init__(self) -> None:
        self.tokens = ["rest"] + [f"p{p}" for p in range(LOWEST, HIGHEST + 1)] + ["<eos>"]
        self.eos_id = len(self.tokens)
        self.fingerprint = fingerprint_of("jsb-pitch-raster", self.tokens)

    def encode(self, matrix: np.ndarray) -> np.ndarray:
        matrix = np.asarray(matrix)
        if matrix.ndim != 2 or matrix.shape[0] != 4:
            raise ValueError(f"a chorale must be a 4 x T pitch matrix, got shape {matrix.shape}")
        notes = matrix[matrix >= 0]
        if notes.size and (notes.min() < LOWEST or notes.max() > HIGHEST):
            raise ValueError(f"pitches must lie in {LOWEST}..{HIGHEST} (or be -1 for a rest), got "
                             f"{int(notes.min())}..{int(notes.max())}")
        ids = np.where(matrix >= 0, matrix - LOWEST + 2, 1)
        return ids.T.reshape(-1).astype(np.int64)  # column by column: S A T B of step 0, then step 1, ...

    def decode(self, ids) -> np.ndarray:
        ids = np.asarray([int(i) for i in ids if int(i) != self.eos_id])
        if ids.size % 4:
            raise ValueError(f"{ids.size} pitch tokens are not whole time steps of four voices")
        if ids.size and (ids.min() < 1 or ids.max() >= self.eos_id):
            raise ValueError("ids must be rest or pitch tokens")
        return np.where(ids == 1, -1, ids + LOWEST - 2).reshape(-1, 4).T
