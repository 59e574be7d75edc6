"""Memory-mapped token arrays with a JSON manifest, written atomically and verified before use.

One split of one (corpus, tokenizer) pair is two files: ``<split>.tokens`` (raw uint16 or uint32 ids) and
``<split>.json`` (the manifest: format, source, tokenizer name and fingerprint, split rule, dtype, token count,
document boundaries, the sha256 of the token file and the sha256 of the manifest itself).  Both are written to a temporary file, fsynced and renamed
into place, the manifest last, so a crash leaves either the old cache or no manifest, never a torn one.

:func:`open_split` returns the tokens only when the manifest matches what the caller expects (same source, same
tokenizer fingerprint, same split rule), the manifest is well formed and matches its own checksum, and the token
file's size and sha256 match the manifest; otherwise it raises :class:`StaleCache` naming the file and what is
wrong, and the caller rebuilds.  A corrupt cache is never used.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..util.durable import fsync_dir, write_synced
from ..util.file_lock import file_lock
from .home import writable_dir

__all__ = ["FORMAT_VERSION", "MANIFEST_CHECKSUM", "StaleCache", "CachedSplit", "build_lock", "read_manifest",
           "token_dtype", "write_split", "open_split"]

FORMAT_VERSION = 1
# the manifest's checksum of itself (every other field, the document list included). Optional, so that caches
# written before it are still used (checked field by field) and readers that predate it still read new caches.
MANIFEST_CHECKSUM = "manifest_sha256"


class StaleCache(Exception):
    """The cache on disk is missing, corrupt or was built from other inputs (the message says which)."""


@dataclass
class CachedSplit:
    """A split's tokens (read-only memory map) and its document boundaries ``[(doc_id, start, end), ...]``."""

    tokens: np.ndarray
    documents: list[tuple[str, int, int]]
    manifest: dict


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_synced(tmp, lambda f: f.write(data))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _paths(directory: Path, split: str) -> tuple[Path, Path]:
    return directory / f"{split}.tokens", directory / f"{split}.json"


def write_split(directory: Path, split: str, tokens: np.ndarray, documents: list[tuple[str, int, int]],
                identity: dict) -> None:
    """Write one split.  ``identity`` (source, tokenizer, split rule ...) is stored in the manifest and must be
    passed unchanged to :func:`open_split` for the cache to be used again."""
    if tokens.ndim != 1 or tokens.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"tokens must be a 1-D uint16 or uint32 array, got {tokens.dtype} with shape {tokens.shape}")
    directory.mkdir(parents=True, exist_ok=True)
    token_path, manifest_path = _paths(directory, split)
    if manifest_path.exists():
        manifest_path.unlink()  # the old manifest must not vouch for the new token file while it is written
    _atomic_write(token_path, np.ascontiguousarray(tokens).tobytes())
    manifest = {"format": FORMAT_VERSION, **identity, "split": split, "dtype": tokens.dtype.name,
                "n_tokens": int(tokens.size), "documents": [list(d) for d in documents],
                "sha256": _sha256(token_path)}
    manifest[MANIFEST_CHECKSUM] = _manifest_sha256(manifest)
    _atomic_write(manifest_path, json.dumps(manifest, indent=1).encode())
    fsync_dir(directory)


def open_split(directory: Path, split: str, identity: dict, verify: bool = True) -> CachedSplit:
    """The cached split if it is intact and was built from ``identity``; :class:`StaleCache` otherwise."""
    token_path, manifest_path = _paths(directory, split)
    if not manifest_path.is_file() or not token_path.is_file():
        raise StaleCache(f"no cache at {manifest_path}")
    manifest = read_manifest(manifest_path)
    for key, value in identity.items():
        if manifest.get(key) != value:
            raise StaleCache(f"{manifest_path}: {key} changed (cached {manifest.get(key)!r}, now {value!r})")
    if manifest.get("split") != split:
        raise StaleCache(f"{manifest_path} does not describe split {split!r}")
    dtype = np.dtype(manifest["dtype"])
    if token_path.stat().st_size != manifest["n_tokens"] * dtype.itemsize:
        raise StaleCache(f"{token_path} has {token_path.stat().st_size} bytes, the manifest says "
                         f"{manifest['n_tokens']} {dtype.name} tokens")
    if verify and _sha256(token_path) != manifest["sha256"]:
        raise StaleCache(f"{token_path} does not match its manifest's sha256 checksum")
    tokens = np.memmap(token_path, dtype=dtype, mode="r") if manifest["n_tokens"] else np.zeros(0, dtype)
    documents = [(str(d), s, e) for d, s, e in manifest["documents"]]
    return CachedSplit(tokens, documents, manifest)


def read_manifest(manifest_path: Path) -> dict:
    """The manifest at `manifest_path`, checked in full (format, dtype, token count, checksums, every document
    entry) and against its own checksum when it has one; StaleCache naming the file and what is wrong."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as e:
        raise StaleCache(f"unreadable manifest {manifest_path}: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise StaleCache(f"{manifest_path} has another format than {FORMAT_VERSION}")
    if MANIFEST_CHECKSUM in manifest and manifest[MANIFEST_CHECKSUM] != _manifest_sha256(manifest):
        raise StaleCache(f"{manifest_path}: does not match its own checksum ({MANIFEST_CHECKSUM}): it was edited "
                         "or damaged")
    if manifest.get("dtype") not in ("uint16", "uint32"):
        raise StaleCache(f"{manifest_path}: dtype must be uint16 or uint32, got {manifest.get('dtype')!r}")
    n = manifest.get("n_tokens")
    if not _is_int(n) or n < 0:
        raise StaleCache(f"{manifest_path}: n_tokens must be a non-negative int, got {n!r}")
    if not isinstance(manifest.get("sha256"), str):
        raise StaleCache(f"{manifest_path}: sha256 must be the token file's checksum, got {manifest.get('sha256')!r}")
    documents = manifest.get("documents")
    if not isinstance(documents, list):
        raise StaleCache(f"{manifest_path}: documents must be a list of [doc_id, start, end], got "
                         f"{type(documents).__name__}")
    for i, entry in enumerate(documents):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], (str, int))
                and not isinstance(entry[0], bool) and _is_int(entry[1]) and _is_int(entry[2])
                and 0 <= entry[1] <= entry[2] <= n):
            raise StaleCache(f"{manifest_path}: documents[{i}] must be [doc_id, start, end] with 0 <= start <= "
                             f"end <= n_tokens ({n}), got {entry!r}")
    return manifest


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _manifest_sha256(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != MANIFEST_CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@contextlib.contextmanager
def build_lock(directory: Path):
    """Hold an exclusive lock on building the cache in ``directory`` (a file lock beside it, so it works before
    the directory exists). Two processes that find no cache at once (two training workers of one compare)
    would otherwise rebuild together, and one's write_split removes the manifest the other is about to open.
    The caller checks the cache again once it holds the lock: the other process may have built it."""
    directory = Path(directory)
    writable_dir(directory.parent)  # an unusable data home is named before anything starts
    with file_lock(directory.parent / f".{directory.name}.lock"):
        yield
