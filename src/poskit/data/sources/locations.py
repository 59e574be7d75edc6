"""Finding corpus files: inside an installed Python package (without importing it), under the data cache's
``fetched/<name>/files`` (``poskit data fetch``), or at a system path (an installed Debian package)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..home import fetched_dir
from .base import CorpusNotPresent

__all__ = ["package_dir", "find_files"]


def package_dir(package: str) -> Path | None:
    """The directory of an installed package, or None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_files(corpus: str, pattern: str, *, package: str | None = None, system: str | None = None,
               fetch: str | None = None, install_hint: str = "") -> list[Path]:
    """Files matching ``pattern`` (a glob) in the first place that has any: the installed ``package``'s directory,
    the ``system`` directory, then the fetched artifact ``fetch``.  None anywhere: :class:`CorpusNotPresent`."""
    roots = []
    if package is not None and (root := package_dir(package)) is not None:
        roots.append((root, pattern))
    if system is not None:
        roots.append((Path(system), pattern))
    if fetch is not None:
        roots.append((fetched_dir(fetch) / "files", pattern.rsplit("/", 1)[-1] if system is None else
                      "*/" + pattern.rsplit("/", 1)[-1]))
    for root, glob in roots:
        found = sorted(root.glob(glob)) if root.is_dir() else []
        if found:
            return found
    how = f"run `poskit data fetch {fetch}`" if fetch else install_hint
    raise CorpusNotPresent(f"corpus {corpus!r} is not present on this machine: {how}")
