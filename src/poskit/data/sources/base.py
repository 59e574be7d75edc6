"""A corpus source: where its raw files are, and how one file becomes documents ``(doc_id, payload)``."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["CorpusNotPresent", "Source", "Document"]

Document = tuple  # (doc_id: str, payload)


class CorpusNotPresent(ValueError):
    """The corpus's files (or the package that reads them) are not on this machine; the message says how to get
    them, in one line.  A ValueError, so the CLI reports it as bad input, not a traceback."""


@dataclass
class Source:
    """``locate()`` lists the raw files (or raises :class:`CorpusNotPresent`); ``read(path)`` yields the
    documents of one file.  ``describe`` is what ``poskit data list`` shows as the source."""

    describe: str
    payload: str
    locate: Callable[[], list[Path]]
    read: Callable[[Path], Iterator[Document]]

    def documents(self, limit: int | None = None) -> Iterator[Document]:
        """The documents in file order; ``limit`` stops after that many (small slices for tests)."""
        n = 0
        for path in self.locate():
            try:
                docs = list(self.read(path))
            except CorpusNotPresent:
                raise
            except ModuleNotFoundError as e:  # the reader's package (music21, symusic) is not installed
                raise CorpusNotPresent(str(e)) from None
            except Exception as e:  # any parser's error: say which file it was
                raise ValueError(f"cannot read corpus file {path}: {type(e).__name__}: {e}") from e
            for doc in docs:
                if limit is not None and n >= limit:
                    return
                yield doc
                n += 1

    def fingerprint(self) -> str:
        """Changes when a raw file is added, removed, renamed or resized (cheap: no file is read).  A located
        directory stands for the files under it; a name that is no path (a hub dataset) for itself."""
        h = hashlib.sha256(self.describe.encode())
        for p in self.locate():
            files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p] if p.exists() else []
            h.update(f"{p.name}\0".encode())
            for f in files:
                h.update(f"{f.relative_to(p) if f != p else f.name}\0{f.stat().st_size}\0".encode())
        return h.hexdigest()
