"""MAESTRO piano performances: the ten ``tests/MIDIs_one_track/Maestro_*.mid`` of PyPI ``miditok`` 3.1.0's source
distribution (``poskit data fetch maestro``), read with ``symusic``."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .base import Document, Source
from .locations import find_files

__all__ = ["read_performance", "SOURCE"]


def read_performance(path: Path) -> Iterator[Document]:
    try:
        import symusic
    except ModuleNotFoundError:
        raise ModuleNotFoundError("reading MIDI needs symusic (a miditok dependency): pip install 'poskit[data]'") \
            from None
    yield path.stem, symusic.Score(str(path))


SOURCE = Source("PyPI miditok==3.1.0 sdist: tests/MIDIs_one_track/Maestro_*.mid", "score",
                lambda: find_files("maestro", "Maestro_*.mid", fetch="maestro"), read_performance)
