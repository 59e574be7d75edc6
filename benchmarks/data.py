"""Is data loading ever the bottleneck?  Tokens/s of a corpus task's training batches against the trainer's
tokens/s (the same task, the default TrainConfig; the loader should be >= 20x faster), and the first-run
tokenisation time of each corpus present (tokenised into a fresh cache directory, then reloaded).

    PYTHONPATH=src python benchmarks/data.py [--task lm-wiki] [--corpora jsb,maestro,genome,wiki,plays,code]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch


def loader_rate(task, batch_size: int, seconds: float = 2.0) -> float:
    gen = torch.Generator().manual_seed(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = task.train_batch(batch_size, gen)
        n += batch.inputs.numel()
    return n / (time.perf_counter() - t0)


def trainer_rate(cfg, task, steps: int = 3) -> float:
    from poskit.training.step import build_model, make_optimizer, optimizer_step

    model = build_model(cfg, task)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)
    optimizer_step(model, opt, task.train_batch(cfg.batch_size, gen), cfg, 0)  # warm-up
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        optimizer_step(model, opt, task.train_batch(cfg.batch_size, gen), cfg, step)
    return steps * cfg.batch_size * task.context / (time.perf_counter() - t0)


def first_run_times(corpora: list[str]) -> None:
    from poskit.data import CorpusNotPresent, data_home, load_corpus

    fetched = data_home() / "fetched"
    with tempfile.TemporaryDirectory() as tmp:
        if fetched.is_dir():
            (Path(tmp) / "fetched").symlink_to(fetched)
        os.environ["POSKIT_DATA"] = tmp
        print(f"{'corpus':8s} {'tokens':>12s} {'first run s':>12s} {'reload s':>9s}")
        for name in corpora:
            try:
                first = load_corpus(name)
            except CorpusNotPresent as e:
                print(f"{name:8s} absent: {e}")
                continue
            t0 = time.perf_counter()
            again = load_corpus(name)
            reload = time.perf_counter() - t0
            total = sum(len(s.tokens) for s in again.splits.values())
            print(f"{name:8s} {total:12,d} {first.built_seconds:12.1f} {reload:9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="lm-wiki", help="corpus task whose loader and trainer are timed")
    parser.add_argument("--corpora", default="jsb,maestro,genome,wiki,plays,code",
                        help="comma-separated corpora to tokenise from scratch ('' for none)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    from poskit.tasks import build_task
    from poskit.training import TrainConfig

    cfg = TrainConfig(task=args.task)
    task = build_task(args.task)
    loader = loader_rate(task, cfg.batch_size)
    trainer = trainer_rate(cfg, task)
    print(f"{args.task}: batch {cfg.batch_size} x context {task.context}, vocab {len(task.vocab)}")
    print(f"loader  {loader:14,.0f} tokens/s")
    print(f"trainer {trainer:14,.0f} tokens/s  (default model, CPU, {torch.get_num_threads()} threads)")
    print(f"loader / trainer = {loader / trainer:,.0f}x (needed: >= 20x)")
    if args.corpora:
        first_run_times([c for c in args.corpora.split(",") if c])


if __name__ == "__main__":
    main()
