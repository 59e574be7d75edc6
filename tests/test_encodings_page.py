"""docs/encodings.md lists every registered encoding, with the kind and the CPU path it really has, and names test
files that exist: the page cannot silently fall behind the registry or the engine."""
import re
from pathlib import Path

import pytest
import torch

import poskit
from conftest import build
from cpu_kernel_helpers import documented_cpu_path_holds
from poskit.attention.engine import route

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "encodings.md"


def table_rows() -> dict[str, list[str]]:
    """name -> the row's cells (name, paper, kind, CPU path, reference, peer), for each name in the first cell."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 6:
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells
    return rows


def test_every_registered_encoding_has_one_row_and_every_row_is_registered():
    assert sorted(table_rows()) == sorted(poskit.available_encodings())


@pytest.mark.parametrize("name", poskit.available_encodings())
def test_the_row_gives_the_encodings_kind_and_its_cpu_path(name):
    _, paper, kind, path, _, _ = table_rows()[name]
    assert len(paper) > 20
    enc = build(name, dtype=torch.float32)
    assert kind.split()[0] == enc.kind
    if enc.kind == "absolute":  # attention refuses them: no path
        assert path == "-"
        return
    q = torch.randn(1, 4, 64, 16)
    assert documented_cpu_path_holds(path, route(enc, q, is_causal=True))


def test_the_test_files_it_names_exist():
    named = set(re.findall(r"test_\w+\.py", PAGE.read_text()))
    assert named and all((ROOT / "tests" / f).exists() for f in named), sorted(
        f for f in named if not (ROOT / "tests" / f).exists())
