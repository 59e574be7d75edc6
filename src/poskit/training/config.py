"""The training configuration: `TrainConfig`, its validation, and what a resumed run may change."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import torch

from poskit.util.config_check import ConfigError, check_field_types, from_known_fields
from poskit.models import ModelConfig
from poskit.tasks import PRESETS, available_tasks, task_model_defaults, task_parameters, task_split_names

PARALLEL_MODES = ("ddp", "fsdp")
# fields a resumed run may change freely: how many processes train it and whether TensorBoard also logs
# change neither the data stream nor the numbers (docs/distributed.md); compiling changes only the float
# rounding of the same maths
RESUME_FREE_FIELDS = ("world_size", "tensorboard", "compile")

# loss_on's forms, in the words of its error message
LOSS_ON_ALLOWED = '"task", "last" or a non-empty list of distinct target indices such as [-1] or [0, -2]'

# the seeds every generator of a run takes: torch's manual_seed stops at 2**64 - 1 and the run's data generator
# is seeded with seed + 1_000_003 (recipes/lm.py), so the signed 64-bit range is the one that is always safe
SEED_RANGE = (0, 2**63 - 1)


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
    """AdamW decoupled weight decay, on the weight matrices of linear layers (not on norms, biases, embeddings,
    positional-encoding parameters: training.step.decay_groups)."""
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
    curve_splits: list[str] = field(default_factory=list)
    """Further splits evaluated at every periodic evaluation, for their learning curves (an out-of-distribution
    split's error as training goes on, as the CoPE paper's Fig. 5 plots); each one of the task's splits other
    than eval_split, none twice. Only eval_split is shown on the progress line."""
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
    parallel: str = "ddp"
    """How several processes (a `torchrun --nproc_per_node N` launch) share the model: "ddp" (a full copy on
    each, DistributedDataParallel) or "fsdp" (parameters, gradients and optimizer state sharded with FSDP2's
    fully_shard). Ignored by a one-process run. See docs/distributed.md."""
    world_size: int | None = None
    """Number of processes that trained the run, recorded by the trainer (the launch's WORLD_SIZE, 1 without
    torchrun); a value given before training must equal the launch's. A resume may use another number."""
    compile: bool = False
    """Run the training forward and backward through torch.compile (inductor): the same maths, rounded
    differently; the first steps pay for the compilation (10-40 s on CPU). Evaluation stays eager (its batch
    shapes differ). On the default LM on CPU PoPE's step fell to RoPE's (benchmarks/train_step.py --compile,
    docs/benchmarks.md). A resume may switch it on or off."""
    tensorboard: bool = False
    """Also log the metrics.jsonl records as TensorBoard scalars in <run_dir>/tensorboard (needs the
    "tensorboard" extra). A resume may switch it on or off."""

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
        if not self.model.causal and trains_on_next_tokens(self.task):
            raise ConfigError("model.causal", f"true for task {self.task!r} (it trains on next tokens: a bidirectional "
                              "model sees in its input the token it is asked to predict)", self.model.causal)
        check_seed(self.seed)
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
        others = [s for s in splits if s != self.eval_split]
        if len(set(self.curve_splits)) != len(self.curve_splits) or any(s not in others for s in self.curve_splits):
            raise ConfigError("curve_splits", f"a list of distinct splits of task {self.task!r} other than eval_split: "
                                              f"{others}", self.curve_splits)
        if self.parallel not in PARALLEL_MODES:
            raise ConfigError("parallel", f"one of {list(PARALLEL_MODES)}", self.parallel)
        if self.world_size is not None and self.world_size < 1:
            raise ConfigError("world_size", "a positive int or null (recorded by the trainer)", self.world_size)
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
        return from_known_fields(cls, d, "train config")


def check_seed(seed: int) -> None:
    """Refuse a seed outside SEED_RANGE (a ConfigError naming seed), before it reaches a generator."""
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ConfigError("seed", f"an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (the range every random "
                          "generator of a run takes)", seed)


def trains_on_next_tokens(task: str) -> bool:
    """Whether `task` trains its model on next tokens (each target is the input token after it), which a
    bidirectional model would see in its input. A task made for a bidirectional model says so in its model
    defaults (causal False: masked-language modelling); every other registered task is trained on next tokens."""
    return task_model_defaults(task).get("causal", True) is not False


def check_fits_memory(cfg: TrainConfig, vocab_size: int, tokens: int, processes: int = 1) -> None:
    """Refuse, before anything is allocated, a run whose training step could not fit in the memory of the
    machine (or of the GPU it trains on): a ConfigError naming batch_size or the model, with the estimate.

    The estimate is a lower bound, so that a run that fits is never refused: the model's parameters with their
    gradients and AdamW's two moments (4 x 4 bytes each), and per token of this process's share of the batch
    (`tokens` per example) its input and target ids (2 x 8 bytes), its logits (vocab_size floats) and one
    residual stream of d_model floats per layer kept for the backward pass."""
    from poskit.models import Transformer

    available = memory_of(cfg.device)
    if available is None:
        return
    with torch.device("meta"):  # the model's size without memory or random draws
        parameters = Transformer(dataclasses.replace(cfg.model, vocab_size=vocab_size)).num_parameters()
    width = 2 if cfg.bf16 else 4
    model_bytes = 16 * parameters
    rows = -(-cfg.batch_size // processes)
    batch_bytes = rows * tokens * (16 + width * (vocab_size + cfg.model.d_model * cfg.model.n_layers))
    where = "this GPU" if torch.device(cfg.device).type == "cuda" else "this machine"
    if model_bytes > available:
        raise ConfigError("model", f"a model that fits in memory: {parameters:,} parameters need at least "
                          f"{_gib(model_bytes)} for weights, gradients and AdamW's state, {where} has "
                          f"{_gib(available)}", f"d_model={cfg.model.d_model}, n_layers={cfg.model.n_layers}")
    if model_bytes + batch_bytes > available:
        per = f" per process ({rows} rows of {processes})" if processes > 1 else ""
        raise ConfigError("batch_size", f"a batch that fits in memory: a training step on {rows:,} examples of "
                          f"{tokens} tokens{per} with this model ({parameters:,} parameters) needs at least "
                          f"{_gib(model_bytes + batch_bytes)}, {where} has {_gib(available)}", cfg.batch_size)


def memory_of(device: str) -> int | None:
    """Bytes of memory of `device`: the GPU's for a CUDA device, else the machine's physical memory (None where
    the platform does not say)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


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


def config_difference(old, new, free: tuple = RESUME_FREE_FIELDS) -> tuple[str, str, str] | None:
    """The first field (dotted, with both values as repr) in which config `new` differs from `old` other than
    a larger max_steps (the one change that continues a run: it extends it) and the `free` fields; None when
    there is none. Configs are dataclasses with to_dict, or dicts."""
    a_fields, b_fields = (_flatten(c if isinstance(c, dict) else c.to_dict()) for c in (old, new))
    missing = object()
    for key in sorted(a_fields.keys() | b_fields.keys()):
        a, b = a_fields.get(key, missing), b_fields.get(key, missing)
        if a == b or key in free:
            continue
        if key == "max_steps" and isinstance(a, int) and isinstance(b, int) and b > a:
            continue
        a, b = ("(not set)" if v is missing else repr(v) for v in (a, b))
        return key, a, b
    return None
