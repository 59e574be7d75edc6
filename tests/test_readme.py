"""README.md's encodings table says which CPU path each encoding takes by default: the engine's planner must agree.
(Its set-up commands are checked by tests/test_ci_run.py, its examples run by tests/test_readme_examples.py.)"""
import re
import warnings
from pathlib import Path

import pytest
import torch

import poskit
from cpu_kernel_helpers import documented_cpu_path_holds
from poskit.attention.engine import route
from poskit.encodings.base import encoding_class

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# what the exact CPU path is when the compiled kernel cannot be built here (no C++ compiler)
# the options a context extension has no default for (head_dim 32: 16 frequencies)
_EXTENSION = {"factor": 2.0, "original_max_positions": 64}
EXTENSION_OPTIONS = {"rope-linear": {"factor": 2.0}, "rope-ntk": {"factor": 2.0}, "rope-dynamic": _EXTENSION,
                     "rope-yarn": _EXTENSION,
                     "rope-llama3": dict(_EXTENSION, low_freq_factor=1.0, high_freq_factor=4.0),
                     "rope-longrope": dict(_EXTENSION, short_factor=[1.0] * 16, long_factor=[2.0] * 16)}
WITHOUT_KERNEL = {"q/k": "blocked", "bias from positions": "blocked", "bias from positions and q": "blocked-bias"}


def _table_rows():
    section = README.split("## Encodings", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            for name in re.findall(r"`([^`]+)`", cells[0]):
                yield name, cells[1], cells[4]


ROWS = list(_table_rows())


def test_the_table_lists_every_registered_encoding():
    assert {name for name, _, _ in ROWS} == set(poskit.available_encodings())


@pytest.mark.parametrize("name,enters,path", ROWS, ids=[r[0] for r in ROWS])
def test_the_cpu_path_column_is_the_planners_choice(name, enters, path):
    if path == "(embeddings)":
        assert encoding_class(name).kind == "absolute"
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an encoding in no model: UntrainedEncodingWarning is beside the point
        enc = poskit.build_encoding(name, head_dim=32, num_heads=4, **EXTENSION_OPTIONS.get(name, {}))
        chosen = route(enc, torch.randn(1, 4, 64, 32), is_causal=True)
    assert documented_cpu_path_holds(path, chosen), (path, chosen)
