"""Where PoPE's decode step spends its time on a CPU: one step (B=8, H=8, d=64, one new token against 8192 cached
keys, as benchmarks/attention.py's decode rows) for RoPE and PoPE in fp32 and bf16, timed (medians of interleaved
samples) and profiled by torch.profiler (self CPU time per operator over 10 steps). Also PoPE with its compiled
decode loop off (POSKIT_FUSED_DECODE=0: the Cartesian keys rebuilt from the magnitudes).

    python where_time_goes.py [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import attention as bench  # noqa: E402  (benchmarks/attention.py: its decode step and inputs)

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(args.threads)
B, H, D, L = 8, 8, 64, 8192
print(f"torch {torch.__version__}, {args.threads} threads, B={B} H={H} d={D}, {L} cached keys, room 1024")

steps = {}
with torch.no_grad():
    for dname in ("fp32", "bf16"):
        dtype = bench.DTYPES[dname]
        q, k, v = bench.inputs(B, H, L, D, dtype, False, "cpu")
        for name in ("rope", "pope"):
            steps[f"{name} {dname}"] = bench.decode_step(name, bench.build(name, H, D, dtype), q, k, v, 1024)


def unfused(step):
    def run():
        os.environ["POSKIT_FUSED_DECODE"] = "0"
        try:
            step()
        finally:
            os.environ.pop("POSKIT_FUSED_DECODE")
    return run


steps["pope bf16, POSKIT_FUSED_DECODE=0"] = unfused(steps["pope bf16"])
with torch.no_grad():
    for step in steps.values():
        for _ in range(3):
            step()
    times = {label: [] for label in steps}
    for _ in range(15):
        for label, step in steps.items():
            start = time.perf_counter()
            step()
            times[label].append((time.perf_counter() - start) * 1e3)
print("\n| step | ms (median of 15 interleaved) |\n|---|---|")
for label, xs in times.items():
    print(f"| {label} | {statistics.median(xs):.2f} |")

with torch.no_grad():
    for label in ("rope bf16", "pope fp32", "pope bf16"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                steps[label]()
        print(f"\n## {label}: self CPU time per operator, 10 steps\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
