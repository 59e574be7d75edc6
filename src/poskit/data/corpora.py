"""The registry of corpora: each one's source, default tokenizer, split fractions, training-only augmentation and
the paper's context length.  ``hf:<dataset>`` names a Hugging Face dataset (GPT-2 BPE by default)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from .sources import genome, jsb, maestro, plays, stdlib, wiki
from .sources.base import Source
from .sources.hf import PREFIX, hf_source

__all__ = ["CorpusSpec", "CORPORA", "available_corpora", "get_corpus", "transpositions"]


def transpositions(doc_id: str, score) -> Iterator[tuple[str, object]]:
    """The Music Transformer's augmentation: the performance transposed by -3..+3 semitones (0 included)."""
    from miditok.data_augmentation import augment_score

    for k in range(-3, 4):
        yield (doc_id if k == 0 else f"{doc_id}@{k:+d}"), (score if k == 0 else augment_score(score, pitch_offset=k))


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    summary: str
    source: Source
    tokenizer: str
    fractions: tuple[float, float, float]  # train, validation, test (by document)
    paper_context: int | None  # the papers' training sequence length, where given
    approx_tokens: int  # measured here with the default tokenizer, all splits, augmentation and <eos> included
    #                    (code: the CPython 3.11 standard library; other versions differ)
    augment_train: Callable[[str, object], Iterator[tuple[str, object]]] | None = None


CORPORA: dict[str, CorpusSpec] = {s.name: s for s in (
    CorpusSpec("jsb", "Bach chorales, 4 voices at 16th notes, raster-scan (000 Table 2)", jsb.SOURCE,
               "jsb-pitch", (0.6, 0.2, 0.2), 2048, 364_107),
    CorpusSpec("maestro", "MAESTRO piano performances, REMI tokens (000 Table 2)", maestro.SOURCE,
               "remi", (0.8, 0.1, 0.1), 2048, 2_310_809, transpositions),
    CorpusSpec("genome", "16 bacterial genomes, non-overlapping 6-mers (000 Table 3)", genome.SOURCE,
               "dna6", (0.75, 0.125, 0.125), 1000, 8_036_314),
    CorpusSpec("wiki", "English Wikipedia articles, GPT-2 BPE (000 Table 4 / Fig. 2; 004 Table 5)", wiki.SOURCE,
               "gpt2", (0.9, 0.05, 0.05), 1024, 632_561),
    CorpusSpec("plays", "Shakespeare's plays, GPT-2 BPE", plays.SOURCE, "gpt2", (0.8, 0.1, 0.1), 1024, 1_500_206),
    CorpusSpec("code", "Python standard library sources, GPT-2 BPE (004 Table 5, code)", stdlib.SOURCE,
               "gpt2", (0.9, 0.05, 0.05), 4096, 15_323_230),
)}


def available_corpora() -> list[str]:
    return sorted(CORPORA) + [f"{PREFIX}<dataset>"]


def get_corpus(name: str) -> CorpusSpec:
    if isinstance(name, str) and name.startswith(PREFIX):
        return CorpusSpec(name, "Hugging Face dataset (text column)", hf_source(name), "gpt2", (0.9, 0.05, 0.05),
                          None, 0)
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known corpora: {available_corpora()}")
    return CORPORA[name]
