"""Tokenise a corpus once, cache it, and reload it from the cache (memory-mapped) on every later run.

The cache is used only when its manifest matches the corpus source (file names and sizes), the tokenizer's
fingerprint and the split rule, and its checksum verifies; otherwise it is rebuilt, saying why on stderr."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from .cache import CachedSplit, StaleCache, build_lock, open_split, token_dtype, write_split
from .corpora import CorpusSpec, get_corpus
from .home import cache_dir
from .splits import SPLITS, assign_splits
from .tokenizers import Tokenizer, build_tokenizer

__all__ = ["LoadedCorpus", "load_corpus", "corpus_identity"]

SALT = "poskit-split-v1"


@dataclass
class LoadedCorpus:
    name: str
    tokenizer: Tokenizer
    splits: dict[str, CachedSplit]
    built_seconds: float | None  # time spent tokenising in this call (None: read from the cache)

    def tokens(self, split: str) -> np.ndarray:
        if split not in self.splits:
            raise ValueError(f"split must be one of {list(self.splits)}, got {split!r}")
        return self.splits[split].tokens


def _check_tokenizer(spec: CorpusSpec, name: str | None) -> Tokenizer:
    tok = build_tokenizer(name or spec.tokenizer)
    if tok.payload != spec.source.payload:
        from .tokenizers import TOKENIZERS

        fits = sorted(n for n, cls in TOKENIZERS.items() if cls.payload == spec.source.payload)
        raise ValueError(f"tokenizer {tok.name!r} reads {tok.payload} documents; corpus {spec.name!r} has "
                         f"{spec.source.payload} documents: use one of {fits}")
    return tok


def corpus_identity(spec: CorpusSpec, tok: Tokenizer, limit: int | None) -> dict:
    """What a cache must have been built from to be used: source, tokenizer, split rule."""
    return {"corpus": spec.name, "source": spec.source.describe, "source_fingerprint": spec.source.fingerprint(),
            "limit": limit, "tokenizer": tok.name, "tokenizer_fingerprint": tok.fingerprint,
            "split_rule": {"fractions": list(spec.fractions), "salt": SALT,
                           "train_augmentation": getattr(spec.augment_train, "__name__", None)}}


def _encode_all(tok: Tokenizer, docs: list[tuple[str, object]]) -> list[np.ndarray]:
    if hasattr(tok, "encode_many"):  # GPT-2: tiktoken's batch encoder uses threads
        return tok.encode_many([payload for _, payload in docs])
    return [tok.encode(payload) for _, payload in docs]


def _build(spec: CorpusSpec, tok: Tokenizer, limit: int | None, directory, identity: dict) -> None:
    docs = list(spec.source.documents(limit))
    if not docs:
        raise ValueError(f"corpus {spec.name!r} has no documents")
    which = assign_splits([d for d, _ in docs], spec.fractions, SALT)
    dtype = token_dtype(tok.vocab_size)
    for split in SPLITS:
        members = [(d, p) for d, p in docs if which[d] == split]
        if split == "train" and spec.augment_train is not None:
            members = [aug for d, p in members for aug in spec.augment_train(d, p)]
        encoded = _encode_all(tok, members)
        bounds, start = [], 0
        for (doc_id, _), ids in zip(members, encoded):
            bounds.append((doc_id, start, start + len(ids)))
            start += len(ids) + 1  # + <eos>
        stream = np.empty(start, dtype=dtype)
        for (_, s, e), ids in zip(bounds, encoded):
            stream[s:e] = ids
            stream[e] = tok.eos_id
        write_split(directory, split, stream, bounds, identity)


def load_corpus(name: str, tokenizer: str | None = None, limit: int | None = None,
                quiet: bool = False) -> LoadedCorpus:
    """The train/validation/test token streams of corpus ``name`` (documents joined by the tokenizer's
    ``eos_id``), from the cache when it is valid, else tokenised now and cached.  ``limit`` takes only the first
    ``limit`` documents (a small slice, cached separately)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 3):
        raise ValueError(f"limit must be an int >= 3 (documents for three splits) or None, got {limit!r}")
    spec = get_corpus(name)
    tok = _check_tokenizer(spec, tokenizer)
    identity = corpus_identity(spec, tok, limit)
    directory = cache_dir(spec.name, tok.name) / ("all" if limit is None else f"first-{limit}")
    try:
        return LoadedCorpus(spec.name, tok, {s: open_split(directory, s, identity) for s in SPLITS}, None)
    except StaleCache as why:
        if not quiet and "no cache at" not in str(why):
            print(f"poskit.data: rebuilding the {spec.name}/{tok.name} cache: {why}", file=sys.stderr)
    with build_lock(directory):
        try:  # built by another process while this one waited for the lock
            return LoadedCorpus(spec.name, tok, {s: open_split(directory, s, identity) for s in SPLITS}, None)
        except StaleCache:
            pass
        t0 = time.perf_counter()
        _build(spec, tok, limit, directory, identity)
        built = time.perf_counter() - t0
        return LoadedCorpus(spec.name, tok, {s: open_split(directory, s, identity) for s in SPLITS}, built)
