"""The files of a run directory and how they are written: atomically (temporary file, fsync, rename)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .config import TrainConfig

CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, RESULTS_FILE = "config.json", "metrics.jsonl", "checkpoint.pt", "results.json"


def atomic_write_bytes(path: Path, write) -> None:
    """Write via `write(fileobj)` to a temporary file beside `path`, fsync, then rename over `path`:
    a kill at any moment leaves either the old file or the new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def read_metrics(run_dir) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_config(run_dir) -> TrainConfig:
    """The config saved in a run directory."""
    return TrainConfig.from_dict(json.loads((Path(run_dir) / CONFIG_FILE).read_text()))
