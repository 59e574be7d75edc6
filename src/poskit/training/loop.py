"""The training loop: `Trainer` (one run's model, optimizer, data stream and RNG) and the time-budget planner."""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from poskit.tasks.base import Batch

from .config import TrainConfig
from .files import CHECKPOINT_FILE, METRICS_FILE, atomic_write_bytes, read_metrics
from .rng import rng_state, seed_everything, set_rng_state
from .step import NonFiniteLossError, build_model, build_task_for, evaluate, lr_at, make_optimizer, optimizer_step


def _progress(total: int, initial: int, quiet: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=quiet or not sys.stderr.isatty(),
                dynamic_ncols=True, leave=False)




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

    def save_checkpoint(self) -> None:
        state = self.state_dict()
        # how much of the metrics log this state has seen: a resume keeps exactly that (checkpoint.py)
        metrics = self.run_dir / METRICS_FILE
        state["metrics_bytes"] = metrics.stat().st_size if metrics.exists() else 0
        atomic_write_bytes(self.run_dir / CHECKPOINT_FILE, lambda f: torch.save(state, f))

    def restore(self, state: dict) -> None:
        """Continue from a checkpoint's `state` (read and checked by checkpoint.read_checkpoint). The model,
        optimizer and data stream are loaded first and the process's RNG last, so that a state that does not
        fit this run's model raises before any global state changes; the caller discards the Trainer then."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.data_gen.set_state(state["data_generator"].cpu())
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        self.loss_sum, self.loss_count = float(state["loss_acc"][0]), int(state["loss_acc"][1])
        set_rng_state(state["rng"])

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
                try:
                    loss = self.train_step(self.task.train_batch(cfg.batch_size, self.data_gen, step=self.step))
                except NonFiniteLossError as e:
                    kept = "" if self.run_dir is None else (
                        f"; {self.run_dir / CHECKPOINT_FILE} keeps the last good state (its last checkpoint)")
                    raise NonFiniteLossError(f"{e}{kept}") from None
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





def steps_for_budget(cfg: TrainConfig, seconds: float, timed_steps: int = 12, warm_steps: int = 3) -> tuple[int, float]:
    """(max_steps, seconds per step) so that training takes about `seconds`: times a few steps on a throwaway
    copy of the model (its own RNG, so the real run is unaffected)."""
    state = rng_state()
    try:
        trainer = Trainer(dataclasses.replace(cfg, max_steps=10**9, seed=cfg.seed + 7), None, quiet=True)
        for i in range(warm_steps + timed_steps):
            if i == warm_steps:
                t0 = time.perf_counter()
            trainer.train_step(trainer.task.train_batch(cfg.batch_size, trainer.data_gen, step=trainer.step))
        per_step = (time.perf_counter() - t0) / timed_steps
    finally:
        set_rng_state(state)
    return max(1, int(seconds / per_step)), per_step
