"""How an experiment's arguments become the configs it runs: a reproduction's base config at a preset with its
steps and overrides, its variants and encoding specs, a translation reproduction's Seq2SeqConfig fields, the
demo's language-model config. The runners (reproduce.py, translation.py, demo.py) start from these, and the
results record (evidence.py) resolves a stored command with the same functions, so that a record can say what
the same command would run today; keeping them here, below both, is what keeps the two from importing each
other.
"""
from __future__ import annotations

import copy

from poskit.encodings.spec import EncodingSpec, parse_value
from poskit.training import TrainConfig

from .configs import Reproduction, TranslationReproduction, Variant
from .configs.demo import DEMO
from .configs.records import DemoSettings, derive
from .overrides import apply_overrides

__all__ = ["lm_config", "preset_config", "reproduction_config", "reproduction_specs", "select_variants",
           "translation_config", "without_run_fields"]


def select_variants(r: Reproduction, spec: str | None, name: str = "--variants") -> list[Variant]:
    """The variants to run: all of them, or those whose values `spec` lists ("1,5")."""
    if spec is None:
        return list(r.variants)
    allowed = [v.value for v in r.variants]
    if not allowed:
        raise ValueError(f"{name} applies only to reproductions with variants; this one has none")
    wanted = [parse_value(s.strip()) for s in str(spec).split(",") if s.strip()]
    if not wanted or any(w not in allowed for w in wanted):
        raise ValueError(f"{name} must be a comma-separated subset of {allowed} ({r.variant_name}), got {spec!r}")
    return [v for v in r.variants if v.value in wanted]



def preset_config(r: Reproduction, preset: str | None) -> dict:
    """The base config of reproduction `r` at `preset`: "default" (or None) its CPU-scale config; "paper" that
    config with the reproduction's `paper_preset` changes and the task's paper preset (config "preset")."""
    if preset not in (None, "default", "paper"):
        raise ValueError(f"preset must be one of ['default', 'paper'], got {preset!r}")
    if preset == "paper" and r.no_paper_preset:
        raise ValueError(f"--preset paper is not available here: {r.no_paper_preset}")
    cfg = copy.deepcopy(r.config)
    if preset == "paper":
        from poskit.tasks import _lookup

        cfg["preset"] = "paper"
        # the CPU config's own task options (e.g. context 256) would override the task's paper sizes (explicit
        # options win in build_task): drop those the task's paper preset sets, so that its values apply
        paper_task = getattr(_lookup(cfg["task"]), "paper_params", {})
        cfg["task_options"] = {k: v for k, v in cfg.get("task_options", {}).items() if k not in paper_task}
        for dotted, value in r.paper_preset.items():
            node, *path = [cfg, *dotted.split(".")]
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = copy.deepcopy(value)
    return cfg


def reproduction_config(r: Reproduction, preset: str | None, steps: int | None, overrides: list[str] | None) -> dict:
    """The base config a reproduction's runs start from: the preset's, with `steps` and the key=value
    `overrides` applied (the encoding and seed are set per run)."""
    cfg = preset_config(r, preset)
    if steps is not None:
        cfg["max_steps"] = steps
    apply_overrides(cfg, overrides or [])
    return cfg


def reproduction_specs(r: Reproduction, encodings) -> list[EncodingSpec]:
    """The encoding specs a reproduction runs: `encodings` (specs or their text), else its own."""
    return [EncodingSpec.of(e) for e in encodings] if encodings is not None else EncodingSpec.parse_list(r.encodings)


def translation_config(r: TranslationReproduction, name: str, preset: str, steps: int | None,
                       overrides: list[str] | None) -> dict:
    """The Seq2SeqConfig fields every run of the reproduction starts from (the encoding and seed are set per
    run): the preset's changes, `steps` and the key=value `overrides` applied."""
    if preset not in r.presets:
        raise ValueError(f"preset must be one of {sorted(r.presets)} for {name}, got {preset!r}")
    base = derive(r.config, r.presets[preset])
    if steps is not None:
        base["max_steps"] = steps
    apply_overrides(base, list(overrides or []))
    return base


def lm_config(encoding: EncodingSpec | str, context: int, train_seconds: float, seed: int,
              settings: DemoSettings = DEMO) -> TrainConfig:
    cfg = copy.deepcopy(settings.language_model)
    cfg["task_options"] = {"context": context}
    cfg["model"]["encoding"], cfg["model"]["encoding_options"] = EncodingSpec.of(encoding).to_config()
    # no periodic evaluation or checkpoints inside the budget; the final split evaluation is kept short
    # because the extrapolation sweep that follows evaluates the test text at every length anyway
    cfg.update(train_seconds=train_seconds, seed=seed, eval_every=10**9, checkpoint_every=10**9, final_eval_batches=4)
    return TrainConfig.from_dict(cfg)


def without_run_fields(config: dict) -> dict:
    """A training config without what is set per run (the encoding and the seed): the base of a comparison."""
    out = copy.deepcopy(config)
    out.pop("seed", None)
    model = out.get("model")
    if isinstance(model, dict):
        model.pop("encoding", None)
        model.pop("encoding_options", None)
    return out
