"""The token cache's manifest is checked in full before a cached corpus is used: a malformed or edited manifest
is a StaleCache naming the manifest file (and the corpus is rebuilt, saying why), never a raw Python error; a
data home ($POSKIT_DATA) that cannot be created or written is one line naming the variable."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from poskit.cli import main
from poskit.data import load_corpus
from poskit.data.cache import MANIFEST_CHECKSUM, StaleCache, open_split, write_split
from poskit.data.home import DataHomeError

IDENTITY = {"tokenizer": "t", "tokenizer_fingerprint": "abc"}


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("POSKIT_DATA", str(tmp_path / "poskit-data"))
    return tmp_path / "poskit-data"


@pytest.fixture
def cached(tmp_path):
    directory = tmp_path / "cache"
    write_split(directory, "train", np.arange(100, dtype=np.uint16), [("d0", 0, 60), ("d1", 61, 100)], IDENTITY)
    return directory


def _edit(directory, change, keep_checksum=False):
    path = directory / "train.json"
    manifest = json.loads(path.read_text())
    checksum = manifest.pop(MANIFEST_CHECKSUM)
    manifest = change(manifest)
    if keep_checksum and isinstance(manifest, dict):
        manifest[MANIFEST_CHECKSUM] = checksum
    path.write_text(json.dumps(manifest))


def test_the_manifest_records_a_checksum_of_itself_and_opens(cached):
    manifest = json.loads((cached / "train.json").read_text())
    assert len(manifest[MANIFEST_CHECKSUM]) == 64
    assert open_split(cached, "train", IDENTITY).documents == [("d0", 0, 60), ("d1", 61, 100)]


MALFORMED = [
    ("an entry with two values", lambda m: {**m, "documents": [["d0", 0], ["d1", 61, 100]]}, r"documents\[0\]"),
    ("an entry that is a number", lambda m: {**m, "documents": [5]}, r"documents\[0\]"),
    ("a start that is text", lambda m: {**m, "documents": [["d0", "x", 60]]}, r"documents\[0\]"),
    ("an end beyond the tokens", lambda m: {**m, "documents": [["d0", 0, 60], ["d1", 61, 5000]]}, r"documents\[1\]"),
    ("a start after its end", lambda m: {**m, "documents": [["d0", 60, 0]]}, r"documents\[0\]"),
    ("a boolean position", lambda m: {**m, "documents": [["d0", True, 60]]}, r"documents\[0\]"),
    ("documents not a list", lambda m: {**m, "documents": {"d0": [0, 60]}}, r"documents must be a list"),
    ("documents missing", lambda m: {k: v for k, v in m.items() if k != "documents"}, r"documents must be a list"),
    ("a negative token count", lambda m: {**m, "n_tokens": -1}, r"n_tokens must be"),
    ("a token count that is text", lambda m: {**m, "n_tokens": "100"}, r"n_tokens must be"),
    ("no checksum of the token file", lambda m: {k: v for k, v in m.items() if k != "sha256"}, r"sha256 must be"),
    ("a list, not an object", lambda m: [m], r"another format"),
]


@pytest.mark.parametrize("label, change, fragment", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_a_malformed_manifest_is_stale_naming_the_file(cached, label, change, fragment):
    _edit(cached, change)  # written without a checksum, as a manifest of an older poskit
    with pytest.raises(StaleCache, match=rf"^{cached / 'train.json'}.*{fragment}|unreadable.*{fragment}") as e:
        open_split(cached, "train", IDENTITY)
    assert str(cached / "train.json") in str(e.value)


def test_an_edited_but_well_formed_document_list_is_caught_by_the_checksum(cached):
    _edit(cached, lambda m: {**m, "documents": [["d0", 0, 50], ["d1", 51, 100]]}, keep_checksum=True)
    with pytest.raises(StaleCache, match=rf"^{cached / 'train.json'}: does not match its own checksum"):
        open_split(cached, "train", IDENTITY)


def test_a_manifest_without_a_checksum_is_still_read(cached):
    """Caches written before manifests carried their own checksum are checked field by field and used."""
    _edit(cached, lambda m: m)
    assert open_split(cached, "train", IDENTITY).documents == [("d0", 0, 60), ("d1", 61, 100)]


def test_a_corpus_with_a_malformed_manifest_is_rebuilt_saying_which_file(capsys):
    first = load_corpus("code", "bytes", limit=4)
    reference = np.array(first.tokens("train"))
    manifest = str(first.splits["train"].tokens.filename).replace(".tokens", ".json")
    del first
    data = json.loads(open(manifest).read())
    data["documents"] = [entry[:2] for entry in data["documents"]]  # [doc_id, start]: one value short
    del data[MANIFEST_CHECKSUM]  # as in a cache written before manifests had one (else the checksum names it)
    open(manifest, "w").write(json.dumps(data))
    rebuilt = load_corpus("code", "bytes", limit=4)
    assert rebuilt.built_seconds is not None and np.array_equal(rebuilt.tokens("train"), reference)
    err = capsys.readouterr().err
    assert f"rebuilding the code/bytes cache: {manifest}: documents[0] must be" in err, err


def test_data_list_reads_a_malformed_manifest_without_a_traceback(data_home, capsys):
    directory = data_home / "tokens" / "code" / "bytes" / "all"
    directory.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        (directory / f"{split}.json").write_text("[1, 2]")
    assert main(["data", "list"]) == 0
    assert "\ncode " in capsys.readouterr().out


# -- the data home ---------------------------------------------------------------------------------------------

def test_a_data_home_that_is_a_file_is_one_line_naming_poskit_data(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("POSKIT_DATA", str(blocker))
    with pytest.raises(DataHomeError, match=rf"^POSKIT_DATA={str(blocker)!r}: cannot create .*Not a directory.*; "
                                            "set POSKIT_DATA to a writable directory"):
        load_corpus("code", "bytes", limit=4)
    with pytest.raises(SystemExit) as e:
        main(["data", "prepare", "code", "--tokenizer", "bytes", "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("poskit data: error: POSKIT_DATA="), err
    assert blocker.read_text() == "not a directory"


def test_a_data_home_that_cannot_be_created_names_poskit_data(monkeypatch):
    monkeypatch.setenv("POSKIT_DATA", "/proc/poskit-data-test")
    with pytest.raises(DataHomeError, match=r"^POSKIT_DATA='/proc/poskit-data-test': cannot create "):
        load_corpus("code", "bytes", limit=4)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_data_home_names_poskit_data(tmp_path, monkeypatch):
    home = tmp_path / "read-only"
    home.mkdir()
    home.chmod(0o555)
    monkeypatch.setenv("POSKIT_DATA", str(home))
    try:
        with pytest.raises(DataHomeError, match=r"^POSKIT_DATA=.*: cannot (create|write)"):
            load_corpus("code", "bytes", limit=4)
    finally:
        home.chmod(0o755)


def test_a_missing_data_home_is_created(tmp_path, monkeypatch):
    home = tmp_path / "not" / "yet"
    monkeypatch.setenv("POSKIT_DATA", str(home))
    assert load_corpus("code", "bytes", limit=4).built_seconds is not None
    assert (home / "tokens").is_dir()


def test_fetch_into_a_data_home_that_is_a_file_names_poskit_data(tmp_path, monkeypatch):
    from poskit.data import fetch

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("POSKIT_DATA", str(blocker))

    def no_download(*args, **kwargs):
        raise AssertionError("nothing is downloaded into a data home that cannot be written")

    with pytest.raises(DataHomeError, match=r"^POSKIT_DATA=.*: cannot create"):
        fetch("genome", run=no_download)
