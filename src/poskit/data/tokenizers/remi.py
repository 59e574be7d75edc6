"""REMI tokens of a MIDI performance (``miditok`` 3.1.0's REMI with its default configuration: PAD, BOS, EOS
and MASK specials, so PAD is id 0 as poskit needs).  ``<eos>`` is miditok's ``EOS_None``."""
from __future__ import annotations

import importlib.metadata

import numpy as np

from .base import Tokenizer, fingerprint_of

__all__ = ["REMI"]


class REMI(Tokenizer):
    name = "remi"
    payload = "score"

    def __init__(self) -> None:
        try:
            import miditok
        except ModuleNotFoundError:
            raise ModuleNotFoundError("the remi tokenizer needs miditok: pip install 'poskit[data]'") from None
        self._tok = miditok.REMI()
        by_id = sorted(self._tok.vocab.items(), key=lambda kv: kv[1])
        if by_id[0] != ("PAD_None", 0) or [i for _, i in by_id] != list(range(len(by_id))):
            raise ValueError("miditok's REMI vocabulary must number its tokens 0.. with PAD_None at 0")
        self.tokens = [t for t, _ in by_id[1:]]
        self.eos_id = self._tok.vocab["EOS_None"]
        self.fingerprint = fingerprint_of("remi", importlib.metadata.version("miditok"), self.tokens, repr(sorted(self._tok.config.to_dict().items())))

    def encode(self, score) -> np.ndarray:
        seq = self._tok.encode(score)
        if isinstance(seq, list):  # one sequence per track; the performances are single-track piano
            seq = [s for s in seq if len(s.ids)]
            if len(seq) != 1:
                raise ValueError(f"a performance must have exactly one non-empty track, got {len(seq)}")
            seq = seq[0]
        return np.asarray(seq.ids, dtype=np.int64)

    def decode(self, ids):
        """A symusic Score (of the ids before the first ``<eos>``)."""
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._tok.decode([ids])
