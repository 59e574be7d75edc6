"""Training throughput (tokens/s) of the trainer's own step under 1 and 2 processes (torchrun, gloo on CPU).

    python benchmarks/distributed.py                  # 1 process x 1 thread, 1 x 2 threads, 2 x 1 (DDP, FSDP2)
    python benchmarks/distributed.py --steps 40 --batch-size 64
    python benchmarks/distributed.py --quick          # 3 timed steps per row: checks that it runs

Each row is a fresh `torchrun --standalone --nproc_per_node N` launch of this script in worker mode, which
builds a `poskit.training.Trainer` exactly as `poskit train` does under that launch (model wrapped by DDP or
FSDP2, every rank drawing the global batch and training on its rows) on the Shakespeare LM of `poskit demo`
(2 layers, d_model 128, 4 heads, context 64) and times its steps. The global batch is the same in every row
(strong scaling), so tokens/s = batch_size x context / step time, the median over the timed steps (each
step is bracketed by barriers, so it is the slowest rank's). Ratios are against the first row.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from poskit.experiments.defaults import LM_MODEL, LM_TRAIN
    from poskit.training import TrainConfig
    from poskit.training.distributed import barrier, start_processes
    from poskit.training.loop import Trainer

    cfg = TrainConfig.from_dict({**LM_TRAIN, "task": "shakespeare", "task_options": {"context": args.context},
                                 "model": {**LM_MODEL, "encoding": args.encoding}, "batch_size": args.batch_size,
                                 "max_steps": 10**6, "parallel": args.parallel})
    procs = start_processes("cpu")
    trainer = Trainer(cfg, None, quiet=True, procs=procs)
    times = []
    for i in range(args.warmup + args.steps):
        batch = trainer.next_batch()
        barrier(procs)
        t0 = time.perf_counter()
        trainer.train_step(batch)
        barrier(procs)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    if procs.is_main:
        step = statistics.median(times)
        print("RESULT " + json.dumps({"processes": procs.world_size, "threads": args.threads, "parallel": args.parallel,
                                      "step_s": step, "tokens_per_s": args.batch_size * args.context / step}))


def launch(n: int, threads: int, parallel: str, args) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), __file__,
           "--worker", "--threads", str(threads), "--parallel", parallel, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), "--context", str(args.context),
           "--encoding", args.encoding]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{n} process(es) failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--parallel", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=30, help="timed steps per row (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (default 32, the demo's)")
    p.add_argument("--context", type=int, default=64, help="training context (default 64, the demo's)")
    p.add_argument("--encoding", default="rope", help="positional encoding (default rope)")
    p.add_argument("--quick", action="store_true", help="3 timed steps, 1 warm-up: checks that it runs")
    args = p.parse_args()
    if args.quick:
        args.steps, args.warmup = 3, 1
    if args.worker:
        worker(args)
        return
    rows = [(1, 1, "ddp"), (1, 2, "ddp"), (2, 1, "ddp"), (2, 1, "fsdp")]
    t0 = time.perf_counter()
    results = [launch(n, threads, parallel, args) for n, threads, parallel in rows]
    base = results[0]["tokens_per_s"]
    print(f"training throughput, Shakespeare LM (2 layers, d_model 128), {args.encoding}, global batch "
          f"{args.batch_size} x context {args.context}, median of {args.steps} steps, CPU gloo")
    print("| processes x threads | wrapper | step (ms) | tokens/s | vs 1 x 1 |")
    print("|---|---|---|---|---|")
    for r in results:
        wrapper = r["parallel"] if r["processes"] > 1 else "none"
        print(f"| {r['processes']} x {r['threads']} | {wrapper} | {r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['tokens_per_s'] / base:.2f}x |")
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
