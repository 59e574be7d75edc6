"""Durable file writes shared by every piece of state poskit keeps on disk (run directories, token caches):
a file is written in full and fsynced under a temporary name, renamed over its target, and the directory
entry is fsynced, so a kill at any moment leaves the old file or the new one, never a torn one."""
from __future__ import annotations

import os
from pathlib import Path


def write_synced(path: Path, write) -> None:
    """Create `path`, fill it through `write(fileobj)`, and fsync it before returning."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename in directory `path` durable (the rename itself lives in the directory entry)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
