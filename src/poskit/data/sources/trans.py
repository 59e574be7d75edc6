"""German-English sentence pairs from the example sentences of the TU Chemnitz dictionary, as Debian's
``trans-de-en`` ships it (``/usr/share/trans/de-en``, or ``poskit data fetch translation``).

Each dictionary line is ``German :: English``; both sides list sub-entries separated by `` | `` in the same
order (a headword, its plural, example sentences), and a sub-entry may give alternatives separated by ``; ``.
A pair is kept when the two sides have as many sub-entries, and the i-th sub-entry on both sides, reduced
to its first alternative and stripped of the dictionary's annotations (``{f}``, ``[Br.]``, ``<...>``), is a
sentence: at least 4 words, ending in ``.``, ``?`` or ``!``. About 18.6k pairs; each German sentence is kept
once (its first pair in file order), so that no source sentence is in two splits.
"""
from __future__ import annotations

import re
from pathlib import Path

from .locations import find_files

__all__ = ["EXTRACTION_RULE", "SYSTEM", "locate", "read_pairs", "sentence_pairs"]

SYSTEM = "/usr/share/trans"
# bump when the rule below changes: the cache manifests record it, so a changed rule rebuilds the caches
EXTRACTION_RULE = "trans-de-en sub-entries, first alternative, annotations removed, >= 4 words, ends .?!; v1"

_ALTERNATIVE = re.compile(r"(?<=[.?!]);\s+")  # "; " after a sentence's end starts an alternative sentence
_ANNOTATION = re.compile(r"\s*(\[[^\]]*\]|\{[^}]*\}|<[^>]*>)")
_MIN_WORDS = 4


def _clean(text: str) -> str:
    text = _ALTERNATIVE.split(text)[0]
    return " ".join(_ANNOTATION.sub("", text).split())


def _is_sentence(text: str) -> bool:
    return len(text.split()) >= _MIN_WORDS and text[-1:] in ".?!"


def sentence_pairs(lines) -> list[tuple[str, str]]:
    """(German, English) sentence pairs from dictionary lines, in file order, each German sentence once."""
    pairs, seen = [], set()
    for line in lines:
        if line.startswith("#") or " :: " not in line:
            continue
        de, en = line.rstrip("\n").split(" :: ", 1)
        de_parts, en_parts = de.split(" | "), en.split(" | ")
        if len(de_parts) != len(en_parts):
            continue  # sub-entries cannot be aligned
        for d, e in zip(de_parts, en_parts):
            d, e = _clean(d), _clean(e)
            if _is_sentence(d) and _is_sentence(e) and d not in seen:
                seen.add(d)
                pairs.append((d, e))
    return pairs


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """The sentence pairs of one dictionary file; any error reading it names the file."""
    try:
        with open(path, encoding="utf-8") as f:
            pairs = sentence_pairs(f)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the translation corpus file {path}: {type(e).__name__}: {e}") from None
    if not pairs:
        raise ValueError(f"the translation corpus file {path} holds no 'German :: English' sentence pair")
    return pairs


def locate() -> Path:
    """The dictionary file: the installed Debian package's, else the fetched one (CorpusNotPresent: neither)."""
    return find_files("translation", "de-en", system=SYSTEM, fetch="translation")[0]
