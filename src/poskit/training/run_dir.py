"""Directories poskit writes (a training run, a compare or study collection, an export, an extension) are its
own: a marker file says that poskit wrote the directory and of which kind, and an exclusive lock is held by
the one process writing it.

    claim(dir, kind)    refuse unless `dir` is absent, empty, poskit's own of that kind, or (for kind "run")
                        a run written before markers existed; create it and write the marker
    check(dir, kind)    the same decision without writing anything: "new", "own" or "legacy"
    check_apart(out, run, name)
                        refuse an output that is a run directory, inside it or above it (an export there
                        would replace the run)
    locked(dir)         hold the directory's lock for a block; a second holder is refused at once naming the
                        lock and the process that holds it; a lock left by a process that died is named
    owned(dir, kind)    claim + locked: what a command wraps its whole life in

Why: without them `train --run-dir` on a project folder replaced its files, and two processes on one run
directory interleaved their checkpoints and metrics until neither could resume.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import warnings
from pathlib import Path

from ..util.file_lock import file_lock
from .files import (CHECKPOINT_FILE, CONFIG_FILE, LEGACY_CHECKPOINT_FILE, METRICS_FILE, TEMP_MARK, TEMP_PREFIX,
                    atomic_write_json, code_version)

MARKER_FILE, LOCK_FILE = ".poskit.json", ".poskit.lock"
KINDS = ("run", "compare", "study", "export", "extend")
# what a run killed before its first checkpoint leaves besides config.json (adopted like a legacy run)
_EARLY_RUN_FILES = {CONFIG_FILE, METRICS_FILE, "tensorboard"}


class RunDirError(ValueError):
    """A directory poskit will not write into, or one another process is writing."""


def _listing(directory: Path, limit: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    return ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")


def is_legacy_run(directory: Path) -> bool:
    """A run directory written before markers: its config.json and a committed checkpoint, or config.json with
    only what a run killed before its first checkpoint leaves."""
    names = {p.name for p in directory.iterdir() if not p.name.startswith(TEMP_PREFIX) or TEMP_MARK not in p.name}
    if CONFIG_FILE not in names:
        return False
    return bool({CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE} & names) or names <= _EARLY_RUN_FILES | {LOCK_FILE}


def check(directory, kind: str, legacy=None) -> str:
    """"new" (absent or empty), "own" (poskit's marker of `kind`) or "legacy" (written by poskit before markers:
    a run, or what `legacy(directory)` recognises, a command's own older layout); anything else is a
    RunDirError naming the directory and what it holds. Writes nothing."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    directory = Path(directory)
    if not directory.exists():
        return "new"
    if not directory.is_dir():
        raise RunDirError(f"{directory}: is a file, not a directory; choose a directory path")
    marker = directory / MARKER_FILE
    if marker.exists():
        found = read_marker(marker)
        if found != kind:
            raise RunDirError(f"{directory}: is a poskit directory of kind {found!r} ({MARKER_FILE}), not of kind "
                              f"{kind!r}; choose another directory")
        return "own"
    if not any(p.name != LOCK_FILE for p in directory.iterdir()):
        return "new"
    recognise = is_legacy_run if kind == "run" else legacy
    if recognise is not None and recognise(directory):
        return "legacy"
    raise RunDirError(f"{directory}: is not empty and was not written by poskit (it holds {_listing(directory)}); "
                      f"poskit writes only into an empty directory or one of its own {kind} directories")


def read_marker(marker: Path) -> str:
    """The kind a marker file records (a RunDirError naming it when it is not a marker)."""
    try:
        kind = json.loads(marker.read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None
    if kind not in KINDS:
        raise RunDirError(f"{marker}: is not a poskit directory marker (a JSON object with a kind among "
                          f"{list(KINDS)}); restore it or choose another directory")
    return kind


def claim(directory, kind: str, legacy=None) -> Path:
    """Check `directory` (as `check`), create it and write its marker when missing; returns it."""
    state = check(directory, kind, legacy)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if state != "own":
        atomic_write_json(directory / MARKER_FILE, {"written_by": "poskit", "kind": kind, "poskit_version": code_version()})
    return directory


def check_apart(out, run, name: str) -> None:
    """Refuse output directory `out` (the argument `name`) when it is `run`, inside it or above it."""
    out_path, run_path = Path(out).resolve(), Path(run).resolve()
    where = ("is" if out_path == run_path else "is inside" if run_path in out_path.parents
             else "contains" if out_path in run_path.parents else None)
    if where:
        raise RunDirError(f"{name} {str(out)!r} {where} the run directory {str(run)!r}; writing it would replace the "
                          "run: choose a directory outside it")


@contextlib.contextmanager
def locked(directory):
    """Hold `directory`'s exclusive lock (the kernel's, so a killed holder releases it) for the block. Taken
    already: a RunDirError at once naming the lock file and its holder. The lock file records the holder
    while it runs and is emptied on exit, so one found non-empty when the lock is free was left by a process
    that died; it is named in a warning and taken over. A lock file this call created is removed again when
    the block raises, so that a refused call leaves the directory as it was."""
    path = Path(directory) / LOCK_FILE
    created = not path.exists()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(file_lock(path, wait=False))
        except BlockingIOError:  # (only the acquisition: an error of the locked work is not "busy")
            raise RunDirError(f"{path}: the directory is in use by {_holder(path) or 'another process'}; wait for "
                              "it to finish or stop it (two writers would mix their files)") from None
        stale = _holder(path)
        if stale:
            warnings.warn(f"{path}: took over the lock of {stale}, which ended without releasing it", stacklevel=3)
        path.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                    "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        try:
            yield
        except BaseException:
            if created:
                path.unlink(missing_ok=True)
            raise
        finally:
            if path.exists():
                path.write_text("")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "null")
        return f"process {info['pid']} on {info['host']} (since {info['since']})" if info else ""
    except (OSError, ValueError, TypeError, KeyError):
        return ""


@contextlib.contextmanager
def owned(directory, kind: str, legacy=None):
    """Claim `directory` for `kind` and hold its lock for the block (the whole life of a command)."""
    state = check(directory, kind, legacy)  # refuse before creating anything
    Path(directory).mkdir(parents=True, exist_ok=True)
    with locked(directory):
        if state != "own":
            claim(directory, kind, legacy)  # checked again under the lock: another process may have claimed it meanwhile
        yield Path(directory)
