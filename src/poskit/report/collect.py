"""`poskit report collect OUT_DIR [--name NAME]`: commit an experiment's evidence, its results record and its
PNG plots (never a checkpoint or a run directory), as docs/results/NAME/, where `poskit report` finds it."""
from __future__ import annotations

import shutil
from pathlib import Path

from .markers import RESULTS_DIR
from .record import RESULTS_JSON, ResultsRecord, absolute_paths, read_record

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def default_name(record: ResultsRecord) -> str:
    """The docs/results name of a record: a reproduction or demo by its name, the others prefixed by their
    kind (a study may share its name with a reproduction): study-indirect-indexing, analyze-decay,
    compare-<task>."""
    prefix = {"study": "study-", "analysis": "analyze-", "compare": "compare-"}.get(record.kind, "")
    return prefix + record.name


def _is_run_dir(path: Path) -> bool:
    return (path / "config.json").exists() or (path / "checkpoints").exists()


def plots(out_dir: Path) -> list[Path]:
    """The PNGs of an output directory, outside its run directories (relative paths)."""
    found = []
    for png in sorted(out_dir.rglob("*.png")):
        rel = png.relative_to(out_dir)
        parents = [out_dir.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts))]
        if not any(_is_run_dir(p) for p in parents):
            found.append(rel)
    return found


def collect(out_dir, root=".", name: str | None = None) -> tuple[Path, list[Path]]:
    """Copy <out_dir>/results.json and its plots to <root>/docs/results/<name>/ (name: `default_name`),
    replacing what an earlier collect put there (its results.json and PNGs; other files are left). Everything
    is checked before anything is written. Returns the directory and the files written."""
    out_dir = Path(out_dir)
    source = out_dir / RESULTS_JSON
    if not out_dir.is_dir():
        raise ValueError(f"OUT_DIR {str(out_dir)!r} must be an experiment's output directory (holding {RESULTS_JSON})")
    record = read_record(source)  # a results file of another schema is refused, naming it
    leaks = absolute_paths(record.to_dict())
    if leaks:
        raise ValueError(f"{source}: holds machine paths ({leaks[0]}); a committed results file must not")
    name = name if name is not None else default_name(record)
    if not name or set(name) - _NAME_CHARS or name.startswith("."):
        raise ValueError(f"--name must be letters, digits, '.', '_' or '-' (a directory of docs/results), got {name!r}")
    root = Path(root)
    if not (root / "docs").is_dir():
        raise ValueError(f"--root {str(root)!r} must be the repository root (a directory holding docs/)")
    dest = root / RESULTS_DIR / name
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest}: is a file, not a results directory")
    pngs = plots(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    for old in [dest / RESULTS_JSON, *dest.rglob("*.png")]:
        old.unlink(missing_ok=True)
    written = []
    for rel in pngs:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out_dir / rel, dest / rel)
        written.append(dest / rel)
    shutil.copyfile(source, dest / RESULTS_JSON)  # byte for byte the file the experiment wrote (checked above)
    written.append(dest / RESULTS_JSON)
    return dest, written
