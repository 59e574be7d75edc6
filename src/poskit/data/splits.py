"""Deterministic train/validation/test splits by whole document, decided by a hash of each document's id.

Documents are ordered by ``sha256(salt + id)``; the first ``round(test * n)`` go to test, the next
``round(validation * n)`` to validation, the rest to train.  A split with a positive fraction gets at least one
document (a corpus of 10 performances still has a test performance).  The result depends only on the set of ids,
never on the order they were read in, so it is the same on every machine.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

__all__ = ["SPLITS", "assign_splits"]

SPLITS = ("train", "validation", "test")


def _rank(doc_id: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}\0{doc_id}".encode()).hexdigest()


def assign_splits(doc_ids: Iterable[str], fractions: tuple[float, float, float], salt: str = "poskit") -> dict[str, str]:
    """``{doc_id: split}`` for ``fractions = (train, validation, test)`` summing to 1."""
    ids = list(doc_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("document ids must be unique to split by document")
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers (train, validation, test) summing to 1, "
                         f"got {fractions!r}")
    held = [max(1, round(f * len(ids))) if f > 0 else 0 for f in fractions[1:]]
    if sum(held) >= len(ids):
        raise ValueError(f"{len(ids)} documents cannot be split {fractions!r} with at least one training document")
    order = sorted(ids, key=lambda d: _rank(d, salt))
    n_test, n_val = held[1], held[0]
    out = {d: "test" for d in order[:n_test]}
    out.update({d: "validation" for d in order[n_test:n_test + n_val]})
    out.update({d: "train" for d in order[n_test + n_val:]})
    return out
