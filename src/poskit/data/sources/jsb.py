"""Bach chorales from PyPI ``music21`` (``music21/corpus/bach/*.mxl``) as 4 x T pitch matrices at 16th notes.

Voices are taken by part name (Soprano, Alto, Tenor, Bass); chorales lacking one of the four are skipped (so are
the instrumental parts some chorales add).  A chord in a voice contributes its highest pitch; a grid cell holds the
pitch sounding at its onset, ``-1`` for silence; notes shorter than a 16th still take their onset cell."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from .base import Document, Source
from .locations import find_files

__all__ = ["VOICES", "read_chorale", "SOURCE"]

VOICES = ("Soprano", "Alto", "Tenor", "Bass")
STEPS_PER_QUARTER = 4  # 16th notes


def read_chorale(path: Path) -> Iterator[Document]:
    """``(stem, matrix)`` of one chorale file, nothing when it does not have the four voices."""
    try:
        from music21 import converter
    except ModuleNotFoundError:
        raise ModuleNotFoundError("reading the Bach chorales needs music21: pip install 'poskit[data]'") from None
    score = converter.parse(str(path))
    parts = {p.partName: p for p in score.parts}
    if not all(v in parts for v in VOICES):
        return
    n_steps = int(round(float(score.highestTime) * STEPS_PER_QUARTER))
    matrix = np.full((4, n_steps), -1, dtype=np.int64)
    for row, voice in enumerate(VOICES):
        for note in parts[voice].flatten().notes:
            start = int(round(float(note.offset) * STEPS_PER_QUARTER))
            end = max(start + 1, int(round(float(note.offset + note.quarterLength) * STEPS_PER_QUARTER)))
            matrix[row, start:end] = max(p.midi for p in note.pitches)
    yield path.name[: -len(".mxl")], matrix


SOURCE = Source("PyPI music21: music21/corpus/bach/*.mxl", "pitch-matrix",
                lambda: find_files("jsb", "corpus/bach/*.mxl", package="music21",
                                   install_hint="pip install 'poskit[data]' (PyPI music21)"),
                read_chorale)
