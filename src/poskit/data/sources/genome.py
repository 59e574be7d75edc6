"""Bacterial genomes of Debian ``ragout-examples`` (``/usr/share/doc/ragout/examples/*/references/*.fasta.gz``,
or ``poskit data fetch genome``).  One genome file is one document (``<example>/<strain>``); its FASTA records
(chromosome, plasmids) are joined with a single ``N`` so no 6-mer spans two records."""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Iterator

from .base import Document, Source
from .locations import find_files

__all__ = ["read_fasta", "SOURCE"]

SYSTEM = "/usr/share/doc/ragout/examples"


def read_fasta(path: Path) -> Iterator[Document]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        records, current = [], []
        for line in f:
            if line.startswith(b">"):
                if current:
                    records.append(b"".join(current))
                current = []
            else:
                current.append(line.strip())
        if current:
            records.append(b"".join(current))
    if not records:
        raise ValueError("no FASTA sequence")
    name = path.name.split(".fasta")[0]
    yield f"{path.parent.parent.name if path.parent.name == 'references' else path.parent.name}/{name}", \
        b"N".join(records)


SOURCE = Source("Debian ragout-examples: examples/*/references/*.fasta.gz", "dna",
                lambda: find_files("genome", "*/references/*.fasta.gz", system=SYSTEM, fetch="genome"), read_fasta)
