"""The files of a run directory: how they are written (atomically: temporary file, fsync, rename, fsync of
the directory) and how they are read back (checked: any unreadable, truncated or malformed file is a
`RunFileError` naming the file and what is wrong, whatever the underlying exception)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from ..util.durable import fsync_dir, write_synced
from ..util.version import __version__
from .config import TrainConfig

CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, RESULTS_FILE = "config.json", "metrics.jsonl", "checkpoint.json", "results.json"
# the single-file checkpoint of runs written before checkpoint.json (still read and resumed: checkpoint_store.py)
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"
# temporary files of atomic writes: ".<name>.tmp<pid>"; one left behind by a killed writer is never read
TEMP_PREFIX, TEMP_MARK = ".", ".tmp"

# Test hook (tests/test_kill_resume.py): "<file name>:<n>" makes this process SIGKILL itself on its n-th
# atomic write of that file, after the temporary file is complete and before the rename, the one moment a
# kill test cannot hit reliably from outside. Unset in normal use.
KILL_BEFORE_RENAME_ENV = "POSKIT_TEST_KILL_BEFORE_RENAME"
_writes: dict[str, int] = {}


class RunFileError(ValueError):
    """A file of a run directory that cannot be used: the message starts with the file's path."""

    def __init__(self, path, problem: str):
        self.path = Path(path)
        super().__init__(f"{self.path}: {problem}")


def does_not_fit(path, error: Exception, what: str = "the run's model and optimizer") -> RunFileError:
    """A checkpoint `path` whose state failed to load (`error`) into `what`: a RunFileError naming it."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return RunFileError(path, f"does not fit {what} ({reason})")


def code_version() -> str:
    """poskit's version, recorded in run directories, checkpoints and results."""
    return __version__


def _kill_before_rename_requested(path: Path) -> bool:
    spec = os.environ.get(KILL_BEFORE_RENAME_ENV)
    if not spec:
        return False
    name, _, nth = spec.rpartition(":")
    if name != path.name:
        return False
    _writes[name] = _writes.get(name, 0) + 1
    return _writes[name] == int(nth)


def atomic_write_bytes(path: Path, write) -> None:
    """Write via `write(fileobj)` to a temporary file beside `path`, fsync, rename over `path`, fsync the
    directory: a kill at any moment leaves either the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}{TEMP_MARK}{os.getpid()}")
    write_synced(tmp, write)
    if _kill_before_rename_requested(path):
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def remove_stale_temp_files(run_dir) -> list[Path]:
    """Delete the temporary files killed atomic writes left in `run_dir` (they were never renamed into place,
    so no reader depends on them); returns what was deleted."""
    run_dir = Path(run_dir)
    names = (CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, RESULTS_FILE)
    stale = [p for p in run_dir.iterdir()
             if any(p.name.startswith(f"{TEMP_PREFIX}{n}{TEMP_MARK}") for n in names)] if run_dir.is_dir() else []
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def read_bytes(path) -> bytes:
    """The bytes of `path`; a missing or unreadable file is a RunFileError naming it."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise RunFileError(path, "missing") from None
    except OSError as e:
        raise RunFileError(path, f"cannot be read ({e.strerror or e})") from None


def read_json(path, what: str = "a JSON object"):
    """The JSON object in `path` (a RunFileError naming the file when it is not one)."""
    data = read_bytes(path)
    if data and not data.strip(b"\x00"):
        raise RunFileError(path, f"holds only zero bytes ({len(data)}), not {what} (a write was cut short)")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise RunFileError(path, f"is not UTF-8 text, so not {what}") from None
    except json.JSONDecodeError as e:
        problem = "is empty" if not data.strip() else f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        raise RunFileError(path, f"{problem}; it should hold {what}") from None
    if not isinstance(obj, dict):
        raise RunFileError(path, f"holds a JSON {type(obj).__name__}, not {what}")
    return obj


def parse_metrics(path, data: bytes) -> list[dict]:
    """The records of metrics.jsonl bytes `data` (of file `path`), each line checked."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RunFileError(path, "is not UTF-8 text (one JSON object per line expected)") from None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunFileError(path, f"line {number} is not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise RunFileError(path, f"line {number} is not a metrics record (a JSON object with an integer step)")
        records.append(record)
    return records


def read_metrics(run_dir) -> list[dict]:
    """The records of a run's metrics.jsonl ([] when there is none yet)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return parse_metrics(path, read_bytes(path))


def load_config(run_dir) -> TrainConfig:
    """The config saved in a run directory (a RunFileError naming config.json when it is not a valid one)."""
    path = Path(run_dir) / CONFIG_FILE
    try:
        return TrainConfig.from_dict(read_json(path, "a TrainConfig"))
    except RunFileError:
        raise
    except (ValueError, TypeError) as e:
        raise RunFileError(path, f"is not a valid TrainConfig: {e}") from None


def check_writable_dir(path, name: str = "out") -> None:
    """Refuse, before any work, an output directory that cannot be created or written: `path` itself or its
    nearest existing ancestor must be a writable directory. Creates nothing."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        where = "is" if probe == path else f"is under {str(probe)!r}, which is"
        raise ValueError(f"{name} {str(path)!r} {where} not a directory; choose a directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == path else f" (its nearest existing parent {str(probe)!r} is not)"
        raise ValueError(f"{name} {str(path)!r} is not writable{where}; choose a directory you can write to")


# what a run's results must agree on with its config.json and its checkpoint
IDENTITY = ("task", "encoding", "seed", "poskit_version")


def config_identity(config: dict) -> dict:
    """task, encoding and seed of a run's config.json (every recipe's config keeps the encoding in `model`)."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    return {"task": config.get("task"), "encoding": model.get("encoding"), "seed": config.get("seed")}


def read_results(path, what: str = "a run's results") -> dict:
    """The results file `path` of a run directory, checked: a JSON object holding its run's encoding and seed,
    whose task, encoding, seed and poskit_version agree with the config.json and checkpoint.json beside it (a
    results file copied from another run is refused). Every reader of a run's results reads them here; any
    problem is one RunFileError naming the file."""
    path = Path(path)
    results = read_json(path, what)
    missing = [k for k in ("encoding", "seed") if k not in results]
    if missing:
        raise RunFileError(path, f"lacks {missing}: not {what} written by poskit")
    beside = {CONFIG_FILE: lambda d: config_identity(d), CHECKPOINT_FILE: lambda d: d.get("run") or {}}
    for name, identity_of in beside.items():
        if (path.parent / name).exists():
            expected = identity_of(read_json(path.parent / name, f"the {name} of {what}"))
            for key in IDENTITY:
                if expected.get(key) is not None and key in results and results[key] != expected[key]:
                    raise RunFileError(path, f"{key} is {results[key]!r}, but {name} beside it says "
                                             f"{expected[key]!r}: these results belong to another run")
    return results
