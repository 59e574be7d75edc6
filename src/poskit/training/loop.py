"""The one training loop: `Trainer` holds a run's model (built once), optimizer, data stream and RNG and trains
it to max_steps, with a recipe (recipes/) for what differs between kinds of runs."""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch

from poskit.encodings.base import PositionalEncoding

from .checkpoint_store import write_checkpoint
from .config import TrainConfig
from .distributed import (
    Processes,
    barrier,
    from_main,
    full_model_state,
    full_optimizer_state,
    gather_to_main,
    load_full_state,
    max_across,
    wrap_model,
)
from .files import CHECKPOINT_FILE, METRICS_FILE, code_version, does_not_fit
from .rng import rng_state, set_rng_state
from .step import DECAY_RULE, LEGACY_RULE, NonFiniteLossError, update
from .tensorboard_log import TensorBoardLog


def _progress(total: int, initial: int, quiet: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=quiet or not sys.stderr.isatty(),
                dynamic_ncols=True, leave=False)


def _rank_seed(seed: int, rank: int, step: int) -> int:
    # a dropout stream per rank (rank 0 keeps the run's own): identical streams would drop the same units of
    # different examples on every rank
    return (seed * 1_000_003 + rank * 7919 + step) % 2**63


class Trainer:
    """Holds one run's model, optimizer, data stream and RNG; `run()` trains to max_steps (or `stop_after`).
    `recipe` is a Recipe (recipes/), or a TrainConfig for the language-model recipe.

    Under several processes (`procs`, see distributed.py) every rank holds a Trainer: the model is built
    alike on each (same seed) and wrapped (DDP or FSDP2), each step trains on the rank's rows of the global
    batch, and rank 0 alone writes the metrics log, TensorBoard, checkpoints and results while the others
    wait at a barrier."""

    def __init__(self, recipe, run_dir, *, quiet: bool = False, procs: Processes | None = None, label: str = ""):
        if isinstance(recipe, TrainConfig):
            from .recipes.lm import LMRecipe

            recipe = LMRecipe(recipe)
        self.recipe, self.quiet = recipe, quiet
        self.label = label or "/".join(str(recipe.identity()[k]) for k in ("task", "encoding"))
        self.procs = procs or Processes()
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.model = recipe.build_model()
        self.loop = recipe.loop()
        # what a training step calls: the model itself, or its DDP wrapper (FSDP shards self.model in place)
        self.net = wrap_model(self.model, self.procs, self.loop.parallel)
        if self.loop.compile:  # the compiled module shares self.model's parameters; checkpoints save self.model
            self.net = torch.compile(self.net)
        self.rule = DECAY_RULE
        self.optimizer = recipe.optimizer(self.model, self.rule)
        if self.procs.rank > 0:
            torch.manual_seed(_rank_seed(self.loop.seed, self.procs.rank, 0))
        self.step, self.elapsed = 0, 0.0
        self.loss_sum, self.loss_count = 0.0, 0
        self.tensorboard: TensorBoardLog | None = None

    # -- one step
    def train_step(self, batch) -> float:
        """One optimizer step on `batch`: the whole batch for one process, this rank's rows under several."""
        loss = update(self.net, self.optimizer, lambda: self.recipe.loss(self.net, batch, self.procs),
                      self.recipe.lr_at(self.step), self.loop.grad_clip, self.step)
        self.step += 1
        return loss

    def next_batch(self):
        """This rank's rows of the step's batch (every rank draws the whole of it: distributed.py)."""
        return self.recipe.next_batch(self.step, self.procs)

    # -- state
    def state_dict(self) -> dict:
        """The full training state (every rank must call it: FSDP gathers its shards, and each rank's RNG
        state is collected); complete on rank 0."""
        procs, mode = self.procs, self.loop.parallel
        state = {"model": full_model_state(self.model, mode, procs),
                 "optimizer": full_optimizer_state(self.model, self.optimizer, mode, procs), "step": self.step,
                 "elapsed": self.elapsed, "loss_acc": [self.loss_sum, self.loss_count], "rng": rng_state(),
                 **self.recipe.data_state(), "config": self.recipe.config.to_dict(),
                 "world_size": procs.world_size, "poskit_version": code_version(), "decay_rule": self.rule}
        if procs.active:
            state["rank_rng"] = gather_to_main(state["rng"], procs)
        return state

    def save_checkpoint(self) -> None:
        state = self.state_dict()
        if self.procs.is_main:
            # how much of the metrics log this state has seen: a resume keeps exactly that (checkpoint.py)
            metrics = self.run_dir / METRICS_FILE
            state["metrics_bytes"] = metrics.stat().st_size if metrics.exists() else 0
            write_checkpoint(self.run_dir, state, self.recipe.model_config(self.model),
                             run={**self.recipe.identity(), "poskit_version": code_version()})
        barrier(self.procs)

    def restore(self, state: dict, path: Path | None = None) -> None:
        """Continue from a checkpoint's `state` (read and checked by checkpoint.read_checkpoint). The model,
        optimizer and data stream are loaded first and the process's RNG last, so that a state that does not
        fit this run's model raises (a RunFileError naming `path`) before any global state changes; the caller
        discards the Trainer then. The state may come from a run with another number of processes: the data
        stream continues exactly (it is shared by all ranks); a rank the checkpoint has no RNG state of starts
        a fresh dropout stream."""
        rule = state.get("decay_rule", LEGACY_RULE)
        if rule != self.rule:  # a checkpoint of an older version continues with the groups it was trained with
            self.optimizer, self.rule = self.recipe.optimizer(self.model, rule), rule
        try:
            load_full_state(self.model, self.optimizer, state["model"], state["optimizer"], self.loop.parallel,
                            self.procs)
            self.recipe.load_data_state(state)
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            if path is None:
                raise
            raise does_not_fit(path, e) from None
        self.step, self.elapsed = int(state["step"]), float(state.get("elapsed", 0.0))
        self.loss_sum, self.loss_count = (float(state["loss_acc"][0]), int(state["loss_acc"][1])) \
            if "loss_acc" in state else (0.0, 0)
        rank, saved = self.procs.rank, state.get("rank_rng") or [state["rng"]]
        set_rng_state(saved[rank] if rank < len(saved) else state["rng"])
        if rank >= len(saved):
            torch.manual_seed(_rank_seed(self.loop.seed, rank, self.step))

    def encoding_statistics(self) -> dict:
        """{module name: statistics} of the model's encodings that report any (PositionalEncoding.statistics);
        none under FSDP, whose parameters are shards here."""
        if self.procs.active and self.loop.parallel == "fsdp":
            return {}
        return {name: stats for name, m in self.model.named_modules()
                if isinstance(m, PositionalEncoding) and (stats := m.statistics())}

    def log(self, record: dict) -> None:
        if not self.procs.is_main:
            return
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def on_main(self, compute):
        """`compute()` (an evaluation): rank 0 evaluates its full copy while a DDP run's other ranks wait (they
        get None); an FSDP model exists only as shards, so every rank takes part in its forward passes."""
        if self.procs.active and self.loop.parallel == "ddp":
            result = compute() if self.procs.is_main else None
            barrier(self.procs)
            return result
        return compute()

    # -- the loop
    def run(self, stop_after: int | None = None) -> bool:
        """Train until max_steps; with `stop_after`, stop (with a checkpoint) after that many steps of this
        invocation. Returns True when the run is complete."""
        loop, recipe = self.loop, self.recipe
        stop_at = loop.max_steps if stop_after is None else min(loop.max_steps, self.step + stop_after)
        bar = _progress(loop.max_steps, self.step, self.quiet or not self.procs.is_main, self.label)
        if loop.tensorboard and self.procs.is_main and self.run_dir is not None:
            self.tensorboard = TensorBoardLog(self.run_dir, self.step)
        self.model.train()
        t0 = time.perf_counter() - self.elapsed
        try:
            while self.step < stop_at and not self.out_of_time():
                try:
                    loss = self.train_step(self.next_batch())
                except NonFiniteLossError as e:
                    kept = "" if self.run_dir is None else (
                        f"; {self.run_dir / CHECKPOINT_FILE} keeps the last good state (its last checkpoint)")
                    raise NonFiniteLossError(f"{e}{kept}") from None
                self.loss_sum, self.loss_count = self.loss_sum + loss, self.loss_count + 1
                self.elapsed = time.perf_counter() - t0
                if loop.train_seconds is not None:
                    # every rank must stop at the same step: the slowest rank's clock decides
                    self.elapsed = max_across(self.elapsed, self.procs)
                bar.update(1)
                # the run ends at max_steps, or earlier when a time budget is spent
                done = self.step == loop.max_steps or self.out_of_time()
                if self.step % loop.log_every == 0 or done:
                    self.log({"step": self.step, "train_loss": self.loss_sum / self.loss_count,
                              "lr": recipe.lr_at(self.step - 1), "elapsed": round(self.elapsed, 3)})
                    bar.set_postfix(loss=f"{self.loss_sum / self.loss_count:.4f}")
                    self.loss_sum, self.loss_count = 0.0, 0
                if self.step % loop.eval_every == 0 or done:
                    evaluation = recipe.evaluate(self)
                    # every rank evaluates the curve splits: under DDP each evaluation ends in a barrier, which
                    # the ranks that get no metrics (all but rank 0) must reach too
                    curves = recipe.curve_evaluations(self)
                    if evaluation is not None and evaluation[1] is not None:
                        self.log({"step": self.step, "split": evaluation[0], **evaluation[1]})
                        self._report(bar, *evaluation)
                        for split, metrics in curves:
                            if metrics is not None:
                                self.log({"step": self.step, "split": split, **metrics})
                        stats = self.encoding_statistics()
                        if stats:
                            self.log({"step": self.step, "encoding": stats})
                    t0 = time.perf_counter() - self.elapsed  # evaluation time is not training time
                if self.step % loop.checkpoint_every == 0 or self.step == stop_at or done:
                    self.save_checkpoint()
        finally:
            bar.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
                self.tensorboard = None
        return self.step >= loop.max_steps or self.out_of_time()

    def _report(self, bar, split: str, metrics: dict) -> None:
        # on a terminal the progress bar shows the loss; elsewhere (a log file, a worker process) one line each
        if self.quiet or not self.procs.is_main or not bar.disable:
            return
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        print(f"  {self.label} step {self.step}/{self.loop.max_steps}: {split} {shown} ({self.elapsed:.0f} s)",
              file=sys.stderr, flush=True)

    def out_of_time(self) -> bool:
        return self.loop.train_seconds is not None and self.elapsed >= self.loop.train_seconds

    def steps_for_budget(self, seconds: float, timed_steps: int = 12, warm_steps: int = 3) -> tuple[int, float]:
        """(max_steps, seconds per step) so that training takes about `seconds`: times a few steps of this very
        trainer, then puts back its weights, optimizer, data stream and RNG, so the run itself is unaffected."""
        saved = (rng_state(), copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict()),
                 copy.deepcopy(self.recipe.data_state()), self.step)
        try:
            for i in range(warm_steps + timed_steps):
                if i == warm_steps:
                    t0 = time.perf_counter()
                self.train_step(self.next_batch())
            per_step = (time.perf_counter() - t0) / timed_steps
        finally:
            state, weights, optimizer, data, self.step = saved
            self.model.load_state_dict(weights)
            self.optimizer.load_state_dict(optimizer)
            self.recipe.load_data_state(data)
            set_rng_state(state)
        return max(1, int(from_main(seconds / per_step, self.procs))), per_step
