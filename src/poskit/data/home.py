"""Where poskit keeps fetched corpus artifacts and token caches: ``$POSKIT_DATA``, else the user's cache dir."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DataHomeError", "data_home", "fetched_dir", "cache_dir", "writable_dir"]


class DataHomeError(ValueError):
    """The data home (or a directory under it) cannot be created or written; the message names where the data
    home was taken from ($POSKIT_DATA, $XDG_CACHE_HOME or the default) and how to choose another."""


def data_home() -> Path:
    """``$POSKIT_DATA`` if set, else ``$XDG_CACHE_HOME/poskit`` (default ``~/.cache/poskit``)."""
    explicit = os.environ.get("POSKIT_DATA")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "poskit"


def fetched_dir(artifact: str) -> Path:
    """Directory holding the extracted files of ``poskit data fetch <artifact>``."""
    return data_home() / "fetched" / artifact


def cache_dir(corpus: str, tokenizer: str) -> Path:
    """Directory of the token cache of one (corpus, tokenizer) pair; ``hf:`` names are made path-safe."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in corpus)
    return data_home() / "tokens" / safe / tokenizer


def writable_dir(directory: Path) -> Path:
    """Create `directory` (one under the data home) if missing and check that files can be written in it;
    a DataHomeError in one line naming the variable the data home came from otherwise. Checked before a
    download or a cache build starts, so that neither fails half-way on an unusable data home."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataHomeError(f"{_source()}: cannot create {directory}: {e.strerror or e}; {_remedy()}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DataHomeError(f"{_source()}: cannot write in {directory}: permission denied; {_remedy()}")
    return directory


def _source() -> str:
    if os.environ.get("POSKIT_DATA"):
        return f"POSKIT_DATA={os.environ['POSKIT_DATA']!r}"
    if os.environ.get("XDG_CACHE_HOME"):
        return f"the data home {str(data_home())!r} (from XDG_CACHE_HOME)"
    return f"the data home {str(data_home())!r}"


def _remedy() -> str:
    if os.environ.get("POSKIT_DATA"):
        return "set POSKIT_DATA to a writable directory (or unset it for the user's cache directory)"
    return "set POSKIT_DATA to a writable directory"
