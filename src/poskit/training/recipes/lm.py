"""The language-model recipe: a `Transformer` (decoder, bidirectional MLM encoder, linear attention) on a
`poskit.tasks` task, configured by a TrainConfig (the pieces are in step.py)."""
from __future__ import annotations

import dataclasses

import torch

from poskit.util.config_check import ConfigError

from ..config import RESUME_FREE_FIELDS, TrainConfig, check_fits_memory
from ..distributed import check_batch_split, from_main, local_rows, processes_from_env
from ..files import read_metrics
from ..step import (DECAY_RULE, build_model, build_task_for, evaluate, lm_step_loss, loss_targets, lr_at,
                    make_optimizer)
from ..rng import seed_everything
from ..tensorboard_log import check_tensorboard_available
from .base import Loop, Recipe


class LMSteps:
    """The training steps every language-model recipe shares: the optimizer's groups, a batch of the task's
    training stream from the recipe's seeded generator (`data_gen`) with its state for checkpoints, and the loss,
    all read from the recipe's `train_config` (its TrainConfig)."""

    @property
    def train_config(self) -> TrainConfig:
        raise NotImplementedError

    def optimizer(self, model, rule: str = DECAY_RULE):
        return make_optimizer(model, self.train_config, rule)

    def next_batch(self, step: int, procs):
        return local_rows(self.task.train_batch(self.train_config.batch_size, self.data_gen, step=step), procs)

    def data_state(self) -> dict:
        return {"data_generator": self.data_gen.get_state()}

    def load_data_state(self, state: dict) -> None:
        self.data_gen.set_state(state["data_generator"].cpu())

    def loss(self, net, batch, procs):
        return lm_step_loss(net, batch, self.train_config, procs)


class LMRecipe(LMSteps, Recipe):
    config_type = TrainConfig
    writer = "poskit's trainer"
    state_entries = {"elapsed": (int, float), "loss_acc": (list, tuple), "data_generator": torch.Tensor,
                     "config": dict}
    resume_free_fields = RESUME_FREE_FIELDS

    @property
    def device(self) -> str:
        return self.config.device if self.config is not None else "cpu"

    def loop(self) -> Loop:
        c = self.config
        return Loop(c.max_steps, c.seed, c.log_every, c.eval_every, c.checkpoint_every, c.grad_clip, c.train_seconds,
                    c.parallel, c.compile, c.tensorboard)

    def identity(self) -> dict:
        return {"task": self.config.task, "encoding": self.config.model.encoding, "seed": self.config.seed}

    def resume_config(self, saved: TrainConfig, where: str) -> TrainConfig:
        requested = self.config
        if requested is not None and saved.train_seconds is not None and requested.train_seconds == saved.train_seconds:
            # a time-budget run planned its max_steps from the budget: the same budget cannot extend it
            self.config = dataclasses.replace(requested, max_steps=saved.max_steps)
        cfg = super().resume_config(saved, where)
        # a resume may use another number of processes (the data stream is shared by all ranks)
        return dataclasses.replace(cfg, world_size=processes_from_env().world_size)

    def launch(self, procs) -> None:
        cfg = self.config
        if torch.device(cfg.device).type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", '"cpu" (CUDA is not available on this machine)', cfg.device)
        check_batch_split(cfg.batch_size, procs)
        if cfg.world_size is not None and cfg.world_size != procs.world_size:
            raise ConfigError("world_size", f"{procs.world_size}, the number of processes of this launch (or null: "
                                            "the trainer records it)", cfg.world_size)
        if cfg.tensorboard:
            check_tensorboard_available()
        # the task's splits are built (and cached for the run) so that a task option's value or an example
        # space too small for disjoint splits is refused here, and loss_on must keep targets of its batches
        task = build_task_for(cfg)
        # sizes beyond memory are refused before the first batch (or the model) is allocated
        example = task.train_batch(1, torch.Generator().manual_seed(0), step=0)
        check_fits_memory(cfg, len(task.vocab), example.inputs.shape[1], procs.world_size)
        for split in task.split_names:
            task.split(split)
        loss_targets(task.train_batch(cfg.batch_size, torch.Generator().manual_seed(0), step=0).targets, cfg)
        self.config = dataclasses.replace(cfg, world_size=procs.world_size)

    def build_model(self):
        """The task and the model, seeded from the config."""
        cfg = self.config
        self.task = build_task_for(cfg)

        seed_everything(cfg.seed)
        model = build_model(cfg, self.task)
        # the data stream has its own generator so that dropout and data do not share a stream
        self.data_gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)
        return model

    def model_config(self, model) -> dict:
        return dataclasses.replace(self.config.model, vocab_size=len(self.task.vocab)).to_dict()

    @property
    def train_config(self) -> TrainConfig:
        return self.config

    def lr_at(self, step: int) -> float:
        return lr_at(step, self.config)

    def _evaluate(self, trainer, split: str, max_batches: int | None):
        return trainer.on_main(lambda: evaluate(trainer.model, self.task, split, max_batches, self.config.bf16))

    def evaluate(self, trainer):
        return self.config.eval_split, self._evaluate(trainer, self.config.eval_split, self.config.eval_batches)

    def curve_evaluations(self, trainer):
        return [(s, self._evaluate(trainer, s, self.config.eval_batches)) for s in self.config.curve_splits]

    def final_results(self, trainer) -> dict:
        """Evaluation on every split of the task, plus the run's bookkeeping (the same dict on every rank)."""
        cfg = self.config
        splits = {s: self._evaluate(trainer, s, cfg.final_eval_batches) for s in self.task.split_names}
        results = None
        if trainer.procs.is_main:
            train_losses = [m["train_loss"] for m in read_metrics(trainer.run_dir) if "train_loss" in m]
            results = {**self.identity(), "metric": self.task.metric, "steps": trainer.step,
                       "planned_steps": cfg.max_steps, "train_seconds": round(trainer.elapsed, 3),
                       "final_train_loss": train_losses[-1] if train_losses else None,
                       "parameters": trainer.model.num_parameters(), "world_size": trainer.procs.world_size,
                       "splits": splits}
        return from_main(results, trainer.procs)


def resume_config(saved: TrainConfig, requested: TrainConfig | None, where: str = "the run directory") -> TrainConfig:
    """The config a resumed run continues with. A resumed run keeps its saved config, so that it ends as an
    uninterrupted run would; the one allowed change is a larger max_steps, which extends the run (the cosine
    schedule is then recomputed for the new length from the checkpoint on, so the result is not that of a
    run planned that long from the start). Any other difference raises, naming the field.

    `requested` = None means "whatever was saved". A time-budget run (train_seconds) planned its max_steps
    from the budget, so a requested config with the same budget takes the saved max_steps and cannot extend."""
    return LMRecipe(requested).resume_config(saved, where)
