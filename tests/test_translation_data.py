"""The translation corpus: pair extraction from dictionary lines (no corpus needed), fetching through apt
(runner injected), batching, and, when trans-de-en is on this machine, the split, the BPE and the cache."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from poskit.data import fetch
from poskit.data.sources import trans
from poskit.data.sources.base import CorpusNotPresent
from poskit.tasks.translation import BOS, EOS, PAD, PairSet, make_batch
from extras import need


def _real_corpus() -> Path | None:
    try:
        return trans.locate()
    except CorpusNotPresent:
        return None


REAL = _real_corpus()  # located with the user's POSKIT_DATA, before the fixture below points it elsewhere
needs_corpus = pytest.mark.skipif(REAL is None, reason="the trans-de-en corpus is absent: poskit data fetch translation "
                                                       "(or apt-get install trans-de-en)")


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("POSKIT_DATA", str(tmp_path / "poskit-data"))
    return tmp_path / "poskit-data"


def test_pairs_are_aligned_sub_entries_that_are_sentences():
    lines = [
        "# comment :: ignored",
        "Haus {n} | Das Haus ist sehr alt. | Häuser {pl} :: house | The house is very old. | houses",
        "Er kommt morgen wieder.; Er kehrt morgen zurück. :: He comes back tomorrow.",  # first alternative
        "Wo ist der Bahnhof [Dt.]? :: Where is the station [Br.]?",  # annotations removed
        "Zu kurz. :: Too short.",  # under 4 words
        "A | B | Das ist ein Satz. :: a | This is a sentence.",  # sub-entries cannot be aligned
        "Das Haus ist sehr alt. :: The building is very old.",  # a German sentence already kept
        "Es war einmal ein König :: Once upon a time there was a king",  # no final punctuation
    ]
    assert trans.sentence_pairs(lines) == [("Das Haus ist sehr alt.", "The house is very old."),
                                           ("Er kommt morgen wieder.", "He comes back tomorrow."),
                                           ("Wo ist der Bahnhof?", "Where is the station?")]


def test_unreadable_corpus_file_is_named(tmp_path):
    bad = tmp_path / "de-en"
    bad.write_bytes(b"\xff\xfe not utf-8 :: x")
    with pytest.raises(ValueError, match=str(bad)):
        trans.read_pairs(bad)
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no 'German :: English' sentence pair"):
        trans.read_pairs(empty)


def test_fetch_translation_downloads_the_debian_package(data_home):
    calls = []

    def run(cmd, cwd=None, **kw):
        calls.append(cmd)
        if cmd[0] == "apt-get":
            (Path(cwd) / "trans-de-en_1.9-6_all.deb").write_bytes(b"deb")
        else:
            target = Path(cmd[3]) / "usr/share/trans"
            target.mkdir(parents=True)
            (target / "de-en").write_text("Das ist ein Satz. :: This is a sentence.\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    files = fetch("translation", run=run)
    assert calls[0] == ["apt-get", "download", "trans-de-en"] and calls[1][:2] == ["dpkg-deb", "-x"]
    if not Path(trans.SYSTEM, "de-en").exists():  # an installed package is found first
        assert trans.locate() == files[0]
    assert trans.read_pairs(files[0]) == [("Das ist ein Satz.", "This is a sentence.")]


def test_batches_put_bos_and_eos_around_the_target_and_mask_the_padding():
    src = [np.array([5, 6, 7]), np.array([8])]
    tgt = [np.array([9]), np.array([10, 11])]
    b = make_batch(src, tgt, [0, 1])
    assert b.src.tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 9, PAD], [BOS, 10, 11]]
    assert b.tgt_out.tolist() == [[9, EOS, PAD], [10, 11, EOS]]
    assert b.src_mask.tolist() == [[True] * 3, [True, False, False]]
    assert b.tgt_mask.tolist() == [[True, True, False], [True] * 3] and b.n_target_tokens == 5


def test_epoch_batches_partition_the_pairs_within_the_token_budget_and_repeat_per_seed():
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 50, rng.integers(1, 30)) for _ in range(300)]
    tgt = [rng.integers(4, 50, rng.integers(1, 30)) for _ in range(300)]
    pairs = PairSet(src, tgt)
    batches = pairs.epoch_batches(200, seed=3, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(300))
    for b in batches:
        width = max(max(len(src[i]), len(tgt[i]) + 1) for i in b)
        assert len(b) == 1 or width * len(b) <= 200
    assert batches == pairs.epoch_batches(200, seed=3, epoch=1)
    assert batches != pairs.epoch_batches(200, seed=3, epoch=2)
    short = pairs.drop_longer_than(10)
    assert all(len(s) <= 10 and len(t) <= 10 for s, t in zip(short.src, short.tgt)) and 0 < len(short) < 300
    with pytest.raises(ValueError, match="empty side"):
        PairSet([np.array([1]), np.array([], dtype=np.int64)], [np.array([1]), np.array([2])])


@needs_corpus
def test_split_tokenizer_and_cache_on_the_real_corpus(data_home, capsys):
    need("tokenizers", "data", "tokenizers (the translation BPE)")
    link = data_home / "fetched" / "translation" / "files" / "share"
    link.mkdir(parents=True)
    os.symlink(REAL, link / "de-en")
    from poskit.data.translation import load_translation

    data = load_translation(vocab_size=400, limit=600)
    assert data.built_seconds is not None and data.tokenizer.vocab_size == 400
    german = {s: {de for de, _ in data.pairs[s]} for s in data.pairs}
    assert sum(len(p) for p in data.pairs.values()) == 600
    assert not (german["train"] & german["test"]) and not (german["train"] & german["validation"])
    for split in ("train", "test"):  # exact round trip through the byte-level BPE
        for lang, side in (("de", 0), ("en", 1)):
            ids = data.ids(split, lang)
            assert [data.tokenizer.decode(i) for i in ids] == [p[side] for p in data.pairs[split]]
    again = load_translation(vocab_size=400, limit=600)
    assert again.built_seconds is None and again.pairs == data.pairs
    # a corrupted token file is noticed and rebuilt, never used
    victim = next(data_home.glob("tokens/translation/bpe-400/first-600/test.en.tokens"))
    victim.write_bytes(b"\x00" * victim.stat().st_size)
    rebuilt = load_translation(vocab_size=400, limit=600)
    assert rebuilt.built_seconds is not None and "rebuilding the translation/bpe-400 cache" in capsys.readouterr().err
    with pytest.raises(ValueError, match="vocab_size"):
        load_translation(vocab_size=10)
