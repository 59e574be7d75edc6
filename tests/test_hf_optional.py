"""The core never imports transformers; without it, `import poskit.hf` says which extra to install."""
import subprocess
import sys

import pytest
import torch


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_core_and_cli_do_not_import_transformers():
    r = _run("import sys, poskit, poskit.cli, poskit.models, poskit.training\n"
             "poskit.cli.build_parser()\n"
             "assert 'transformers' not in sys.modules, 'transformers was imported'\n")
    assert r.returncode == 0, r.stderr


def test_poskit_hf_without_transformers_names_the_extra():
    # sys.modules[name] = None makes `import name` raise ImportError, as if it were not installed
    r = _run("import sys\nsys.modules['transformers'] = None\nimport poskit.hf\n")
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "poskit[hf]" in r.stderr


@pytest.mark.slow  # a fresh interpreter importing the CLI: several seconds on a busy machine
def test_export_without_transformers_is_one_line_naming_the_extra(tmp_path):
    r = _run("import sys\nsys.modules['transformers'] = None\nfrom poskit.cli import main\n"
             f"main(['export', {str(tmp_path)!r}, '--hf', {str(tmp_path / 'out')!r}])\n")
    assert r.returncode == 2 and "poskit[hf]" in r.stderr and "Traceback" not in r.stderr


def test_select_batch_refuses_rows_outside_the_batch_and_changes_nothing():
    from poskit.attention.kv_cache import LayerCache

    layer = LayerCache()
    keys = torch.randn(2, 1, 3, 4)
    layer.append(keys, keys, torch.arange(3))
    with pytest.raises(ValueError, match=r"index must hold batch rows in \[0, 1\]"):
        layer.select_batch(torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="index must be a 1-D integer tensor"):
        layer.select_batch(torch.tensor([[0]]))
    assert torch.equal(layer.keys, keys)
    layer.select_batch(torch.tensor([1, 0, 1]))
    assert torch.equal(layer.keys, keys[[1, 0, 1]]) and layer.positions.shape == (1, 3)  # shared positions stay shared
