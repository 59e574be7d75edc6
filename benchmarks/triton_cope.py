"""Benchmark: fused Triton CoPE attention vs. a materialised torch implementation.

    python benchmarks/triton_cope.py                 # CUDA: T in 512..4096, fwd and fwd+bwd
    TRITON_INTERPRET=1 python benchmarks/triton_cope.py --smoke   # CPU interpreter, tiny shape

Reports the median time per call (ms) and peak extra memory (MiB, CUDA only).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch  # torch does not import triton, so the interpreter can still be chosen below

# without a GPU the kernels can only run interpreted, which must be set before triton is imported
if "--smoke" in sys.argv or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from poskit.attention.triton_cope import cope_attention_triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import median_ms  # noqa: E402


def cope_torch(q, k, v, e, *, scale, p_max):
    """Eager causal CoPE (Appendix B listing), O(T^2) memory, self-attention positions."""
    T = q.shape[-2]
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, 1)
    v = v.repeat_interleave(rep, 1)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    logits = (q @ k.transpose(-1, -2)) * scale
    logits = logits.masked_fill(~mask, float("-inf"))
    gates = torch.sigmoid(logits)
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=p_max - 1)
    fl = pos.floor()
    w = pos - fl
    z = q @ e.to(q.dtype)
    bias = z.gather(-1, pos.ceil().long()) * w + z.gather(-1, fl.long()) * (1 - w)
    return torch.softmax(logits + bias, -1) @ v


def bench(fn, iters):
    """Median ms per call over `iters` calls after two warm-up calls (each call synchronised on CUDA)."""
    def call():
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return median_ms(call, repeats=iters, warmup=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--p-max", type=int, default=64)
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    dev = "cuda" if cuda else "cpu"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if not cuda:
        dtype = torch.float32
    B, H, Hkv, D = (4, 16, 4, 64) if cuda else (1, 2, 1, 16)
    Ts = [512, 1024, 2048, 4096] if cuda else [64]
    iters = 10 if cuda else 1
    print(f"device={dev} dtype={dtype} B={B} H={H} Hkv={Hkv} D={D} p_max={args.p_max}")
    print(f"{'T':>6} {'impl':>7} {'fwd ms':>9} {'fwd+bwd ms':>11} {'peak MiB':>9}")
    for T in Ts:
        q = torch.randn(B, H, T, D, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(B, Hkv, T, D, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(B, Hkv, T, D, device=dev, dtype=dtype, requires_grad=True)
        e = (0.1 * torch.randn(D, args.p_max, device=dev)).requires_grad_(True)
        impls = {
            "triton": lambda: cope_attention_triton(q, k, v, e, is_causal=True, scale=D ** -0.5, p_max=args.p_max),
            "torch": lambda: cope_torch(q, k, v, e, scale=D ** -0.5, p_max=args.p_max),
        }
        for name, f in impls.items():
            try:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                with torch.no_grad():
                    t_f = bench(f, iters)
                t_fb = bench(lambda: f().float().sum().backward(), iters)
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
                print(f"{T:>6} {name:>7} {t_f:>9.2f} {t_fb:>11.2f} {peak:>9.1f}")
            except torch.OutOfMemoryError:
                print(f"{T:>6} {name:>7} {'OOM':>9}")
            q.grad = k.grad = v.grad = e.grad = None


if __name__ == "__main__":
    main()
