"""The context-extension recipe: a finished decoder run's weights under another encoding (a RoPE scaling, plain
RoPE, or the run's own encoding), every weight fine-tuned at a longer context (`poskit extend`), as Position
Interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023) extend LLaMA (paper 001 describes the scalings).

The schedule is theirs, scaled to a small model (`ExtendConfig`'s defaults): AdamW (0.9, 0.95), no weight decay,
a linear warm-up over 20 steps from 10 % of the learning rate, then a constant learning rate, gradients clipped
at norm 1. The default learning rate is the papers' ratio to the pre-training peak, not a measurement here:
PI fine-tunes LLaMA 7B/13B at 2e-5 after pre-training at 3e-4 and 33B/65B at 1e-5 after 1.5e-4, YaRN fine-tunes
Llama 2 7B/13B at 2e-5 after 3e-4, all 1/15 of it (`LR_RATIO`; experiments/extend.py applies it to the parent's
lr). Tokens per step default to the parent's (batch_size x context): LLaMA pre-trained on 4M-token batches, and
YaRN fine-tunes on 64 x 64k = 4M tokens per step.

A run with max_steps 0 trains nothing: it writes the swapped model as its checkpoint (every method is evaluated
at step 0 too, zero-shot), and a resume with more steps continues from it exactly as an uninterrupted run would.
Since the learning rate is constant after the warm-up, extending a finished run to more steps (a resume with a
larger max_steps) gives the numbers of a run planned that long from the start.

The run directory is a training run directory (training/__init__.py) whose config.json is an `ExtendConfig`:
the parent's provenance (where its weights came from: the path as given, the checkpoint's directory and the
SHA-256 of its checkpoint.json, its step, its config), the task at the new context and the model with the new
encoding. `load_extend_run` gives (model, task, config) back; `ExtendConfig.train_config()` is the TrainConfig
view that readers of a run's task and model use (its schedule fields are not what trained it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from poskit.util.config_check import ConfigError, check_field_types

from ..checkpoint import checkpoint_config, read_checkpoint
from ..checkpoint_store import CHECKPOINTS_DIR, checkpoint_path, has_checkpoint
from ..config import TrainConfig
from ..distributed import check_batch_split, from_main
from ..files import (CHECKPOINT_FILE, CONFIG_FILE, LEGACY_CHECKPOINT_FILE, RESULTS_FILE, RunFileError,
                     does_not_fit, read_bytes, read_json, read_metrics, read_results)
from ..rng import seed_everything
from ..step import build_model, build_task_for, evaluate
from .base import Loop, Recipe, config_dict
from .lm import LMSteps

#: the default learning rate is the parent's peak lr times this (PI and YaRN: 2e-5 after 3e-4, 1e-5 after 1.5e-4)
LR_RATIO = 1 / 15
#: what the parent record of an ExtendConfig must hold
PARENT_KEYS = ("source", "path", "checkpoint", "checkpoint_sha256", "step", "context", "config")
PARENT_SOURCES = ("run", "extend", "hf")


@config_dict
@dataclass
class ExtendConfig:
    """One extension: the parent it starts from, the task and model it trains, and the fine-tuning schedule."""

    parent: dict
    """Provenance: {"source": "run" | "extend" | "hf", "path": the parent as given, "checkpoint": its checkpoint
    directory (relative to the parent) or weights file, "checkpoint_sha256": SHA-256 of its checkpoint.json (or
    of the weights file of an HF export), "step": the parent's step (None for an HF export, which does not record
    it), "context": its training context, "config": its config.json}."""
    task: str
    """The parent's task."""
    task_options: dict
    """The parent's task options with the new context (and, by default, no passkey windows: the papers
    fine-tune on plain text)."""
    model: dict
    """ModelConfig fields: the parent's model with the new encoding and its options (vocab_size resolved)."""
    preset: str = "default"
    max_steps: int = 0
    """Fine-tuning steps; 0: zero-shot (the swapped model is written as the run's checkpoint)."""
    lr: float = 1.3e-4
    """The constant learning rate after the warm-up (the CLI's default: the parent's peak lr x LR_RATIO)."""
    warmup_steps: int = 20
    """Linear warm-up steps (PI's and YaRN's 20); 0: the full lr from the first step."""
    warmup_start: float = 0.1
    """The warm-up starts at this fraction of lr (PI: 10 %)."""
    beta1: float = 0.9
    beta2: float = 0.95
    """AdamW's betas (PI: 0.9, 0.95)."""
    weight_decay: float = 0.0
    """PI and YaRN fine-tune without weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    batch_size: int = 32
    """Windows of the new context per step (the CLI's default keeps the parent's tokens per step)."""
    seed: int = 0
    """Seeds the data stream and dropout (the weights are the parent's)."""
    log_every: int = 5
    eval_every: int = 50
    """Validation loss at the new context every this many steps (and at the end)."""
    eval_batches: int | None = 4
    final_eval_batches: int | None = 4
    checkpoint_every: int = 50
    device: str = "cpu"

    def __post_init__(self):
        check_field_types(self)
        missing = [k for k in PARENT_KEYS if k not in self.parent]
        if missing:
            raise ConfigError("parent", f"a provenance record with {list(PARENT_KEYS)} (missing {missing})",
                              self.parent)
        if self.parent["source"] not in PARENT_SOURCES:
            raise ConfigError("parent.source", f"one of {list(PARENT_SOURCES)}", self.parent["source"])
        if self.max_steps < 0:
            raise ConfigError("max_steps", "a non-negative int (0: zero-shot)", self.max_steps)
        if not 0 < self.warmup_start <= 1:
            raise ConfigError("warmup_start", "in (0, 1]", self.warmup_start)
        self.train_config()  # the task, model and optimizer fields, checked as a training run checks them

    def train_config(self) -> TrainConfig:
        """The TrainConfig view of this run: its task at the new context and its model, as every reader of a
        run's task and model takes them (its max_steps is at least 1 and its schedule is not the one that
        trained the run: lr_at below is)."""
        return TrainConfig(
            task=self.task, task_options=dict(self.task_options), preset=self.preset, model=dict(self.model),
            seed=self.seed, batch_size=self.batch_size, max_steps=max(1, self.max_steps), lr=self.lr,
            min_lr=self.lr, warmup_steps=self.warmup_steps, weight_decay=self.weight_decay, beta1=self.beta1,
            beta2=self.beta2, grad_clip=self.grad_clip, eval_every=self.eval_every, eval_batches=self.eval_batches,
            final_eval_batches=self.final_eval_batches, log_every=self.log_every,
            checkpoint_every=self.checkpoint_every, device=self.device)

    @property
    def context(self) -> int:
        return int(self.task_options["context"])


def lr_at(step: int, cfg: ExtendConfig) -> float:
    """Linear warm-up from warmup_start x lr (step 0) to lr (step warmup_steps), then lr (PI, YaRN)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (cfg.warmup_start + (1 - cfg.warmup_start) * step / cfg.warmup_steps)
    return cfg.lr


class ExtendRecipe(LMSteps, Recipe):
    """`parent_weights`: the parent model's state dict, loaded into the model with the new encoding (a resumed
    run then replaces them with its checkpoint's); None only where a checkpoint supplies the weights."""

    config_type = ExtendConfig
    writer = "poskit extend"
    kind = "extend"  # the run directory's kind (training/run_dir.py)
    state_entries = {"elapsed": (int, float), "loss_acc": (list, tuple), "data_generator": torch.Tensor,
                     "config": dict}

    def __init__(self, config: ExtendConfig | None, parent_weights: dict | None = None):
        super().__init__(config)
        self.parent_weights = parent_weights

    @property
    def device(self) -> str:
        return self.config.device if self.config is not None else "cpu"

    def loop(self) -> Loop:
        c = self.config
        return Loop(c.max_steps, c.seed, c.log_every, c.eval_every, c.checkpoint_every, c.grad_clip)

    def identity(self) -> dict:
        return {"task": self.config.task, "encoding": self.config.model["encoding"], "seed": self.config.seed}

    def launch(self, procs) -> None:
        cfg = self.config
        if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", '"cpu" (CUDA is not available on this machine)', cfg.device)
        check_batch_split(cfg.batch_size, procs)

    def build_model(self):
        """The task at the new context, the model with the new encoding holding the parent's weights, and the
        data stream, seeded from the config."""
        cfg = self.config
        self.train_cfg = cfg.train_config()
        self.task = build_task_for(self.train_cfg)
        seed_everything(cfg.seed)
        model = build_model(self.train_cfg, self.task)
        if self.parent_weights is None:
            raise ValueError("parent_weights are needed to start an extension (a resumed one loads its checkpoint "
                             "over them)")
        try:
            model.load_state_dict(self.parent_weights)
        except RuntimeError as e:
            raise ValueError(f"the weights of parent {cfg.parent['path']!r} do not fit the model with encoding "
                             f"{cfg.model['encoding']!r}: {str(e).splitlines()[0][:300]}") from None
        self.data_gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)
        return model

    @property
    def train_config(self) -> TrainConfig:
        return self.train_cfg

    def lr_at(self, step: int) -> float:
        return lr_at(step, self.config)

    def _evaluate(self, trainer, split: str, max_batches: int | None):
        return trainer.on_main(lambda: evaluate(trainer.model, self.task, split, max_batches))

    def evaluate(self, trainer):
        return "validation", self._evaluate(trainer, "validation", self.config.eval_batches)

    def final_results(self, trainer) -> dict:
        """Every split's metrics at the new context, the parent's provenance, and the fine-tuning tokens as a
        fraction of the parent's pre-training tokens."""
        cfg = self.config
        if trainer.step == 0 and not has_checkpoint(trainer.run_dir):
            # a zero-step run never reaches the loop's checkpoints: the swapped model is its checkpoint
            trainer.save_checkpoint()
        splits = {s: self._evaluate(trainer, s, cfg.final_eval_batches) for s in self.task.split_names}
        results = None
        if trainer.procs.is_main:
            losses = [m["train_loss"] for m in read_metrics(trainer.run_dir) if "train_loss" in m]
            tokens = trainer.step * cfg.batch_size * cfg.context
            parent_tokens = pretraining_tokens(cfg.parent)
            results = {**self.identity(), "kind": "extend", "metric": self.task.metric, "steps": trainer.step,
                       "planned_steps": cfg.max_steps, "context": cfg.context, "parent_context": cfg.parent["context"],
                       "scale": cfg.context / cfg.parent["context"],
                       "parent": {k: cfg.parent[k] for k in PARENT_KEYS if k != "config"},
                       "train_seconds": round(trainer.elapsed, 3), "final_train_loss": losses[-1] if losses else None,
                       "tokens": {"fine_tuning": tokens, "pre_training": parent_tokens,
                                  "fraction": tokens / parent_tokens if parent_tokens else None},
                       "parameters": trainer.model.num_parameters(), "world_size": trainer.procs.world_size,
                       "splits": splits}
        return from_main(results, trainer.procs)


def pretraining_tokens(parent: dict) -> int | None:
    """Tokens the parent was trained on (its steps x batch_size x context; for a parent that is itself an
    extension, its own parent's plus its fine-tuning); None when its step is not recorded (an HF export)."""
    if parent.get("step") is None:
        return None
    config = parent["config"]
    own = int(parent["step"]) * int(config["batch_size"]) * int(parent["context"])
    if parent["source"] != "extend":
        return own
    before = pretraining_tokens(config["parent"])
    return None if before is None else before + own


# -- reading extension runs and the provenance of any run

def is_extend_run(run_dir) -> bool:
    """Whether `run_dir` holds an extension run (its config.json is an ExtendConfig)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "parent" in config


def load_extend_run(run_dir, device: str = "cpu"):
    """(model in eval mode, task, ExtendConfig) of an extension run, from its checkpoint (checked as a resume
    checks it: a bad file is a RunFileError naming it)."""
    run_dir = Path(run_dir)
    if not has_checkpoint(run_dir) or not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"run_dir {str(run_dir)!r} must contain {CONFIG_FILE} and {CHECKPOINT_FILE} (a `poskit "
                         "extend` run)")
    saved = ExtendRecipe.load_config(run_dir)
    ckpt = checkpoint_path(run_dir)
    state = read_checkpoint(ckpt, device, ExtendRecipe)
    checkpoint_config(run_dir, state, saved, ExtendRecipe)
    cfg = dataclasses.replace(saved, device=device)
    train_cfg = cfg.train_config()
    task = build_task_for(train_cfg)
    model = build_model(train_cfg, task)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise does_not_fit(ckpt, e, "the run's model") from None
    return model.eval(), task, cfg


def load_trained(run_dir, device: str = "cpu"):
    """(model in eval mode, task, TrainConfig, ExtendConfig or None) of a finished `poskit train` run or a
    `poskit extend` run (then its TrainConfig view at the new context, and its own config): the one place that
    tells the two apart for whatever loads either (passkey, a further extension, an export)."""
    if is_extend_run(run_dir):
        model, task, cfg = load_extend_run(run_dir, device)
        return model, task, cfg.train_config(), cfg
    from ..run import load_run

    model, task, cfg = load_run(run_dir, device)
    return model, task, cfg, None


def run_provenance(run_dir, given: str | None = None) -> dict:
    """The provenance of a finished run directory (a training run or an extension) as an ExtendConfig's parent
    records it, but for its "context" (the caller knows the task): the path as `given`, its checkpoint's
    directory and the SHA-256 of the checkpoint record (checkpoint.json; a run from before it: checkpoint.pt),
    its step and its config.json. A run without results (not finished) is refused."""
    run_dir = Path(run_dir)
    given = str(run_dir) if given is None else given
    if not (run_dir / RESULTS_FILE).exists():
        raise ValueError(f"RUN {given!r} has not finished (no {RESULTS_FILE}): extend a finished run, or finish "
                         "it first (poskit train --resume)")
    read_results(run_dir / RESULTS_FILE)  # checked against its config and checkpoint
    config = read_json(run_dir / CONFIG_FILE, "a run's config")
    record_path = run_dir / CHECKPOINT_FILE
    if record_path.exists():
        record = read_json(record_path, "a checkpoint record")
        checkpoint, step = record.get("directory"), record.get("step")
        if not (isinstance(checkpoint, str) and checkpoint.startswith(f"{CHECKPOINTS_DIR}/")
                and isinstance(step, int) and not isinstance(step, bool)):
            raise RunFileError(record_path, "is not a poskit checkpoint record (no checkpoint directory and step)")
    else:  # a run written before checkpoint.json
        record_path = run_dir / LEGACY_CHECKPOINT_FILE
        checkpoint, step = LEGACY_CHECKPOINT_FILE, int(read_checkpoint(record_path)["step"])
    return {"source": "extend" if "parent" in config else "run", "path": given, "checkpoint": checkpoint,
            "checkpoint_sha256": hashlib.sha256(read_bytes(record_path)).hexdigest(), "step": step,
            "config": config}


__all__ = ["ExtendConfig", "ExtendRecipe", "LR_RATIO", "is_extend_run", "load_extend_run", "lr_at",
           "pretraining_tokens", "run_provenance"]
