"""Where every analysis puts its result: the JSON behind the figure, then the figure, in one checked directory."""
from __future__ import annotations

from pathlib import Path

from poskit.training import atomic_write_json, check_writable_dir


def checked_out_dir(out_dir) -> Path:
    """`out_dir` as a Path, refused (naming --out) before any work when it cannot be written."""
    out_dir = Path(out_dir)
    check_writable_dir(out_dir, "out")
    return out_dir


def write_result(out_dir: Path, result: dict, json_name: str, plot, png_name: str) -> dict:
    """Write `result` as <out_dir>/<json_name> and `plot(result, <out_dir>/<png_name>)`; returns `result`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / json_name, result)
    plot(result, out_dir / png_name)
    return result
