"""Benchmark results as committed evidence: the document a benchmark script writes with `--json` (schema
`poskit.benchmark`), read back and rendered as the tables of docs/benchmarks.md by `poskit report`.

A benchmark measures speed and memory, so unlike a results record it has no configuration to resolve again:
its provenance is what matters (the CPU model and instruction set, torch, threads, the load when it started, the
code version, the command). Each table of the document is a list of rows (column -> text, as the script
printed them) under a part name ("attention", "peers", "decode", ...), with its column order.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .record import code_info, code_label, machine_info, utc_now
from .tables import markdown_table

SCHEMA, SCHEMA_VERSION = "poskit.benchmark", 1
BENCHMARK_JSON = "benchmark.json"
_FIELDS = {"schema": str, "schema_version": int, "command": str, "code": dict, "date": str, "machine": dict,
           "settings": dict, "parts": dict}


class BenchmarkFileError(ValueError):
    """A benchmark document that cannot be read: the message names the file and what is wrong."""


def start_state() -> dict:
    """What a benchmark document records of the moment its run started: the code (a run outlives edits and
    commits made meanwhile), the date and the load average. Taken before measuring, passed to new_document."""
    return {"code": code_info(), "date": utc_now(), "load_average": os.getloadavg()[0]}


def new_document(command: str, settings: dict, parts: dict, *, threads: int, isa: str, wall_seconds: float,
                 start: dict) -> dict:
    """A benchmark document: `parts` {name: {"columns": [...], "rows": [{column: text}]}}; the machine's CPU,
    core count, torch, Python and OS come from report.record.machine_info, plus the instruction set the kernel was
    built for and the threads used; the code, date and load average are those of `start` (start_state(), taken
    when the run started)."""
    for name, part in parts.items():
        columns, rows = part.get("columns"), part.get("rows")
        if not isinstance(columns, list) or not isinstance(rows, list):
            raise ValueError(f"parts[{name!r}] must hold a list of columns and a list of rows")
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "command": command, "code": start["code"],
            "date": start["date"], "machine": {**machine_info(), "isa": isa, "threads": threads,
                                               "load_average": round(start["load_average"], 2)},
            "settings": settings, "wall_seconds": round(wall_seconds, 1), "parts": parts}


def write_document(path, document: dict) -> Path:
    from poskit.training.files import atomic_write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, document)
    return path


def read_document(path) -> dict:
    """The benchmark document at `path`, checked (BenchmarkFileError naming the file otherwise)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise BenchmarkFileError(f"{path}: not a readable benchmark document ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else doc
        raise BenchmarkFileError(f"{path}: schema must be {SCHEMA!r}, got {found!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise BenchmarkFileError(f"{path}: schema_version must be {SCHEMA_VERSION}, got {doc.get('schema_version')!r}")
    for key, kind in _FIELDS.items():
        if not isinstance(doc.get(key), kind):
            raise BenchmarkFileError(f"{path}: field {key!r} must be a {kind.__name__}, got {doc.get(key)!r}")
    return doc


def provenance(doc: dict, results_link: str) -> str:
    m = doc["machine"]
    wall = doc.get("wall_seconds")
    date = doc["date"].replace("T", " ").rstrip("Z")
    gpu = f"{m['gpu']} and " if doc["settings"].get("device") == "cuda" and m.get("gpu") else ""
    return (f"*Measured by `{doc['command']}` · poskit {code_label(doc['code'])} · {date} "
            f"UTC · {gpu}{m.get('cpu')}, {m.get('cores')} cores, instruction set {m.get('isa')}, "
            f"threads: {m.get('threads')}, torch {m.get('torch')}, load average {m.get('load_average')} at the start"
            + (f" · wall time {wall / 60:.1f} min" if isinstance(wall, (int, float)) else "")
            + f" · [results]({results_link})*")


def benchmark_table(doc: dict, part: str) -> str:
    """The markdown table of one part of a benchmark document."""
    parts = doc["parts"]
    if part not in parts:
        raise ValueError(f"part must be one of the parts the benchmark recorded, {sorted(parts)}, got {part!r}")
    columns = parts[part]["columns"]
    return markdown_table(columns, [[row.get(c, "") for c in columns] for row in parts[part]["rows"]])
