"""Whether zero-padding v to q's width helps poskit's PoPE path on CUDA: poskit.attention(q, k, v, pope) as it is
(v unpadded on CUDA: SDPA picks a kernel for unequal widths) against the same call with SDPA handed v
zero-padded to q's width (2d, so that its flash kernel may run; the padding columns are sliced off, as the CPU
path does). Same inputs, bf16, H=8, d=64, causal; each sample 20 calls ended by a synchronize, the two
alternated 10 times after 3 warm-up samples; medians.

    python padded_v.py
"""
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import poskit
from poskit.attention import sdpa as sdpa_module

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import attention as bench  # noqa: E402  (benchmarks/attention.py: the same encoding and inputs as its table)


class PaddedV:
    """F with scaled_dot_product_attention given v zero-padded to q's width (the output keeps the padding's
    columns; poskit's sdpa slices them off)."""

    def __getattr__(self, name):
        return getattr(F, name)

    padded = 0  # calls that got a padded v: the patch reached the call

    @staticmethod
    def scaled_dot_product_attention(q, k, v, **kw):
        if v.shape[-1] < q.shape[-1]:
            v = F.pad(v, (0, q.shape[-1] - v.shape[-1]))
            PaddedV.padded += 1
        return F.scaled_dot_product_attention(q, k, v, **kw)


def timed(fn, calls=20):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


H, D = 8, 64
enc = bench.build("pope", H, D, torch.bfloat16, device="cuda")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
print("\n| B | T | mode | unpadded ms | padded ms | padded / unpadded | max abs diff | padded calls |\n"
      "|---|---|---|---|---|---|---|---|")
for B, T in ((1, 4096), (8, 1024), (1, 16384)):
    for mode in ("fwd", "fwdbwd"):
        q, k, v = bench.inputs(B, H, T, D, torch.bfloat16, mode == "fwdbwd", "cuda")

        def call():
            out = poskit.attention(q, k, v, enc, is_causal=True)
            if mode == "fwdbwd":
                out.sum().backward()
            return out

        def padded():
            original = sdpa_module.F
            sdpa_module.F = PaddedV()
            try:
                return call()
            finally:
                sdpa_module.F = original

        with torch.no_grad():
            diff = (poskit.attention(q, k, v, enc, is_causal=True).float() - padded().float()).abs().max().item() \
                if mode == "fwd" else float("nan")
        for _ in range(3):
            timed(call), timed(padded)
        a, b = [], []
        for _ in range(10):
            a.append(timed(call))
            b.append(timed(padded))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {B} | {T} | {mode} | {ma:.3f} | {mb:.3f} | {mb / ma:.2f} | {diff:.2e} | {PaddedV.padded} |")
        PaddedV.padded = 0
