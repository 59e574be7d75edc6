"""Training-step throughput and peak memory of every encoding on the default LM config, relative to RoPE.

    python benchmarks/train_step.py                      # all encodings, CPU, one thread
    python benchmarks/train_step.py --encodings rope,pope,alibi --steps 30 --threads 2
    python benchmarks/train_step.py --device cuda        # peak memory from the CUDA allocator
    python benchmarks/train_step.py --quick              # 2 steps x 1 round: checks that it runs
    python benchmarks/train_step.py --encodings rope,pope --compile   # every model through torch.compile

One process measures every encoding in turn, interleaved over several rounds (so that drifting machine load
hits all encodings alike); the step time is the median over rounds. A step is the trainer's own
(`poskit.train.optimizer_step`: scheduled lr, forward, loss, backward, gradient clipping at 1.0, AdamW with
the trainer's weight-decay groups) on the Shakespeare LM of `poskit demo` (its TrainConfig: 2 layers,
d_model 128, 4 heads, batch 32, context 64) fed random tokens. Peak memory is the highest allocator watermark
during one step above the memory held before it (parameters, gradients and optimizer state excluded): on
CUDA from torch.cuda.max_memory_allocated, on CPU from the profiler's memory events.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import allocator_peak_bytes, keep_freed_memory, start_run, write_results  # noqa: E402

import poskit
from poskit.experiments.defaults import LM_MODEL, LM_TRAIN
from poskit.models import Transformer
from poskit.report import markdown_table
from poskit.tasks import Batch
from poskit.training import TrainConfig, make_optimizer, optimizer_step

VOCAB = 81  # the Shakespeare task's vocabulary size (80 characters + pad)

# encodings that need options to be built; values follow the LM's training context
def encoding_options(name: str, context: int) -> dict:
    if name in ("rope-linear", "rope-ntk"):
        return {"factor": 2.0}
    if name in ("rope-dynamic", "rope-yarn"):
        return {"factor": 2.0, "original_max_positions": context}
    if name == "rope-llama3":  # Llama 3.1's frequency factors
        return {"factor": 2.0, "original_max_positions": context, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    if name == "rope-longrope":  # one factor per rotated pair (head dim 32: 16 pairs)
        return {"factor": 2.0, "original_max_positions": context, "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}
    if name in ("relative", "relative-capped"):
        return {"max_distance": context}
    return {}


class Run:
    """One encoding's model, optimizer and config, stepped exactly as the trainer steps them."""

    def __init__(self, name: str, batch_size: int, context: int, device: str, compile_model: bool = False):
        cfg = dict(LM_TRAIN, batch_size=batch_size, task_options={"context": context}, device=device,
                   model={**LM_MODEL, "encoding": name, "encoding_options": encoding_options(name, context)})
        self.cfg = TrainConfig.from_dict(cfg)
        torch.manual_seed(0)
        self.model = Transformer(dataclasses.replace(self.cfg.model, vocab_size=VOCAB)).to(device)
        self.optimizer = make_optimizer(self.model, self.cfg)
        if compile_model:  # the optimizer keeps the same parameters; only the forward/backward are compiled
            self.model = torch.compile(self.model)
        self.step_count = 0

    def step(self, batch: Batch) -> float:
        # past the warmup, so that the timed steps run at a real learning rate
        loss = optimizer_step(self.model, self.optimizer, batch, self.cfg, self.cfg.warmup + self.step_count)
        self.step_count += 1
        return loss


def sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(run: Run, batch: Batch, n: int, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        run.step(batch)
    sync(device)
    return (time.perf_counter() - t0) / n


def peak_memory(run: Run, batch: Batch, device: str) -> int:
    """Bytes allocated at the peak of one training step above what was allocated before it."""
    run.step(batch)  # optimizer state exists from here on, so it counts in the baseline
    return allocator_peak_bytes(lambda: run.step(batch), device)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encodings", default=",".join(poskit.available_encodings()),
                   help="comma-separated encodings (default: all; rope is always included as the reference)")
    p.add_argument("--batch-size", type=int, default=LM_TRAIN["batch_size"])
    p.add_argument("--context", type=int, default=LM_TRAIN["task_options"]["context"])
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the encodings")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true",
                   help="wrap every model in torch.compile (inductor); the warm-up steps include the compilation")
    p.add_argument("--quick", action="store_true", help="2 timed steps, 1 round, 1 warm-up step: a check that it runs")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the table as a benchmark document (docs/results/NAME/benchmark.json, part "
                        "train_step: `poskit report` renders it where a docs page has a table=benchmark marker)")
    args, raw_argv, started, start = start_run(p, argv)
    if args.quick:
        args.steps, args.rounds = 2, 1
    for flag in ("batch_size", "context", "steps", "rounds", "threads"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")

    names = [n for n in args.encodings.split(",") if n]
    unknown = [n for n in names if n not in poskit.available_encodings()]
    if unknown:
        raise SystemExit(f"--encodings must be among {poskit.available_encodings()}, got {unknown}")
    if "rope" not in names:
        names.insert(0, "rope")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, VOCAB, (args.batch_size, args.context), generator=g)
    y = torch.randint(1, VOCAB, (args.batch_size, args.context), generator=g)
    batch = Batch(x, y).to(args.device)
    runs = {n: Run(n, args.batch_size, args.context, args.device, args.compile) for n in names}
    for run in runs.values():  # warm up: tables, allocator, autotuning
        time_steps(run, batch, 1 if args.quick else 2, args.device)
    times = {n: [] for n in names}
    for _ in range(args.rounds):
        for n, run in runs.items():
            times[n].append(time_steps(run, batch, args.steps, args.device))
    tokens = args.batch_size * args.context
    tps = {n: tokens / statistics.median(t) for n, t in times.items()}
    mem = {n: peak_memory(run, batch, args.device) for n, run in runs.items()}
    rows = [[n, f"{1e3 * statistics.median(times[n]):.1f}", f"{tps[n]:,.0f}", f"{tps[n] / tps['rope']:.2f}",
             f"{mem[n] / 2**20:.1f}", f"{mem[n] / mem['rope']:.2f}" if mem["rope"] else "n/a"] for n in names]
    print(f"training step (poskit.train.optimizer_step: clipping, AdamW decay groups), LM {LM_MODEL['n_layers']} "
          f"layers d_model {LM_MODEL['d_model']} {LM_MODEL['n_heads']} heads, batch {args.batch_size} x context "
          f"{args.context}, {args.device}, {args.threads} thread(s), median of {args.rounds} rounds x {args.steps} "
          f"steps{', torch.compile' if args.compile else ''}\n")
    columns = ["encoding", "ms/step", "tokens/s", "tokens/s vs rope", "peak MiB", "peak vs rope"]
    print(markdown_table(columns, rows))
    if args.json:
        settings = {"encodings": names, "batch_size": args.batch_size, "context": args.context, "steps": args.steps,
                    "rounds": args.rounds, "device": args.device, "compile": args.compile,
                    "model": {k: LM_MODEL[k] for k in ("n_layers", "d_model", "n_heads")}}
        parts = {"train_step": {"columns": columns, "rows": [dict(zip(columns, row)) for row in rows]}}
        write_results(args.json, "benchmarks/train_step.py", raw_argv, settings, parts, started, start)


if __name__ == "__main__":
    keep_freed_memory()
    main()
