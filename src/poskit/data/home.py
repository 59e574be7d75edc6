"""Where poskit keeps fetched corpus artifacts and token caches: ``$POSKIT_DATA``, else the user's cache dir."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_home", "fetched_dir", "cache_dir"]


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
