"""Python code: the ``.py`` sources of this interpreter's standard library (``sysconfig``'s ``stdlib`` path, without
``site-packages``), one document per module keyed by its path relative to the library root.  A file that is
not valid UTF-8 (a few test fixtures in other encodings) is decoded with replacement characters."""
from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Iterator

from .base import CorpusNotPresent, Document, Source

__all__ = ["stdlib_root", "stdlib_files", "read_module", "SOURCE"]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    root = stdlib_root()
    files = sorted(p for p in root.rglob("*.py")
                   if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts))
    if not files:
        raise CorpusNotPresent(f"corpus 'code' is not present: no .py files under {root}")
    return files


def read_module(path: Path) -> Iterator[Document]:
    yield str(path.relative_to(stdlib_root())), path.read_bytes().decode("utf-8", errors="replace")


SOURCE = Source("Python standard library: <stdlib>/**/*.py", "text", stdlib_files, read_module)
