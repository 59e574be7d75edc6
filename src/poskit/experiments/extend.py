"""Context extension of a trained decoder (`poskit extend`) and passkey retrieval on any decoder (`poskit passkey`).

    load_decoder(path)        a decoder from a training run, an extension run or an exported HF directory:
                              (model, task, TrainConfig view, what it is)
    extension_model(...)      the parent's model config with the encoding a spec asks for, checked against the
                              parent's weights (the same family, the same channel layout and shapes)
    extend(run, spec, ...)    the extension run (training/recipes/extend.py), every input checked first
    passkey_report(run, ...)  passkey accuracy per (length, depth) of a decoder: results.json and passkey.png

What a spec may be, for a parent trained with encoding E:
- E in the RoPE family (rope and its scalings rope-linear, rope-ntk, rope-dynamic, rope-yarn, rope-llama3,
  rope-longrope): any member of that family. The parent's rotation (base, layout, rotary_dim) carries over; a
  spec may change the base (a base change is itself a scaling: NTK-aware is one) but not the layout or the
  rotated channels, which would pair the trained q/k channels differently. A scaling's options default to
  the extension: factor = new context / the parent's original context (its original_max_positions, or its
  context / its own factor, or its context), original_max_positions = that original context, llama3's band
  1 and 4 (Llama 3.1's), longrope's factors as `poskit extrapolate` sets them (evaluate/extrapolation.py).
- any other E: E itself, its options carried over with the spec's over them (PoPE fine-tuned without scaling).
Anything else, or a spec whose model's weights have other names or shapes than the parent's, is refused
naming both encodings.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from poskit.encodings import rope_scaling
from poskit.encodings.rope_hf import encoding_name, encoding_scaling, resolve_options
from poskit.encodings.spec import EncodingSpec
from poskit.evaluate.extrapolation import parse_lengths, scaling_options
from poskit.models import ModelConfig, Transformer
from poskit.tasks import task_parameters
from poskit.training import CONFIG_FILE, TrainConfig, atomic_write_json, check_writable_dir, has_checkpoint
from poskit.training import run as run_recipe
from poskit.training.files import read_json
from poskit.training.recipes.extend import (LR_RATIO, ExtendConfig, ExtendRecipe, is_extend_run,
                                            load_trained, run_provenance)
from poskit.training.run_dir import check_apart
from poskit.training.step import build_task_for
from poskit.util.validate import check_int, check_real

#: every registered RoPE encoding: a run trained with one of them extends with any of them
ROPE_FAMILY = tuple(encoding_name(s) for s in rope_scaling.ROPE_INIT_FUNCTIONS)
#: the HF export's file that says which run and task it holds (hf/convert.py RUN_INFO_FILE)
HF_RUN_INFO = "poskit_run.json"
PASSKEY_JSON, PASSKEY_PLOT = "results.json", "passkey.png"
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class Decoder:
    """A trained decoder and what it was trained on."""

    model: Transformer
    task: object
    config: TrainConfig
    """The run's TrainConfig (an extension run's TrainConfig view; an HF export's stored config)."""
    source: str
    """"run", "extend" or "hf"."""
    path: str
    """As given."""

    @property
    def context(self) -> int:
        """The training context (tokens)."""
        return int(self.task.max_input_len)


def load_decoder(path, *, arg: str = "RUN", device: str = "cpu") -> Decoder:
    """The decoder in `path`: a `poskit train` run directory, a `poskit extend` run directory, or a directory
    written by `poskit export --hf` (its task is rebuilt from the config it stores, and its vocabulary must be
    the stored one). Anything else is refused naming `arg`."""
    given, path = str(path), Path(path)
    if not path.is_dir():
        raise ValueError(f"{arg} {given!r} is not a directory: give a run directory (poskit train, poskit extend) or "
                         "an exported Hugging Face directory (poskit export --hf)")
    if (path / HF_RUN_INFO).is_file():
        decoder = _load_hf_export(path, given, arg, device)
    elif is_extend_run(path) or ((path / CONFIG_FILE).is_file() and has_checkpoint(path)):
        model, task, cfg, extension = load_trained(path, device)
        decoder = Decoder(model, task, cfg, "run" if extension is None else "extend", given)
    else:
        raise ValueError(f"{arg} {given!r} holds no trained run (config.json and a checkpoint) and no exported "
                         f"Hugging Face model ({HF_RUN_INFO}); give a run directory or an `poskit export --hf` one")
    if not isinstance(decoder.model, Transformer) or not decoder.model.config.causal:
        raise ValueError(f"{arg} {given!r} holds a bidirectional model (causal=False, a masked-language model); "
                         "context extension and passkey retrieval need a decoder")
    return decoder


def _load_hf_export(path: Path, given: str, arg: str, device: str) -> Decoder:
    try:
        from poskit.hf.convert import to_poskit  # the hf extra, only for an exported directory
    except ImportError as e:
        raise ValueError(f"{arg} {given!r} is an exported Hugging Face directory, which needs the hf extra "
                         f"(pip install -c constraints.txt -e \".[hf]\"): {e}") from None

    info = read_json(path / HF_RUN_INFO, "an export's run record")
    try:
        cfg = TrainConfig.from_dict({**info["train_config"], "device": device})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{arg} {given!r}: {HF_RUN_INFO} holds no valid training config ({e}); it must be an export "
                         "of a `poskit train` run") from None
    model = to_poskit(path).to(device)
    task = build_task_for(cfg)
    stored = info.get("vocab", {}).get("tokens")
    if stored is not None and list(task.vocab.tokens) != list(stored):
        raise ValueError(f"{arg} {given!r} was exported with a vocabulary of {len(stored)} tokens that task "
                         f"{cfg.task!r} no longer builds ({len(task.vocab)} tokens): its corpus or tokenizer changed")
    return Decoder(model, task, cfg, "hf", given)


def provenance(decoder: Decoder) -> dict:
    """The parent record of an ExtendConfig for `decoder` (a finished run, an extension, or an HF export: its
    weights file's SHA-256 stands for the checkpoint record, and its step is not recorded)."""
    path = Path(decoder.path)
    if decoder.source == "hf":
        weights = path / "model.safetensors"
        digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None
        return {"source": "hf", "path": decoder.path, "checkpoint": weights.name, "checkpoint_sha256": digest,
                "step": None, "context": decoder.context, "config": decoder.config.to_dict(),
                "exported_from": read_json(path / HF_RUN_INFO, "an export's run record").get("run_dir")}
    return {**run_provenance(path, decoder.path), "context": decoder.context}


# -- the extended model

def _original_context(encoding, context: int) -> int:
    """The context a RoPE encoding's scaling counts from: its original_max_positions, else context / factor
    for a scaled one, else `context` itself."""
    if getattr(encoding, "original_max_positions", None):
        return int(encoding.original_max_positions)
    if getattr(encoding, "factor", None):
        return max(1, int(round(context / encoding.factor)))
    return context


def _refuse(spec: EncodingSpec, parent: Decoder, arg: str, why: str):
    raise ValueError(f"--encoding {spec.label!r} does not fit the weights of {arg} {parent.path!r}, trained with "
                     f"{parent.config.model.encoding!r}: {why}")


def extension_model(parent: Decoder, spec: EncodingSpec | str, context: int, *, arg: str = "RUN") -> ModelConfig:
    """The parent's model config with the encoding `spec` asks for at training context `context` (the rules in
    the module docstring), checked against the parent's weights."""
    spec = EncodingSpec.parse(spec, arg="--encoding") if isinstance(spec, str) else spec
    trained = parent.model.config
    old = parent.model.encoding_modules()[0]
    if trained.encoding in ROPE_FAMILY and spec.name in ROPE_FAMILY:
        if getattr(old, "axial_dims", None) is not None:
            _refuse(spec, parent, arg, "its rotation is axial (positions are coordinates), which no scaling stretches")
        scaling = encoding_scaling(spec.name)
        given = resolve_options(scaling, old.head_dim, spec.options)  # HF names as poskit's
        options = {"base": old.base, "layout": old.layout, "rotary_dim": old.rotary_dim}
        for key in ("layout", "rotary_dim"):
            if key in given and given[key] != options[key]:
                _refuse(spec, parent, arg, f"{key} {given[key]!r} would pair its q/k channels differently from the "
                                           f"{key} {options[key]!r} they were trained with")
        if scaling != "none":
            original = int(given.get("original_max_positions", _original_context(old, parent.context)))
            factor = given.get("factor", context / original)
            options.update(scaling_options(scaling, factor, original, old.rotary_dim, given.get("base", old.base)))
        options.update(given)
    elif spec.name == trained.encoding:
        options = {**trained.encoding_options, **spec.options}
    else:
        family = list(ROPE_FAMILY) if trained.encoding in ROPE_FAMILY else [trained.encoding]
        _refuse(spec, parent, arg, f"a {trained.encoding} run extends with {' or '.join(family)} (another encoding "
                                   "would meet weights trained for a different attention)")
    try:
        model = dataclasses.replace(trained, encoding=spec.name, encoding_options=options)
    except ValueError as e:
        raise ValueError(f"--encoding {spec.label!r}: {e}") from None
    with torch.device("meta"):
        new = Transformer(model).state_dict()
    weights = parent.model.state_dict()
    differ = sorted(set(new) ^ set(weights)) + sorted(k for k in set(new) & set(weights)
                                                      if new[k].shape != weights[k].shape)
    if differ:
        _refuse(spec, parent, arg, f"the model's weights differ in {differ[:4]}{' ...' if len(differ) > 4 else ''}")
    return model


# -- the extension run

def extension_config(parent: Decoder, spec: EncodingSpec | str, context: int, steps: int, *, lr: float | None = None,
                     warmup: int = 20, batch_size: int | None = None, checkpoint_every: int | None = None,
                     seed: int = 0, passkey_fraction: float = 0.0, eval_every: int | None = None,
                     eval_batches: int | None = 4, final_eval_batches: int | None = 4,
                     arg: str = "RUN") -> ExtendConfig:
    """The ExtendConfig of extending `parent` to `context` with `spec` for `steps` steps; defaults (module
    docstring of training/recipes/extend.py): lr the parent's peak lr x LR_RATIO (an extension's parent: its
    own lr), the parent's tokens per step, a checkpoint every 50 steps, no passkey windows."""
    context = check_int(context, "--context", minimum=1)
    steps = check_int(steps, "--steps", minimum=0)
    warmup = check_int(warmup, "--warmup", minimum=0)
    seed = check_int(seed, "--seed", minimum=0)
    passkey_fraction = check_real(passkey_fraction, "--passkey-fraction", minimum=0.0, maximum=1.0)
    if lr is not None:
        check_real(lr, "--lr", minimum=0.0, strict=True)
    if batch_size is not None:
        check_int(batch_size, "--batch-size", minimum=1)
    if checkpoint_every is not None:
        check_int(checkpoint_every, "--checkpoint-every", minimum=1)
    cfg = parent.config
    if "context" not in task_parameters(cfg.task):
        raise ValueError(f"{arg} {parent.path!r} was trained on task {cfg.task!r}, which has no context to extend; "
                         "extend a language model over text (shakespeare, lm-wiki, corpus, passkey, ...)")
    if context < parent.context:
        raise ValueError(f"--context must be at least the training context of {arg} {parent.path!r} "
                         f"({parent.context}: an extension lengthens it), got {context}")
    model = extension_model(parent, spec, context, arg=arg)
    options = {**cfg.task_options, "context": context}
    if passkey_fraction or "passkey_fraction" in options:
        options["passkey_fraction"] = passkey_fraction
    if lr is None:
        lr = cfg.lr if parent.source == "extend" else cfg.lr * LR_RATIO
    if batch_size is None:
        batch_size = max(1, cfg.batch_size * parent.context // context)
    every = 50 if checkpoint_every is None else checkpoint_every
    return ExtendConfig(parent=provenance(parent), task=cfg.task, task_options=options, preset=cfg.preset,
                        model=model.to_dict(), max_steps=steps, lr=float(lr), warmup_steps=warmup,
                        batch_size=batch_size, seed=seed, checkpoint_every=every,
                        eval_every=every if eval_every is None else eval_every, eval_batches=eval_batches,
                        final_eval_batches=final_eval_batches, device=cfg.device)


def extend(run, encoding: EncodingSpec | str, context: int, steps: int, out_dir, *, resume: bool = False,
           stop_after: int | None = None, quiet: bool = False, **settings) -> dict | None:
    """Extend the decoder in `run` (a finished run directory, extension run or HF export) to `context` with
    `encoding`, fine-tuning every weight for `steps` steps (0: zero-shot, the swapped model is written) in
    `out_dir`; `settings` are extension_config's. Returns the results (None when `stop_after` stopped it).
    Every input is checked before `out_dir` changes; `resume` continues an interrupted or finished extension
    (only a larger --steps may differ, and the parent must still be the one it started from)."""
    out_dir = Path(out_dir)
    check_apart(out_dir, run, "--out")
    parent = load_decoder(run)
    cfg = extension_config(parent, encoding, context, steps, **settings)
    recipe = ExtendRecipe(cfg, parent.model.state_dict())
    return run_recipe(recipe, out_dir, resume=resume, stop_after=stop_after, quiet=quiet,
                      label=f"{Path(str(run)).name}->{EncodingSpec.of(encoding).label}@{context}")


# -- passkey retrieval of any decoder

def parse_depths(text: str | list) -> list[float]:
    """"0,0.25,0.5" -> [0.0, 0.25, 0.5] (checked in [0, 1] by passkey_grid)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        depths = [float(s) for s in items if str(s).strip()]
    except ValueError:
        raise ValueError(f"--depths must be a comma-separated list of numbers in [0, 1], got {text!r}") from None
    if not depths:
        raise ValueError(f"--depths must list at least one depth in [0, 1], got {text!r}")
    return depths


def passkey_report(run, *, lengths: str | list = "1x,2x,4x,8x", depths: str | list = DEFAULT_DEPTHS, trials: int = 10,
                   seed: int = 0, out_dir=None, batch_size: int = 16) -> dict:
    """Passkey accuracy of the decoder in `run` per (length, depth) (evaluate.passkey.passkey_grid; "Nx" is N
    times the run's training context), written as results.json and the heat map passkey.png in `out_dir`
    (default RUN/passkey). Everything is checked before anything is written."""
    from poskit.evaluate.passkey import passkey_grid
    from poskit.report.passkey import plot_passkey

    out_dir = Path(run) / "passkey" if out_dir is None else Path(out_dir)
    decoder = load_decoder(run)
    windows = parse_lengths(lengths, decoder.context)
    depth_list = parse_depths(depths)
    check_int(trials, "--trials", minimum=1)
    check_int(seed, "--seed", minimum=0)
    check_writable_dir(out_dir, "--out")
    grid = passkey_grid(decoder.model, decoder.task, windows, depth_list, trials, seed, batch_size=batch_size)
    spec = EncodingSpec.from_config(decoder.config.model.encoding, decoder.config.model.encoding_options)
    from poskit.report.record import command_text

    lengths_text = lengths if isinstance(lengths, str) else ",".join(map(str, lengths))
    equivalent = ["poskit", "passkey", str(run), "--lengths", lengths_text, "--depths", ",".join(map(str, depth_list)),
                  "--trials", str(trials), "--seed", str(seed), "--out", str(out_dir)]
    result = {"command": command_text(equivalent), "run": str(run), "source": decoder.source, "encoding": spec.label,
              "context": decoder.context, **grid}
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_passkey(result, out_dir / PASSKEY_PLOT, context=decoder.context,
                 title=f"passkey retrieval: {spec.label}, trained at {decoder.context} ({trials} trials per cell)")
    atomic_write_json(out_dir / PASSKEY_JSON, result)
    return result


__all__ = ["DEFAULT_DEPTHS", "Decoder", "ROPE_FAMILY", "extend", "extension_config", "extension_model",
           "load_decoder", "parse_depths", "passkey_report", "provenance"]
