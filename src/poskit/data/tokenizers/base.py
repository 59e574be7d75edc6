"""What every corpus tokenizer provides.  Ids start at 1: id 0 is ``<pad>``, as in every poskit task's Vocab."""
from __future__ import annotations

import hashlib
import json

import numpy as np

__all__ = ["Tokenizer", "fingerprint_of"]


def fingerprint_of(*parts) -> str:
    """sha256 of the JSON of ``parts`` (bytes are hashed first): what the token cache compares."""
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest() if isinstance(p, bytes) else json.dumps(p, sort_keys=True).encode())
    return h.hexdigest()


class Tokenizer:
    """``name``; ``payload`` (the kind of document it reads: "text", "dna", "pitch-matrix" or "score");
    ``tokens`` (the strings of ids 1..V-1); ``eos_id`` (put after every document in a token stream);
    ``fingerprint`` (changes whenever the ids it produces could change); ``encode`` and, where the
    tokenisation is invertible, ``decode``."""

    name: str
    payload: str
    tokens: list[str]
    eos_id: int
    fingerprint: str

    @property
    def vocab_size(self) -> int:
        """Embedding rows a model needs: the tokens plus ``<pad>``."""
        return len(self.tokens) + 1

    def encode(self, document) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids):
        raise ValueError(f"tokenizer {self.name!r} cannot decode: its tokenisation is not invertible")
