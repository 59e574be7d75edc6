"""A saved poskit directory loads with transformers' auto classes where poskit is installed, without the user
importing poskit.hf: config.json's auto_map names a small module written beside it (poskit_auto.py) that imports
poskit's installed classes, so `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` works in a
fresh process; without trust_remote_code transformers refuses, saying so. Saving the loaded model again writes
the same module and auto_map, never a copy of poskit's own source."""
import json
import os
import subprocess
import sys
import textwrap

import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")

from hf_helpers import hf_model  # noqa: E402
from poskit.hf.config import AUTO_MAP, AUTO_MODULE  # noqa: E402

FRESH = textwrap.dedent("""
    import json, os, sys
    import torch
    from transformers import AutoModelForCausalLM

    directory, again = sys.argv[1], sys.argv[2]
    assert not any(m == "poskit" or m.startswith("poskit.") for m in sys.modules), "poskit imported before loading"
    try:
        AutoModelForCausalLM.from_pretrained(directory)
    except ValueError as e:
        refused = str(e)
    else:
        refused = None
    assert "poskit.hf" not in sys.modules
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True).eval()
    ids = torch.load(os.path.join(directory, "ids.pt"))
    same = torch.equal(model(ids).logits, torch.load(os.path.join(directory, "logits.pt")))
    model.save_pretrained(again)
    reloaded = AutoModelForCausalLM.from_pretrained(again, trust_remote_code=True).eval()
    print()
    print("RESULT " + json.dumps({"refused": refused, "same": same, "class": [c.__module__ + "." + c.__name__
                                                                  for c in type(model).__mro__[:2]],
                      "again_same": torch.equal(reloaded(ids).logits, model(ids).logits)}))
    # (transformers' prompt for trust_remote_code goes to stdout without a newline: the marker finds the result)
""")


def test_a_saved_directory_loads_in_a_fresh_process_without_importing_poskit_hf(tmp_path):
    # one fresh process (about 20 s of imports): PoPE, whose trained phase bias and derived buffers must both load
    directory, again = tmp_path / "saved", tmp_path / "again"
    model = hf_model("pope", dtype=None)
    model.save_pretrained(directory)
    ids = torch.randint(1, 40, (2, 9))
    torch.save(ids, directory / "ids.pt")
    with torch.no_grad():
        torch.save(model(ids).logits, directory / "logits.pt")
    config = json.loads((directory / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP and (directory / f"{AUTO_MODULE}.py").is_file()

    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", FRESH, str(directory), str(again)], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.rsplit("RESULT ", 1)[1])
    assert result["same"] and result["again_same"]
    # the loaded class is poskit's own, named by the module beside config.json
    loaded, parent = result["class"]
    assert loaded.startswith("transformers_modules.") and loaded.endswith(f".{AUTO_MODULE}.PoskitForCausalLM")
    assert parent == "poskit.hf.model.PoskitForCausalLM"
    # without trust_remote_code, transformers says what to pass
    assert result["refused"] is not None and "trust_remote_code" in result["refused"]
    # the model saved again names the same module and copies none of poskit's source files
    assert sorted(p.name for p in again.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", f"{AUTO_MODULE}.py"])
    assert json.loads((again / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert (again / f"{AUTO_MODULE}.py").read_text() == (directory / f"{AUTO_MODULE}.py").read_text()


def test_with_poskit_hf_imported_no_trust_is_needed(tmp_path):
    from transformers import AutoModelForCausalLM

    from poskit.hf import PoskitForCausalLM

    hf_model("rope", dtype=None).save_pretrained(tmp_path)
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is PoskitForCausalLM
