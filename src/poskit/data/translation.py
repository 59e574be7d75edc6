"""The German-English translation corpus: sentence pairs, a deterministic split, a joint subword vocabulary
trained on the training side only, and token ids cached like the other corpora.

    >>> from poskit.data.translation import load_translation
    >>> data = load_translation(vocab_size=8000)      # tokenised once, then read from the cache
    >>> data.pairs["test"][0]                         # ("German sentence.", "English sentence.")
    >>> data.ids("test", "de")[0]                     # int array of the first test pair's German subwords

Splits are by German sentence through `assign_splits` (sha256 of a salt and the sentence), 90/5/5. The
tokenizer is a byte-level BPE of the Hugging Face `tokenizers` package with one vocabulary for both languages
(as the papers' joint BPE), trained on the German and English training sentences; ids 0-3 are <pad>, <s>,
</s>, <unk>. Cache: ``$POSKIT_DATA/tokens/translation/bpe-<V>/<all|first-N>/``: ``tokenizer.json`` and, per
split and language, ``<split>.<lang>.tokens|.json`` written by `poskit.data.cache` (manifest with the source
fingerprint, extraction rule, split rule, vocabulary size and the sha256 of tokenizer.json; checked on
every load, rebuilt with one line on stderr when anything differs).
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..util.durable import fsync_dir, write_synced
from .cache import StaleCache, build_lock, open_split, read_manifest, write_split
from .home import data_home
from .sources import trans
from .sources.base import CorpusNotPresent
from .splits import SPLITS, assign_splits

__all__ = ["LANGUAGES", "SPECIAL_TOKENS", "SubwordTokenizer", "TranslationData", "load_translation",
           "translation_row"]

LANGUAGES = ("de", "en")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0, 1, 2, 3
FRACTIONS = (0.9, 0.05, 0.05)
SALT = "poskit-translation-split-v1"
MIN_VOCAB = 300  # 256 byte symbols + the 4 special tokens + a few merges
APPROX_PAIRS = 18_512


def _tokenizers():
    try:
        import tokenizers
    except ModuleNotFoundError:
        raise CorpusNotPresent("the translation corpus needs the Hugging Face tokenizers package: "
                               "pip install -c constraints.txt 'poskit[data]'") from None
    return tokenizers


class SubwordTokenizer:
    """A trained byte-level BPE: `encode(text) -> int64 array` (no special tokens), `decode(ids) -> text`
    (exact round trip), `vocab_size`, `pad_id`/`bos_id`/`eos_id`, and the sha256 of its JSON (`fingerprint`)."""

    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(self, json_text: str):
        self._tok = _tokenizers().Tokenizer.from_str(json_text)
        self.fingerprint = hashlib.sha256(json_text.encode()).hexdigest()
        self.vocab_size = self._tok.get_vocab_size()

    @classmethod
    def train(cls, texts: list[str], vocab_size: int) -> "SubwordTokenizer":
        tk = _tokenizers()
        tok = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
        # byte-level: every string round-trips, and a German or English word never maps to <unk>
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                         initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                         show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return cls(tok.to_str())

    def to_str(self) -> str:
        return self._tok.to_str()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids if int(i) > self.unk_id]  # special tokens are not text
        return self._tok.decode(ids).strip()  # the prefix space the pre-tokenizer adds


@dataclass
class TranslationData:
    tokenizer: SubwordTokenizer
    pairs: dict  # split -> [(German, English), ...]
    tokens: dict  # (split, language) -> CachedSplit (ids of every sentence, one document per pair)
    built_seconds: float | None  # time spent building the cache in this call (None: read from it)

    def ids(self, split: str, language: str) -> list[np.ndarray]:
        """The token ids of every sentence of `split` in `language` ("de" or "en"), in pair order."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        if language not in LANGUAGES:
            raise ValueError(f"language must be one of {list(LANGUAGES)}, got {language!r}")
        cached = self.tokens[(split, language)]
        return [np.asarray(cached.tokens[s:e], dtype=np.int64) for _, s, e in cached.documents]


def _directory(vocab_size: int, limit: int | None) -> Path:
    return data_home() / "tokens" / "translation" / f"bpe-{vocab_size}" / ("all" if limit is None else f"first-{limit}")


def _source_fingerprint(path: Path) -> str:
    return hashlib.sha256(f"{path.name}\0{path.stat().st_size}".encode()).hexdigest()


def _split_pairs(pairs: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    which = assign_splits([de for de, _ in pairs], FRACTIONS, SALT)
    return {s: [p for p in pairs if which[p[0]] == s] for s in SPLITS}


def _identity(path: Path, vocab_size: int, limit: int | None, tokenizer_sha: str) -> dict:
    return {"corpus": "translation", "source": str(path.name), "source_fingerprint": _source_fingerprint(path),
            "extraction_rule": trans.EXTRACTION_RULE, "limit": limit, "tokenizer": f"bpe-{vocab_size}",
            "tokenizer_fingerprint": tokenizer_sha,
            "split_rule": {"fractions": list(FRACTIONS), "salt": SALT, "by": "German sentence"}}


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_synced(tmp, lambda f: f.write(text.encode()))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def _open(directory: Path, path: Path, vocab_size: int, limit: int | None):
    tok_file = directory / "tokenizer.json"
    if not tok_file.is_file():
        raise StaleCache(f"no cache at {tok_file}")
    try:
        text = tok_file.read_text()
        tok = SubwordTokenizer(text)
    except Exception as e:  # any failure to read or parse it: a stale cache, rebuilt
        raise StaleCache(f"unreadable tokenizer {tok_file}: {type(e).__name__}: {e}") from None
    if tok.vocab_size != vocab_size:
        raise StaleCache(f"{tok_file} has {tok.vocab_size} tokens, not {vocab_size}")
    identity = _identity(path, vocab_size, limit, tok.fingerprint)
    return tok, {(s, lang): open_split(directory, f"{s}.{lang}", identity) for s in SPLITS for lang in LANGUAGES}


def _build(directory: Path, path: Path, split: dict, vocab_size: int, limit: int | None) -> None:
    train_texts = [t for pair in split["train"] for t in pair]
    tok = SubwordTokenizer.train(train_texts, vocab_size)
    if tok.vocab_size != vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is more than BPE can learn from the {len(split['train'])} "
                         f"training pairs (it stopped at {tok.vocab_size}); choose a smaller vocab_size")
    directory.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:  # the old manifests must not vouch for token files of another tokenizer
        for lang in LANGUAGES:
            (directory / f"{s}.{lang}.json").unlink(missing_ok=True)
    _write_text(directory / "tokenizer.json", tok.to_str())
    identity = _identity(path, vocab_size, limit, tok.fingerprint)
    for s in SPLITS:
        for li, lang in enumerate(LANGUAGES):
            encoded = tok.encode_many([pair[li] for pair in split[s]])
            bounds, start = [], 0
            for i, ids in enumerate(encoded):
                bounds.append((str(i), start, start + len(ids)))
                start += len(ids)
            stream = np.concatenate(encoded).astype(np.uint16) if encoded else np.zeros(0, np.uint16)
            write_split(directory, f"{s}.{lang}", stream, bounds, identity)


def load_translation(vocab_size: int = 8000, limit: int | None = None, quiet: bool = False) -> TranslationData:
    """The split sentence pairs and their subword ids, from the cache when it is valid, else built now.
    vocab_size: the joint BPE vocabulary, special tokens included (>= 300, <= 65536); limit: only the first
    `limit` pairs of the corpus in file order (a small slice for tests, cached separately)."""
    from ..util.validate import check_int

    check_int(vocab_size, "vocab_size", minimum=MIN_VOCAB, maximum=2 ** 16)
    if limit is not None:
        check_int(limit, "limit", minimum=20)
    path = trans.locate()
    pairs = trans.read_pairs(path)
    if limit is not None:
        pairs = pairs[:limit]
    split = _split_pairs(pairs)
    directory = _directory(vocab_size, limit)
    try:
        tok, tokens = _open(directory, path, vocab_size, limit)
        if all(len(tokens[(s, "de")].documents) == len(split[s]) for s in SPLITS):
            return TranslationData(tok, split, tokens, None)
        why = "the number of pairs per split changed"
    except StaleCache as e:
        why = str(e)
    if not quiet and "no cache at" not in why:
        print(f"poskit.data: rebuilding the translation/bpe-{vocab_size} cache: {why}", file=sys.stderr)
    with build_lock(directory):  # two workers that found no cache at once build it once (data/cache.py)
        try:
            tok, tokens = _open(directory, path, vocab_size, limit)
            if all(len(tokens[(s, "de")].documents) == len(split[s]) for s in SPLITS):
                return TranslationData(tok, split, tokens, None)
        except StaleCache:
            pass
        t0 = time.perf_counter()
        _build(directory, path, split, vocab_size, limit)
        built = time.perf_counter() - t0
        tok, tokens = _open(directory, path, vocab_size, limit)
        return TranslationData(tok, split, tokens, built)


def translation_row(vocab_size: int = 8000) -> dict:
    """The `poskit data list` row of the translation corpus."""
    try:
        trans.locate()
        present = "yes"
    except CorpusNotPresent:
        present = "no: poskit data fetch translation"
    try:
        manifests = [read_manifest(_directory(vocab_size, None) / f"{s}.en.json") for s in SPLITS]
        pairs = f"{sum(len(m['documents']) for m in manifests):,} pairs (cached)"
    except StaleCache:  # none built, or one the next load rebuilds
        pairs = f"~{APPROX_PAIRS:,} pairs"
    return {"name": "translation", "present": present, "tokens": pairs, "tokenizer": f"bpe-{vocab_size}",
            "source": "Debian trans-de-en: /usr/share/trans/de-en example sentences (German :: English)"}
