"""``hf:<dataset>``: a Hugging Face dataset, read with the ``datasets`` package (optional extra).  A local
directory written by ``Dataset.save_to_disk`` is read with ``load_from_disk`` (no network); any other name with
``load_dataset`` (the user's network and Hugging Face cache).  Every row's ``text`` column is a document keyed
by ``<split>/<row>``; the rows of every split are pooled and re-split by poskit's document hash."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from .base import CorpusNotPresent, Document, Source

__all__ = ["PREFIX", "hf_source"]

PREFIX = "hf:"
TEXT_FIELD = "text"


def _load(name: str):
    try:
        import datasets
    except ModuleNotFoundError:
        raise CorpusNotPresent(f"corpus {PREFIX}{name!r} needs the datasets package: pip install 'poskit[data]'") \
            from None
    if Path(name).is_dir():
        return datasets.load_from_disk(name)
    return datasets.load_dataset(name)


def hf_source(corpus: str) -> Source:
    name = corpus[len(PREFIX):]
    if not name:
        raise ValueError(f"an hf corpus is 'hf:<dataset name or saved directory>', got {corpus!r}")

    def locate() -> list[Path]:
        local = Path(name)
        if not local.is_dir() and (local.exists() or name.startswith(("/", "."))):
            raise CorpusNotPresent(f"corpus {corpus!r} is not present: {name} is not a saved dataset directory")
        return [local]  # one "file": the saved directory, or a hub name read through load_dataset

    def read_all(_path: Path) -> Iterator[Document]:
        data = _load(name)
        splits = data.items() if hasattr(data, "keys") else [("train", data)]
        for split, rows in splits:
            if TEXT_FIELD not in rows.column_names:
                raise ValueError(f"dataset {name!r} split {split!r} has no {TEXT_FIELD!r} column "
                                 f"(columns: {rows.column_names})")
            for i, text in enumerate(rows[TEXT_FIELD]):
                yield f"{split}/{i}", text

    return Source(f"Hugging Face datasets: {name}", "text", locate, read_all)
