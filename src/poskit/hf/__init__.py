"""Hugging Face transformers bridge (the `poskit[hf]` extra): poskit models as `AutoModelForCausalLM`s.

    from poskit.hf import PoskitConfig, PoskitForCausalLM
    model = PoskitForCausalLM(PoskitConfig(position_encoding="pope", hidden_size=256, num_hidden_layers=4))
    model.save_pretrained("out")                                  # safetensors + config.json
    same = transformers.AutoModelForCausalLM.from_pretrained("out")
    ids = same.generate(prompt_ids, attention_mask=mask, max_new_tokens=20, num_beams=4)

Conversion: `from_poskit(transformer)` / `to_poskit(directory)` / `export_run(run_dir, directory)` (the
`poskit export RUN --hf DIR` command). See docs/hf.md. The core package never imports this module.

A saved directory also loads where nothing imported this module: its config.json's auto_map names the small
module save_pretrained writes beside it (poskit_auto.py, which imports this package), so
`AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)` works wherever poskit is installed.
transformers offers installed libraries no other hook (no entry points); trust_remote_code is its consent to
run that file, which holds no model code.
"""
from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("poskit.hf needs Hugging Face transformers, which is not installed: install the `poskit[hf]` "
                      "extra (pip install -c constraints.txt -e \".[hf]\")") from e

from .cache import PoskitCache
from .config import PoskitConfig
from .convert import export_run, from_poskit, to_poskit
from .model import PoskitForCausalLM

__all__ = ["PoskitConfig", "PoskitForCausalLM", "PoskitCache", "from_poskit", "to_poskit", "export_run"]


def _register() -> None:
    # AutoConfig / AutoModelForCausalLM find "poskit" directories once this package is imported (exist_ok: a
    # reload of this module registers the same names again)
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoConfig.register(PoskitConfig.model_type, PoskitConfig, exist_ok=True)
    AutoModelForCausalLM.register(PoskitConfig, PoskitForCausalLM, exist_ok=True)


_register()
