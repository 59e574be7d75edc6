"""Character-level tokenisation for any text: its UTF-8 bytes (ids 1..256) and ``<eos>`` (257) between
documents.  A fixed vocabulary, so caches and models do not depend on which characters a corpus happens to use."""
from __future__ import annotations

import numpy as np

from .base import Tokenizer, fingerprint_of

__all__ = ["Bytes"]


class Bytes(Tokenizer):
    name = "bytes"
    payload = "text"

    def __init__(self) -> None:
        self.tokens = [f"<0x{b:02X}>" for b in range(256)] + ["<eos>"]
        self.eos_id = 257
        self.fingerprint = fingerprint_of("bytes-utf8", self.tokens)

    def encode(self, document: str) -> np.ndarray:
        return np.frombuffer(document.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 1

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        return bytes(i - 1 if i != self.eos_id else 10 for i in ids).decode("utf-8", errors="replace")
