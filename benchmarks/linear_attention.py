"""Linear attention (RoFormer eq. 19, linear_attention of attention/linear.py) against softmax attention.

    python benchmarks/linear_attention.py                  # T = 1k, 4k, 16k, causal, forward (a few minutes)
    python benchmarks/linear_attention.py --backward       # forward + backward
    python benchmarks/linear_attention.py --quick          # T = 256, 1024 (seconds)

Rows at each T: softmax attention with RoPE through poskit.attention (SDPA's flash kernel on CPU, the
baseline), linear attention with none / RoPE / PoPE. Columns: median ms (interleaved rounds), `ratio` to the
softmax row at the same T, `growth`: time over the same row's time at the previous T divided by the length
ratio (1.0 = linear in T, the length ratio = quadratic), and `peak_MB` of one call (allocator high-water mark).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import allocator_peak_bytes, interleaved_medians, keep_freed_memory, table  # noqa: E402

import poskit  # noqa: E402
from poskit.attention.linear import linear_attention  # noqa: E402


def rows_for(B, H, T, D, backward):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_(backward) for _ in range(3))
    rope = poskit.build_encoding("rope", head_dim=D, num_heads=H)
    fns = {
        "softmax rope (sdpa)": lambda: poskit.attention(q, k, v, rope, is_causal=True),
        "linear none": lambda: linear_attention(q, k, v, poskit.build_encoding("none", head_dim=D, num_heads=H)),
        "linear rope": lambda: linear_attention(q, k, v, rope),
        "linear pope": lambda: linear_attention(q, k, v, pope),
    }
    pope = poskit.build_encoding("pope", head_dim=D, num_heads=H)

    def wrap(fn):
        def run():
            if backward:
                out = fn()
                out.backward(torch.ones_like(out))
                for t in (q, k, v):
                    t.grad = None
            else:
                with torch.no_grad():
                    fn()
        return run

    return {label: wrap(fn) for label, fn in fns.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backward", action="store_true", help="time forward + backward")
    p.add_argument("--quick", action="store_true", help="T = 256, 1024, one round")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [256, 1024] if args.quick else [int(x) for x in args.lengths.split(",")]
    rounds = 1 if args.quick else args.rounds
    rows, previous = [], {}
    for T in lengths:
        fns = rows_for(args.batch, args.heads, T, args.head_dim, args.backward)
        ms = interleaved_medians(fns, rounds=rounds, warmup=1)
        base = ms["softmax rope (sdpa)"]
        for label, fn in fns.items():
            growth = ""
            if label in previous:
                prev_T, prev_ms = previous[label]
                growth = f"{ms[label] / prev_ms / (T / prev_T):.2f}"
            rows.append({"T": T, "path": label, "ms": f"{ms[label]:.1f}", "ratio": f"{ms[label] / base:.2f}",
                         "growth": growth, "peak_MB": f"{allocator_peak_bytes(fn) / 2**20:.1f}"})
            previous[label] = (T, ms[label])
        print(f"T={T} done", file=sys.stderr, flush=True)
    mode = "forward + backward" if args.backward else "forward"
    print(f"B={args.batch}, H={args.heads}, d={args.head_dim}, causal, {mode}, fp32, "
          f"{torch.get_num_threads()} threads; growth = time ratio to the previous T / length ratio")
    print(table(rows, ["T", "path", "ms", "ratio", "growth", "peak_MB"]))


if __name__ == "__main__":
    main()
