"""Benchmark the fused PoPE Triton attention (GPU).

    python benchmarks/triton_pope.py --T 4096 --D 64 --dtype bf16 --causal
    python benchmarks/triton_pope.py --T 4096 --D 128 --Hkv 2 --sweep   # tune block configs

Compares, forward and forward+backward:
  * triton_pope     - this kernel (reads q/k/v + d-wide cos/sin tables, rotates in registers)
  * sdpa_cartesian  - torch: materialise 2D-wide q' = mu_q (cos(a_q - delta), sin(a_q - delta)),
                      k' = mu_k (cos a_k, sin a_k) and call scaled_dot_product_attention
                      (the paper's "general variant")
  * sdpa_plain      - plain SDPA at head dim D (no positional encoding): a speed-of-light reference
Also checks the fused output against sdpa_cartesian.

Without a GPU it runs a tiny smoke test under the Triton interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F  # noqa: E402

from poskit.attention import triton_pope as tp  # noqa: E402
from poskit.attention.triton_core import next_pow2  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def make(args, device):
    dtype = DTYPES[args.dtype]
    B, H, Hkv, T, D, Dv = args.B, args.H, args.Hkv, args.T, args.D, args.Dv or args.D
    q = torch.randn(B, H, T, D, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, T, Dv, device=device, dtype=dtype, requires_grad=True)
    delta = (-2 * torch.pi * torch.rand(H, D, device=device)).requires_grad_()
    pos = torch.arange(T, device=device)
    theta = 10000.0 ** (-torch.arange(D, dtype=torch.float64, device=device) / D)
    ang = pos.double()[:, None] * theta
    cos, sin = ang.cos().float(), ang.sin().float()
    return q, k, v, delta, pos, cos, sin


def fused(q, k, v, delta, pos, cos, sin, causal):
    return tp.pope_attention_triton(q, k, v, delta, cos, sin, cos, sin, is_causal=causal,
                                    scale=q.shape[-1] ** -0.5, q_positions=pos, k_positions=pos)


def cartesian(q, k, v, delta, pos, cos, sin, causal):
    mq, mk = F.softplus(q.float()), F.softplus(k.float())
    cd, sd = torch.cos(delta)[None, :, None, :], torch.sin(delta)[None, :, None, :]
    qc = cos * cd + sin * sd
    qs = sin * cd - cos * sd
    qq = torch.cat([mq * qc, mq * qs], -1).to(q.dtype)
    kk = torch.cat([mk * cos, mk * sin], -1).to(k.dtype)
    return F.scaled_dot_product_attention(qq, kk, v, is_causal=causal, scale=q.shape[-1] ** -0.5,
                                          enable_gqa=q.shape[1] != k.shape[1])


def plain(q, k, v, delta, pos, cos, sin, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


def bench(fn, inputs, causal, backward):
    from triton.testing import do_bench

    q, k, v, delta = inputs[:4]
    if not backward:
        with torch.no_grad():
            return do_bench(lambda: fn(*inputs, causal))
    out = fn(*inputs, causal)
    dout = torch.randn_like(out)

    def step():
        o = fn(*inputs, causal)
        torch.autograd.grad(o, (q, k, v, delta) if fn is not plain else (q, k, v), dout)

    return do_bench(step)


def flops(args, backward):
    B, H, T, D, Dv = args.B, args.H, args.T, args.D, args.Dv or args.D
    f = 2 * B * H * T * T * (2 * D + Dv)  # two D-wide dots for the logits + P @ V
    if args.causal:
        f /= 2
    return f * (3.5 if backward else 1.0)  # bwd ~2.5x fwd (recompute + 4 matmuls)


def sweep(args, inputs):
    from triton.testing import do_bench

    q, k, v, delta = inputs[:4]
    out = fused(*inputs, args.causal)
    dout = torch.randn_like(out)
    grid = {
        "fwd": list(itertools.product([64, 128], [32, 64, 128], [4, 8], [2, 3, 4])),
        "bwd_dkdv": list(itertools.product([16, 32, 64], [64, 128], [4, 8], [1, 2, 3])),
        "bwd_dq": list(itertools.product([64, 128], [16, 32, 64], [4, 8], [1, 2, 3])),
    }
    for kind, configs in grid.items():
        results = []
        for cfg in configs:
            tp.BLOCK_CONFIG_OVERRIDE[kind] = cfg
            try:
                if kind == "fwd":
                    with torch.no_grad():
                        ms = do_bench(lambda: fused(*inputs, args.causal))
                else:
                    o = fused(*inputs, args.causal)
                    ms = do_bench(lambda: torch.autograd.grad(o, (q, k, v, delta), dout, retain_graph=True))
            except Exception as e:  # out of shared memory / registers
                print(f"  {kind} {cfg}: failed ({type(e).__name__})")
                continue
            results.append((ms, cfg))
        tp.BLOCK_CONFIG_OVERRIDE.pop(kind, None)
        results.sort()
        print(f"{kind}: best (BLOCK_M, BLOCK_N, warps, stages) = {results[0][1]} "
              f"{results[0][0]:.3f} ms; default {tp._config(kind, next_pow2(args.D), q.device, args.T)}")
        for ms, cfg in results[:5]:
            print(f"    {cfg}: {ms:.3f} ms")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--Hkv", type=int, default=None)
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--Dv", type=int, default=None)
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--sweep", action="store_true", help="sweep block configs of the three kernels")
    args = p.parse_args(argv)
    args.Hkv = args.Hkv or args.H

    if not torch.cuda.is_available():
        print("no GPU: tiny smoke test under the Triton interpreter", file=sys.stderr)
        args.B, args.H, args.Hkv, args.T, args.D, args.Dv, args.dtype = 1, 2, 1, 48, 32, None, "fp32"
        inputs = make(args, "cpu")
        a = fused(*inputs, args.causal)
        b = cartesian(*inputs, args.causal)
        print(f"max |fused - cartesian| = {(a - b).abs().max().item():.2e}")
        return

    inputs = make(args, "cuda")
    with torch.no_grad():
        a = fused(*inputs, args.causal).float()
        b = cartesian(*inputs, args.causal).float()
    print(f"max |fused - cartesian| = {(a - b).abs().max().item():.2e}")
    print(f"B={args.B} H={args.H} Hkv={args.Hkv} T={args.T} D={args.D} Dv={args.Dv or args.D} "
          f"{args.dtype} causal={args.causal} on {torch.cuda.get_device_name()}")
    for name, fn in (("triton_pope", fused), ("sdpa_cartesian", cartesian), ("sdpa_plain", plain)):
        for backward in (False, True):
            try:
                ms = bench(fn, inputs, args.causal, backward)
            except Exception as e:
                print(f"  {name:15s} {'fwd+bwd' if backward else 'fwd':8s} failed: {e}")
                continue
            tflops = flops(args, backward) / ms / 1e9
            print(f"  {name:15s} {'fwd+bwd' if backward else 'fwd':8s} {ms:8.3f} ms  {tflops:7.1f} TFLOP/s")
    if args.Hkv != args.H:  # GQA: compare the two dk/dv strategies
        for mode in ("loop", "split"):
            tp.GQA_DKDV_MODE = mode
            ms = bench(fused, inputs, args.causal, True)
            print(f"  GQA dk/dv mode {mode:5s}: fwd+bwd {ms:8.3f} ms")
        tp.GQA_DKDV_MODE = "auto"
    if args.sweep:
        sweep(args, inputs)


if __name__ == "__main__":
    main()
