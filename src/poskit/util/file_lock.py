"""One exclusive inter-process lock on a file, for the places where two processes must not do one job at once
(building a corpus cache, running a study directory, training one run of a study).

The lock is the kernel's (fcntl.flock), so it is released when its holder exits or is killed: a crash never
leaves a stale lock behind. On a platform without fcntl there is no lock, and avoiding concurrent holders is
the caller's to ensure.
"""
from __future__ import annotations

import contextlib
from pathlib import Path


@contextlib.contextmanager
def file_lock(lock_path, *, wait: bool = True):
    """Hold an exclusive lock on `lock_path` (created if missing) for the block. wait=False: raise
    BlockingIOError at once when another process holds it, instead of waiting for it."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(Path(lock_path), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
