"""An offline stand-in for a GLUE task, in CoLA's format: is this sentence in its own word order (label 1) or
are its words shuffled (label 0)?

GLUE cannot be downloaded on a machine without network, so `poskit finetune-glue RUN --task cola --data
word-order` fine-tunes on this instead, end to end through the same recipe. It is built from the sentences of
the Wikipedia extract (`poskit.data`'s "wiki" corpus) that an MLM pre-trained on `mlm-wiki` never saw: the
training examples come from the corpus's validation documents, the evaluation examples from its test documents
(the corpus's own document split). Each sentence appears once, with a label drawn at random; a label-0 sentence is
a permutation of its own words that differs from the original. Both labels lose the final punctuation and the
capital first letter, so that only the order of the words tells them apart. The task is about word order, so it asks what
position information gives an encoder, which is what RoFormer's GLUE comparison (paper 002, Table 2) measures at
scale; it is not CoLA, whose unacceptable sentences are grammatical errors, and no GLUE number compares with it.
"""
from __future__ import annotations

import re

import numpy as np

from ..util.validate import check_int

__all__ = ["WORD_ORDER", "word_order_dataset", "word_order_sentences"]

WORD_ORDER = "word-order"  # the name `--data` takes
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def word_order_sentences(split: str, *, min_words: int = 6, max_words: int = 40) -> list[str]:
    """The sentences of the wiki corpus's documents of `split` ("validation" or "test"), in document order:
    lines cut at sentence ends, kept when they have min_words-max_words words and start with a capital letter
    (headings and list items are left out)."""
    from ..data.corpora import get_corpus
    from ..data.loader import SALT
    from ..data.splits import assign_splits

    spec = get_corpus("wiki")
    docs = list(spec.source.documents())
    which = assign_splits([d for d, _ in docs], spec.fractions, SALT)
    out = []
    for doc_id, text in docs:
        if which[doc_id] != split:
            continue
        for line in str(text).splitlines():
            for sentence in _SENTENCE_END.split(line.strip()):
                words = sentence.split()
                if min_words <= len(words) <= max_words and sentence[:1].isupper():
                    out.append(sentence)
    return out


def _shuffled(sentence: str, rng: np.random.Generator) -> str:
    words = sentence.split()
    if len(set(words)) < 2:
        raise ValueError(f"a sentence needs two different words to be shuffled, got {sentence!r}")
    while True:
        order = rng.permutation(len(words))
        shuffled = [words[i] for i in order]
        if shuffled != words:
            return " ".join(shuffled)


def _plain(sentence: str) -> str:
    """The sentence without its final punctuation and with a lower-case first letter, its whitespace normalised:
    what both labels are made from, so that neither a capital letter at the start nor a full stop at the end
    says which label a sentence has; only the order of the words does."""
    text = " ".join(sentence.split()).rstrip(".!?")
    return text[:1].lower() + text[1:]


def _examples(sentences: list[str], limit: int | None, rng: np.random.Generator) -> dict:
    sentences = [p for p in map(_plain, sentences) if len(set(p.split())) >= 2][:limit]
    labels = rng.integers(0, 2, len(sentences)).tolist()
    # a shuffled sentence's first word is lower-cased too: a capital at the start would otherwise mark label 0
    rows = [s if y else _shuffled(s, rng) for s, y in zip(sentences, labels)]
    return {"sentence": [r[:1].lower() + r[1:] for r in rows], "label": labels}


def word_order_dataset(*, seed: int = 0, max_train: int | None = None, max_eval: int | None = None):
    """A datasets.DatasetDict with "train" (from the wiki corpus's validation documents) and "validation" (from
    its test documents), columns "sentence" and "label" (CoLA's), deterministic for a seed."""
    try:
        import datasets
    except ModuleNotFoundError:
        raise ValueError("the word-order task is built with the datasets package: pip install -c constraints.txt "
                         "-e '.[data]'") from None
    check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng([seed, 7])
    train = _examples(word_order_sentences("validation"), max_train, rng)
    evaluation = _examples(word_order_sentences("test"), max_eval, rng)
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(train),
                                 "validation": datasets.Dataset.from_dict(evaluation)})
