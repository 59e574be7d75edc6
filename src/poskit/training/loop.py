"""The training loop: `Trainer` (one run's model, optimizer, data stream and RNG) and the time-budget planner."""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from poskit.tasks.base import Batch

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
    local_rows,
    max_across,
    wrap_model,
)
from .files import CHECKPOINT_FILE, METRICS_FILE, read_metrics
from .rng import rng_state, seed_everything, set_rng_state
from .tensorboard_log import TensorBoardLog
from .step import NonFiniteLossError, build_model, build_task_for, evaluate, lr_at, make_optimizer, optimizer_step


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

    Under several processes (`procs`, see distributed.py) every rank holds a Trainer: the model is built
    alike on each (same seed) and wrapped (DDP or FSDP2), each step trains on the rank's rows of the global
    batch, and rank 0 alone writes the metrics log, TensorBoard, checkpoints and results while the others
    wait at a barrier."""

    def __init__(self, cfg: TrainConfig, run_dir, *, quiet: bool = False, procs: Processes | None = None):
        self.cfg, self.quiet = cfg, quiet
        self.procs = procs or Processes()
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.task = build_task_for(cfg)
        seed_everything(cfg.seed)
        self.model = build_model(cfg, self.task)
        # what a training step calls: the model itself, or its DDP wrapper (FSDP shards self.model in place)
        self.net = wrap_model(self.model, self.procs, cfg.parallel)
        if cfg.compile:  # the compiled module shares self.model's parameters; checkpoints keep saving self.model
            self.net = torch.compile(self.net)
        self.optimizer = make_optimizer(self.model, cfg)
        if self.procs.rank > 0:
            torch.manual_seed(_rank_seed(cfg.seed, self.procs.rank, 0))
        # the data stream has its own generator so that dropout and data do not share a stream
        self.data_gen = torch.Generator().manual_seed(cfg.seed + 1_000_003)
        self.step, self.elapsed = 0, 0.0
        self.loss_sum, self.loss_count = 0.0, 0
        self.tensorboard: TensorBoardLog | None = None

    # -- one step
    def train_step(self, batch: Batch) -> float:
        """One optimizer step on `batch`: the whole batch for one process, this rank's rows under several."""
        loss = optimizer_step(self.net, self.optimizer, batch, self.cfg, self.step, self.procs)
        self.step += 1
        return loss

    def next_batch(self) -> Batch:
        """This rank's rows of the step's global batch (every rank draws the whole of it: distributed.py)."""
        return local_rows(self.task.train_batch(self.cfg.batch_size, self.data_gen, step=self.step), self.procs)

    # -- state
    def state_dict(self) -> dict:
        """The full training state (every rank must call it: FSDP gathers its shards, and each rank's RNG
        state is collected); complete on rank 0."""
        procs, mode = self.procs, self.cfg.parallel
        state = {"model": full_model_state(self.model, mode, procs),
                 "optimizer": full_optimizer_state(self.model, self.optimizer, mode, procs), "step": self.step,
                 "elapsed": self.elapsed, "loss_acc": [self.loss_sum, self.loss_count], "rng": rng_state(),
                 "data_generator": self.data_gen.get_state(), "config": self.cfg.to_dict(),
                 "world_size": procs.world_size}
        if procs.active:
            state["rank_rng"] = gather_to_main(state["rng"], procs)
        return state

    def model_config(self) -> dict:
        return dataclasses.replace(self.cfg.model, vocab_size=len(self.task.vocab)).to_dict()

    def save_checkpoint(self) -> None:
        state = self.state_dict()
        if self.procs.is_main:
            # how much of the metrics log this state has seen: a resume keeps exactly that (checkpoint.py)
            metrics = self.run_dir / METRICS_FILE
            state["metrics_bytes"] = metrics.stat().st_size if metrics.exists() else 0
            write_checkpoint(self.run_dir, state, self.model_config())
        barrier(self.procs)

    def restore(self, state: dict) -> None:
        """Continue from a checkpoint's `state` (read and checked by checkpoint.read_checkpoint). The model,
        optimizer and data stream are loaded first and the process's RNG last, so that a state that does not
        fit this run's model raises before any global state changes; the caller discards the Trainer then.
        The state may come from a run with another number of processes: the data stream continues exactly
        (it is shared by all ranks); a rank the checkpoint has no RNG state of starts a fresh dropout stream."""
        load_full_state(self.model, self.optimizer, state["model"], state["optimizer"], self.cfg.parallel, self.procs)
        self.data_gen.set_state(state["data_generator"].cpu())
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        self.loss_sum, self.loss_count = float(state["loss_acc"][0]), int(state["loss_acc"][1])
        rank, saved = self.procs.rank, state.get("rank_rng") or [state["rng"]]
        set_rng_state(saved[rank] if rank < len(saved) else state["rng"])
        if rank >= len(saved):
            torch.manual_seed(_rank_seed(self.cfg.seed, rank, self.step))

    def log(self, record: dict) -> None:
        if not self.procs.is_main:
            return
        with open(self.run_dir / METRICS_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def evaluate(self, split: str, max_batches: int | None) -> dict | None:
        """Metrics of `split`: rank 0 evaluates its full copy while a DDP run's other ranks wait (they get
        None); an FSDP model exists only as shards, so every rank takes part in its forward passes."""
        if self.procs.active and self.cfg.parallel == "ddp":
            metrics = evaluate(self.model, self.task, split, max_batches, self.cfg.bf16) if self.procs.is_main else None
            barrier(self.procs)
            return metrics
        return evaluate(self.model, self.task, split, max_batches, self.cfg.bf16)

    # -- the loop
    def run(self, stop_after: int | None = None) -> bool:
        """Train until max_steps; with `stop_after`, stop (with a checkpoint) after that many steps of this
        invocation. Returns True when the run is complete."""
        cfg = self.cfg
        stop_at = cfg.max_steps if stop_after is None else min(cfg.max_steps, self.step + stop_after)
        bar = _progress(cfg.max_steps, self.step, self.quiet or not self.procs.is_main, f"{cfg.task}/{cfg.model.encoding}")
        if cfg.tensorboard and self.procs.is_main and self.run_dir is not None:
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
                if cfg.train_seconds is not None:
                    # every rank must stop at the same step: the slowest rank's clock decides
                    self.elapsed = max_across(self.elapsed, self.procs)
                bar.update(1)
                # the run ends at max_steps, or earlier when a time budget is spent
                done = self.step == cfg.max_steps or self.out_of_time()
                if self.step % cfg.log_every == 0 or done:
                    self.log({"step": self.step, "train_loss": self.loss_sum / self.loss_count,
                              "lr": lr_at(self.step - 1, cfg), "elapsed": round(self.elapsed, 3)})
                    bar.set_postfix(loss=f"{self.loss_sum / self.loss_count:.4f}")
                    self.loss_sum, self.loss_count = 0.0, 0
                if self.step % cfg.eval_every == 0 or done:
                    metrics = self.evaluate(cfg.eval_split, cfg.eval_batches)
                    if metrics is not None:
                        self.log({"step": self.step, "split": cfg.eval_split, **metrics})
                    t0 = time.perf_counter() - self.elapsed  # evaluation time is not training time
                if self.step % cfg.checkpoint_every == 0 or self.step == stop_at or done:
                    self.save_checkpoint()
        finally:
            bar.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
                self.tensorboard = None
        return self.step >= cfg.max_steps or self.out_of_time()

    def out_of_time(self) -> bool:
        return self.cfg.train_seconds is not None and self.elapsed >= self.cfg.train_seconds

    def final_results(self) -> dict:
        """Evaluation on every split of the task, plus the run's bookkeeping (the same dict on every rank)."""
        splits = {s: self.evaluate(s, self.cfg.final_eval_batches) for s in self.task.split_names}
        results = None
        if self.procs.is_main:
            log = read_metrics(self.run_dir)
            train_losses = [m["train_loss"] for m in log if "train_loss" in m]
            results = {"task": self.cfg.task, "encoding": self.cfg.model.encoding, "seed": self.cfg.seed,
                       "metric": self.task.metric, "steps": self.step, "planned_steps": self.cfg.max_steps,
                       "train_seconds": round(self.elapsed, 3),
                       "final_train_loss": train_losses[-1] if train_losses else None,
                       "parameters": self.model.num_parameters(), "world_size": self.procs.world_size,
                       "splits": splits}
        return from_main(results, self.procs)


def steps_for_budget(cfg: TrainConfig, seconds: float, timed_steps: int = 12, warm_steps: int = 3) -> tuple[int, float]:
    """(max_steps, seconds per step) so that training takes about `seconds`: times a few steps on a throwaway
    copy of the model (its own RNG, so the real run is unaffected)."""
    state = rng_state()
    try:
        trainer = Trainer(dataclasses.replace(cfg, max_steps=10**9, seed=cfg.seed + 7), None, quiet=True)
        for i in range(warm_steps + timed_steps):
            if i == warm_steps:
                t0 = time.perf_counter()
            trainer.train_step(trainer.next_batch())
        per_step = (time.perf_counter() - t0) / timed_steps
    finally:
        set_rng_state(state)
    return max(1, int(seconds / per_step)), per_step
