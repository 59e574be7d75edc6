"""Training a `poskit.model.Transformer` on a `poskit.tasks` task, reproducibly and resumably.

One run lives in one directory:

    config.json     the full TrainConfig (with max_steps resolved when a time budget was given)
    metrics.jsonl   one JSON object per line: {"step", "train_loss", "lr", "elapsed"} every log_every steps,
                    {"step", "split", <metrics>} after every evaluation
    checkpoint.pt   model, optimizer, step, torch/numpy/python (and, once CUDA is in use, CUDA) RNG states,
                    data-generator state (atomic)
    results.json    the final evaluation on every split of the task

Exact resume: everything random (initialisation, dropout, data) flows from `seed` through RNG states that are
saved in the checkpoint, evaluation draws no random numbers, and the metrics log is cut back to the
checkpoint's step on resume; a run killed and resumed ends with the same numbers as an uninterrupted one.
A resumed run keeps its saved config; the only change allowed is a larger max_steps (`resume_config`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from poskit.config_check import ConfigError, check_field_types
from poskit.model import ModelConfig, Transformer
from poskit.tasks import (
    IGNORE_INDEX,
    PRESETS,
    available_tasks,
    build_task,
    evaluate_batches,
    lm_loss,
    task_parameters,
    task_split_names,
)
from poskit.tasks.base import Batch

CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, RESULTS_FILE = "config.json", "metrics.jsonl", "checkpoint.pt", "results.json"
# loss_on's forms, in the words of its error message
LOSS_ON_ALLOWED = '"task", "last" or a non-empty list of distinct target indices such as [-1] or [0, -2]'


@dataclass
class TrainConfig:
    """Everything that determines a training run."""

    task: str = "shakespeare"
    """Task name (see `poskit.tasks.available_tasks()`)."""
    task_options: dict = field(default_factory=dict)
    """Keyword parameters of the task (e.g. {"context": 64} or {"length": 64})."""
    preset: str = "default"
    """Task preset: "default" (CPU scale) or "paper" (the paper's sizes)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model configuration; vocab_size is overwritten by the task's vocabulary size."""
    seed: int = 0
    """Seeds initialisation, dropout and the training data stream."""
    batch_size: int = 32
    """Training examples per optimizer step (evaluation batches are the task's own, see eval_batch_size)."""
    max_steps: int = 1000
    """Optimizer steps (also the end of the cosine decay)."""
    train_seconds: float | None = None
    """Time budget: max_steps is chosen before training by timing a few steps, and training also stops once
    this many seconds of training have passed (whichever comes first; the steps done are recorded)."""
    lr: float = 2e-3
    """Peak learning rate, reached at the end of the warmup."""
    min_lr: float | None = None
    """Learning rate at the end of the cosine decay; None = lr / 10 (the papers' ratio)."""
    warmup_steps: int = 100
    """Steps of linear warmup from lr / warmup_steps to lr (0: start at the peak); see warmup_fraction."""
    warmup_fraction: float | None = None
    """If set, the warmup is this fraction of max_steps (overrides warmup_steps)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay, on weight matrices and embeddings (not norms, biases, positional parameters)."""
    beta1: float = 0.9
    """AdamW's decay rate of the gradient's running mean, in [0, 1)."""
    beta2: float = 0.98
    """AdamW's decay rate of the squared gradient's running mean, in [0, 1) (0.98: the papers' transformers)."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    bf16: bool = False
    """bfloat16 autocast for the forward pass (loss and optimizer stay fp32)."""
    loss_on: str | list[int] = "task"
    """Which targets the training loss uses: "task" all of the task's target positions; "last" only the last
    target of each example (the PoPE diagnostic); a list of indices among each example's targets, counted like
    Python indices ([-1] = "last", [0] the first, [-2, -1] the last two). Evaluation always scores every target."""
    eval_every: int = 250
    """Evaluate on eval_split every this many steps (and at the end)."""
    eval_split: str = "validation"
    """Split of the periodic evaluations (one of the task's splits; the final evaluation covers all of them)."""
    eval_batches: int | None = None
    """Evaluate periodic checks on at most this many batches of the split (None = all)."""
    final_eval_batches: int | None = None
    """Evaluate each split on at most this many batches at the end of training (None = all)."""
    log_every: int = 10
    """Write the mean training loss of the last this many steps to metrics.jsonl."""
    checkpoint_every: int = 250
    """Write a checkpoint every this many steps (and at the end)."""
    device: str = "cpu"
    """Torch device of the model and batches ("cpu", "cuda", "cuda:1", ...)."""

    def __post_init__(self):
        if isinstance(self.model, dict):
            try:
                self.model = ModelConfig.from_dict(self.model)
            except ConfigError as e:
                raise e.renamed(f"model.{e.field}") from None
        check_field_types(self)
        if self.task not in available_tasks():
            raise ConfigError("task", f"one of {available_tasks()}", self.task)
        if self.preset not in PRESETS:
            raise ConfigError("preset", f"one of {list(PRESETS)}", self.preset)
        allowed_options = task_parameters(self.task)
        for key in self.task_options:
            if key not in allowed_options:
                raise ConfigError(f"task_options.{key}", f"a parameter of task {self.task!r}: one of {allowed_options}",
                                  self.task_options[key])
        loss_positions(self.loss_on)  # validates
        for name in ("batch_size", "max_steps", "eval_every", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "a positive int", getattr(self, name))
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps", "a non-negative int", self.warmup_steps)
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise ConfigError("warmup_fraction", "in [0, 1) or null", self.warmup_fraction)
        if not self.lr > 0:
            raise ConfigError("lr", "> 0", self.lr)
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise ConfigError("min_lr", f"in [0, lr={self.lr}] or null", self.min_lr)
        if self.train_seconds is not None and not self.train_seconds > 0:
            raise ConfigError("train_seconds", "> 0 or null", self.train_seconds)
        for name in ("eval_batches", "final_eval_batches"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(name, "a positive int or null", v)
        for name in ("grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(name, ">= 0", getattr(self, name))
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(name, "in [0, 1)", getattr(self, name))
        splits = task_split_names(self.task)
        if self.eval_split not in splits:
            raise ConfigError("eval_split", f"one of the splits of task {self.task!r}: {list(splits)}", self.eval_split)
        try:
            torch.device(self.device)
        except RuntimeError:
            raise ConfigError("device", 'a torch device such as "cpu", "cuda" or "cuda:1"', self.device) from None

    @property
    def final_lr(self) -> float:
        return self.lr / 10 if self.min_lr is None else self.min_lr

    @property
    def warmup(self) -> int:
        if self.warmup_fraction is not None:
            return int(round(self.warmup_fraction * self.max_steps))
        return self.warmup_steps

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown train config field(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)


def loss_positions(loss_on) -> list[int] | None:
    """The target indices `loss_on` keeps (None: all of them); raises ConfigError for anything else."""
    if loss_on == "task":
        return None
    if loss_on == "last":
        return [-1]
    ok = (isinstance(loss_on, list) and loss_on and len(set(loss_on)) == len(loss_on)
          and all(isinstance(p, int) and not isinstance(p, bool) for p in loss_on))
    if not ok:
        raise ConfigError("loss_on", LOSS_ON_ALLOWED, loss_on)
    return list(loss_on)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_config(saved: TrainConfig, requested: TrainConfig | None, where: str = "the run directory") -> TrainConfig:
    """The config a resumed run continues with. A resumed run keeps its saved config, so that it ends as an
    uninterrupted run would; the one allowed change is a larger max_steps, which extends the run (the cosine
    schedule is then recomputed for the new length from the checkpoint on, so the result is not that of a
    run planned that long from the start). Any other difference raises, naming the field.

    `requested` = None means "whatever was saved". A time-budget run (train_seconds) planned its max_steps
    from the budget, so a requested config with the same budget takes the saved max_steps and cannot extend."""
    if requested is None:
        return saved
    if saved.train_seconds is not None and requested.train_seconds == saved.train_seconds:
        requested = dataclasses.replace(requested, max_steps=saved.max_steps)
    old, new = _flatten(saved.to_dict()), _flatten(requested.to_dict())
    missing = object()
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key, missing), new.get(key, missing)
        if a == b or (key == "max_steps" and b > a):
            continue
        a, b = ("(not set)" if v is missing else repr(v) for v in (a, b))
        raise ValueError(
            f"--resume continues the run saved in {where}, where {key} is {a}; got {b}. A resumed run "
            f"keeps its saved config; only max_steps (--steps) may change, and only upwards (to extend the run)")
    return requested


# ----------------------------------------------------------------------------- building blocks


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to lr over `warmup` steps, then cosine decay to min_lr at max_steps (the papers' schedule)."""
    warmup = cfg.warmup
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.max_steps - warmup))
    return cfg.final_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.final_lr)


_TASKS: dict[str, object] = {}


def build_task_for(cfg: TrainConfig):
    """The run's task; built once per process (Shakespeare takes seconds to load) and shared, which is safe
    because tasks hold only deterministic caches."""
    key = json.dumps([cfg.task, cfg.preset, cfg.task_options], sort_keys=True, default=str)
    if key not in _TASKS:
        _TASKS[key] = build_task(cfg.task, preset=cfg.preset, **cfg.task_options)
    return _TASKS[key]


def build_model(cfg: TrainConfig, task) -> Transformer:
    """The model of a run, with the vocabulary size taken from the task."""
    model_cfg = dataclasses.replace(cfg.model, vocab_size=len(task.vocab))
    return Transformer(model_cfg).to(cfg.device)


def make_optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; decay on >= 2-d weights except positional-encoding parameters (a decayed PoPE delta or CoPE table
    would be pulled to zero, i.e. towards "no positional information")."""
    pos_params = {id(p) for m in model.encoding_modules() for p in m.parameters()}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 and id(p) not in pos_params else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def restrict_targets(targets: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Keep only the targets at `positions` among each row's targets, counted like Python indices (0 = a row's
    first target, -1 its last); every other target becomes IGNORE_INDEX. (B, T) -> (B, T)."""
    mask = targets != IGNORE_INDEX
    rank = mask.cumsum(1) - 1  # (B, T): index of each target among its row's targets
    from_end = rank - mask.sum(1, keepdim=True)  # the same counted from the row's end: -1 = last target
    keep = torch.zeros_like(mask)
    for p in positions:
        keep |= (rank == p) if p >= 0 else (from_end == p)
    return torch.where(keep & mask, targets, torch.full_like(targets, IGNORE_INDEX))


def restrict_to_last(targets: torch.Tensor) -> torch.Tensor:
    """Keep only the last target of each row: (B, T) -> (B, T) with every earlier target set to -100."""
    return restrict_targets(targets, [-1])


def loss_targets(targets: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    """The targets the training loss uses: those `cfg.loss_on` keeps. (B, T) -> (B, T)."""
    positions = loss_positions(cfg.loss_on)
    if positions is None:
        return targets
    kept = restrict_targets(targets, positions)
    # a loss over no target is NaN; say why instead (loss_on asks for more targets than the task's rows have)
    if not bool((kept != IGNORE_INDEX).any()):
        most = int((targets != IGNORE_INDEX).sum(1).max())
        raise ValueError(f"loss_on={cfg.loss_on!r} keeps no target of this batch: the rows of task {cfg.task!r} "
                         f"have at most {most} target(s); loss_on must be {LOSS_ON_ALLOWED}")
    return kept


def optimizer_step(model: Transformer, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainConfig,
                   step: int) -> float:
    """One training step exactly as the trainer takes it (benchmarks/train_step.py times this same function):
    the scheduled lr for `step`, the forward pass (under bf16 autocast if asked), the loss on the targets
    `cfg.loss_on` keeps, backward, global-norm gradient clipping and the AdamW update. Returns the loss."""
    lr = lr_at(step, cfg)
    for g in optimizer.param_groups:
        g["lr"] = lr
    targets = loss_targets(batch.targets.to(cfg.device), cfg)
    with _autocast(cfg.bf16, cfg.device):
        logits = model(batch.inputs.to(cfg.device))  # (B, T, V)
    loss = lm_loss(logits.float(), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.item()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    np_state = np.random.get_state()
    # numpy's state as plain lists so the checkpoint loads with torch.load(weights_only=True)
    state = {"torch": torch.get_rng_state(), "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
             "python": random.getstate()}
    # dropout on a GPU draws from that device's own generator; saved once CUDA is in use (a CPU run neither
    # needs it nor should initialise CUDA to ask)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    # checkpoints load with map_location=<run device>, but RNG states must be CPU byte tensors
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    random.setstate(_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        for device, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), device)


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def atomic_write_bytes(path: Path, write) -> None:
    """Write via `write(fileobj)` to a temporary file beside `path`, fsync, then rename over `path`:
    a kill at any moment leaves either the old file or the new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode()))


def read_metrics(run_dir) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluate(model: Transformer, task, split: str, max_batches: int | None = None, bf16: bool = False) -> dict:
    """Task metrics of `model` on (the first `max_batches` batches of) `split`; no randomness is drawn."""
    batches = task.split(split)
    if max_batches is not None:
        batches = batches[:max_batches]
    was_training = model.training
    model.eval()
    try:
        with _autocast(bf16, next(model.parameters()).device):
            return evaluate_batches(model, batches, task.accuracy_level,
                                    device=next(model.parameters()).device)
    finally:
        model.train(was_training)


def _autocast(bf16: bool, device):
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16) if bf16 else nullcontext()


def _progress(total: int, initial: int, quiet: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=quiet or not sys.stderr.isatty(),
                dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """Holds one run's model, optimizer, data stream and RNG; `run()` trains to max_steps (or `stop_after`)."""

    def __init__(self, cfg: TrainConfig, run_dir, *, quiet: bool = False):
        self.cfg, self.quiet = cfg, quiet
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.task = build_task_for(cfg)
        seed_everything(cfg.seed)
        self.model = build_model(cfg, self.task)
        self.optimizer = make_optimizer(self.model, cfg)
        # the data stream has its own generator so that dropout and data do not share a stream
        self.data_gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)
        self.step, self.elapsed = 0, 0.0
        self.loss_sum, self.loss_count = 0.0, 0

    # -- one step
    def train_step(self, batch: Batch) -> float:
        loss = optimizer_step(self.model, self.optimizer, batch, self.cfg, self.step)
        self.step += 1
        return loss

    # -- state
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "elapsed": self.elapsed, "loss_acc": [self.loss_sum, self.loss_count], "rng": rng_state(),
                "data_generator": self.data_gen.get_state(), "config": self.cfg.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        self.loss_sum, self.loss_count = float(state["loss_acc"][0]), int(state["loss_acc"][1])
        set_rng_state(state["rng"])
        self.data_gen.set_state(state["data_generator"].cpu())

    def save_checkpoint(self) -> None:
        state = self.state_dict()
        atomic_write_bytes(self.run_dir / CHECKPOINT_FILE, lambda f: torch.save(state, f))

    def load_checkpoint(self) -> None:
        state = torch.load(self.run_dir / CHECKPOINT_FILE, map_location=self.cfg.device, weights_only=True)
        self.load_state_dict(state)
        # metrics written after the checkpoint (by the killed invocation) are replayed by this one
        kept = [m for m in read_metrics(self.run_dir) if m["step"] <= self.step]
        atomic_write_bytes(self.run_dir / METRICS_FILE,
                           lambda f: f.write("".join(json.dumps(m) + "\n" for m in kept).encode()))

    def log(self, record: dict) -> None:
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- the loop
    def run(self, stop_after: int | None = None) -> bool:
        """Train until max_steps; with `stop_after`, stop (with a checkpoint) after that many steps of this
        invocation. Returns True when the run is complete."""
        cfg = self.cfg
        stop_at = cfg.max_steps if stop_after is None else min(cfg.max_steps, self.step + stop_after)
        bar = _progress(cfg.max_steps, self.step, self.quiet, f"{cfg.task}/{cfg.model.encoding}")
        self.model.train()
        t0 = time.perf_counter() - self.elapsed
        try:
            while self.step < stop_at and not self.out_of_time():
                loss = self.train_step(self.task.train_batch(cfg.batch_size, self.data_gen))
                self.loss_sum, self.loss_count = self.loss_sum + loss, self.loss_count + 1
                self.elapsed = time.perf_counter() - t0
                bar.update(1)
                # the run ends at max_steps, or earlier when a time budget is spent
                done = self.step == cfg.max_steps or self.out_of_time()
                if self.step % cfg.log_every == 0 or done:
                    self.log({"step": self.step, "train_loss": self.loss_sum / self.loss_count,
                              "lr": lr_at(self.step - 1, cfg), "elapsed": round(self.elapsed, 3)})
                    bar.set_postfix(loss=f"{self.loss_sum / self.loss_count:.4f}")
                    self.loss_sum, self.loss_count = 0.0, 0
                if self.step % cfg.eval_every == 0 or done:
                    metrics = evaluate(self.model, self.task, cfg.eval_split, cfg.eval_batches, cfg.bf16)
                    self.log({"step": self.step, "split": cfg.eval_split, **metrics})
                    t0 = time.perf_counter() - self.elapsed  # evaluation time is not training time
                if self.step % cfg.checkpoint_every == 0 or self.step == stop_at or done:
                    self.save_checkpoint()
        finally:
            bar.close()
        return self.step >= cfg.max_steps or self.out_of_time()

    def out_of_time(self) -> bool:
        return self.cfg.train_seconds is not None and self.elapsed >= self.cfg.train_seconds

    def final_results(self) -> dict:
        """Evaluation on every split of the task, plus the run's bookkeeping."""
        splits = {s: evaluate(self.model, self.task, s, self.cfg.final_eval_batches, self.cfg.bf16)
                  for s in self.task.split_names}
        log = read_metrics(self.run_dir)
        train_losses = [m["train_loss"] for m in log if "train_loss" in m]
        return {"task": self.cfg.task, "encoding": self.cfg.model.encoding, "seed": self.cfg.seed,
                "metric": self.task.metric, "steps": self.step, "planned_steps": self.cfg.max_steps,
                "train_seconds": round(self.elapsed, 3),
                "final_train_loss": train_losses[-1] if train_losses else None,
                "parameters": self.model.num_parameters(), "splits": splits}


# ----------------------------------------------------------------------------- time budget


def steps_for_budget(cfg: TrainConfig, seconds: float, timed_steps: int = 12, warm_steps: int = 3) -> tuple[int, float]:
    """(max_steps, seconds per step) so that training takes about `seconds`: times a few steps on a throwaway
    copy of the model (its own RNG, so the real run is unaffected)."""
    state = rng_state()
    try:
        trainer = Trainer(dataclasses.replace(cfg, max_steps=10**9, seed=cfg.seed + 7), None, quiet=True)
        for i in range(warm_steps + timed_steps):
            if i == warm_steps:
                t0 = time.perf_counter()
            trainer.train_step(trainer.task.train_batch(cfg.batch_size, trainer.data_gen))
        per_step = (time.perf_counter() - t0) / timed_steps
    finally:
        set_rng_state(state)
    return max(1, int(seconds / per_step)), per_step


# ----------------------------------------------------------------------------- entry point


def preflight(cfg: TrainConfig) -> None:
    """Build what a run needs once, so that bad input (a task option's value, an example space too small for
    disjoint splits, an encoding option, a device that is not here) stops with its message before any
    directory is created or any step is taken. The task is cached, so its splits are not built twice in this
    process; the model is built on the CPU under a forked RNG, leaving the caller's random state as it was."""
    if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", '"cpu" (CUDA is not available on this machine)', cfg.device)
    task = build_task_for(cfg)
    for split in task.split_names:
        task.split(split)
    loss_targets(task.train_batch(cfg.batch_size, torch.Generator().manual_seed(0)).targets, cfg)
    with torch.random.fork_rng(devices=[]):
        Transformer(dataclasses.replace(cfg.model, vocab_size=len(task.vocab)))


def load_config(run_dir) -> TrainConfig:
    """The config saved in a run directory."""
    return TrainConfig.from_dict(json.loads((Path(run_dir) / CONFIG_FILE).read_text()))


def train(cfg: TrainConfig | None, run_dir, *, resume: bool = False, stop_after: int | None = None,
          quiet: bool = False) -> dict | None:
    """Train `cfg` in `run_dir`; returns the final results (also written to results.json), or None when
    `stop_after` ended this invocation early. A directory that already holds a run is refused without `resume`.

    With `resume`, a checkpoint in `run_dir` is continued with the config saved beside it: `cfg` (None: the
    saved one) must equal it except for a larger max_steps, which extends the run (see `resume_config`). A
    finished run resumed with the same config returns its saved results without training or evaluating."""
    run_dir = Path(run_dir)
    ckpt = run_dir / CHECKPOINT_FILE
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 1):
        raise ValueError(f"stop_after must be a positive int or None, got {stop_after!r}")
    if ckpt.exists() and not resume:
        raise ValueError(f"run_dir {str(run_dir)!r} already holds a run; pass resume=True (--resume) or choose another directory")
    if resume and ckpt.exists():
        saved = load_config(run_dir)
        cfg = resume_config(saved, cfg, str(run_dir / CONFIG_FILE))
        preflight(cfg)
        if cfg != saved:
            # extended: the old results no longer describe the run (and must not be returned after a kill)
            (run_dir / RESULTS_FILE).unlink(missing_ok=True)
            atomic_write_json(run_dir / CONFIG_FILE, cfg.to_dict())
        elif (run_dir / RESULTS_FILE).exists():
            return json.loads((run_dir / RESULTS_FILE).read_text())
        trainer = Trainer(cfg, run_dir, quiet=quiet)
        trainer.load_checkpoint()
    else:
        if cfg is None:
            raise ValueError(f"cfg is needed to start a run: run_dir {str(run_dir)!r} holds no checkpoint to resume")
        preflight(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.train_seconds is not None:
            steps, per_step = steps_for_budget(cfg, cfg.train_seconds)
            cfg = dataclasses.replace(cfg, max_steps=steps)
        (run_dir / METRICS_FILE).unlink(missing_ok=True)
        (run_dir / RESULTS_FILE).unlink(missing_ok=True)
        atomic_write_json(run_dir / CONFIG_FILE, cfg.to_dict())
        trainer = Trainer(cfg, run_dir, quiet=quiet)
    if not trainer.run(stop_after):
        return None
    results = trainer.final_results()
    atomic_write_json(run_dir / RESULTS_FILE, results)
    return results


def load_run(run_dir, device: str = "cpu"):
    """(model in eval mode, task, config) of a trained run directory, from its checkpoint."""
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT_FILE).exists() or not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"run_dir {str(run_dir)!r} must contain {CONFIG_FILE} and {CHECKPOINT_FILE} (a `poskit train` run)")
    cfg = dataclasses.replace(load_config(run_dir), device=device)
    task = build_task_for(cfg)
    model = build_model(cfg, task)
    state = torch.load(run_dir / CHECKPOINT_FILE, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    return model.eval(), task, cfg
