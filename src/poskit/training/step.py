"""One optimizer step of any run (`update`), and the language-model recipe's pieces: schedule, task and model
construction, optimizer, loss targets, loss, evaluation."""
from __future__ import annotations

import dataclasses
import json
import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from poskit.models import Transformer
from poskit.tasks import IGNORE_INDEX, build_task, evaluate_batches, lm_loss
from poskit.tasks.base import Batch

from .config import LOSS_ON_ALLOWED, TrainConfig, loss_positions
from .distributed import Processes, sum_across


class NonFiniteLossError(ValueError):
    """The training loss is NaN or infinite."""


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


# which rule a checkpoint's optimizer groups follow (saved with it; a checkpoint without it used LEGACY_RULE)
DECAY_RULE, LEGACY_RULE = "linear-weights", "matrices-and-embeddings"


def decay_groups(model: torch.nn.Module, weight_decay: float, rule: str = DECAY_RULE) -> list[dict]:
    """The optimizer's parameter groups of any model, by one rule: weight decay on the weight matrices of its
    linear layers, none on norms, biases, embeddings (a tied output matrix is the embedding) and the
    parameters of positional encodings (PoPE's phase bias, CoPE's and relative PE's tables, learned absolute
    positions: a decayed one is pulled towards "no positional information"), nor on any other free parameter
    (a ViT's learned position table). Without weight decay, one group.

    `rule=LEGACY_RULE` gives the language model's groups before this rule (decay on every >= 2-d parameter but
    an encoding's, embeddings included), with which a run checkpointed then continues exactly."""
    from poskit.encodings.base import PositionalEncoding

    params = list(model.parameters())
    encoding = {id(p) for m in model.modules() if isinstance(m, PositionalEncoding) for p in m.parameters()}
    if rule == LEGACY_RULE:
        decayed = {id(p) for p in params if p.dim() >= 2} - encoding
    elif not weight_decay:
        return [{"params": params, "weight_decay": 0.0}]  # explicit: AdamW's own default is 0.01
    else:
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        decayed = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)} - encoding - embeddings
    return [{"params": [p for p in params if id(p) in decayed], "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0}]


def make_optimizer(model: Transformer, cfg: TrainConfig, rule: str = DECAY_RULE) -> torch.optim.AdamW:
    """AdamW with the groups of `decay_groups`."""
    return torch.optim.AdamW(decay_groups(model, cfg.weight_decay, rule), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


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


def update(net: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_of, lr: float, grad_clip: float,
           step: int) -> float:
    """One optimizer step of any run: the learning rate `lr` on every group, `loss_of()` -> (loss to
    backpropagate, its value), backward, global-norm gradient clipping (0: none) and the update (an encoding
    that projects its parameters into an allowed set does it after the step itself: encodings/projection.py).
    A loss that is not finite raises NonFiniteLossError, naming step `step` + 1, before any parameter changes."""
    for g in optimizer.param_groups:
        g["lr"] = lr
    loss, value = loss_of()
    if not math.isfinite(value):
        # an update with NaN/inf gradients would destroy the weights; stop while they are still the last good ones
        raise NonFiniteLossError(f"training loss is {value} at step {step + 1} (the model's output or the data "
                                 f"is not finite); training stopped before updating the weights")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
    optimizer.step()
    return value


def lm_step_loss(model, batch: Batch, cfg: TrainConfig, procs: Processes | None = None) -> tuple[torch.Tensor, float]:
    """(loss to backpropagate, its value) of a language-model batch: the forward pass (under bf16 autocast if
    asked) and the loss on the targets `cfg.loss_on` keeps.

    Under several processes (`procs`; `model` wrapped by DDP or FSDP, `batch` this rank's rows) the loss is
    the mean over the targets of the whole global batch, as one process computes it, and so is the
    gradient after the wrapper averages it across ranks; every rank returns that same global loss."""
    targets = loss_targets(batch.targets.to(cfg.device), cfg)
    with _autocast(cfg.bf16, cfg.device):
        logits = model(batch.inputs.to(cfg.device))  # (B, T, V)
    if procs is None or not procs.active:
        loss = lm_loss(logits.float(), targets)
        return loss, loss.item()
    return _global_mean_loss(logits.float(), targets, procs)


def optimizer_step(model: Transformer, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainConfig,
                   step: int, procs: Processes | None = None) -> float:
    """One language-model training step exactly as the trainer takes it (benchmarks/train_step.py times this
    same function): `update` with the scheduled lr of `step` and the loss of `lm_step_loss`. Returns the loss."""
    return update(model, optimizer, lambda: lm_step_loss(model, batch, cfg, procs), lr_at(step, cfg), cfg.grad_clip,
                  step)


def _global_mean_loss(logits: torch.Tensor, targets: torch.Tensor, procs: Processes) -> tuple[torch.Tensor, float]:
    """(loss to backpropagate, global mean loss). Ranks may hold different numbers of targets (padding,
    loss_on), so each rank's mean would weight them wrongly: the rank's summed loss is divided by the global
    target count, and multiplied by world_size because DDP and FSDP average (not sum) gradients across ranks."""
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    local = torch.tensor([total.item(), float((targets != IGNORE_INDEX).sum())], dtype=torch.float64)
    loss_sum, count = sum_across(local, procs).tolist()
    if not count:  # no target anywhere: a NaN loss, refused by the caller like any other
        return total, float("nan")
    return total * (procs.world_size / count), loss_sum / count


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
