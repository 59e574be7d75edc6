"""The kernel's decode form against its tiles for one new token per sequence against 8192 cached keys, in one
process, interleaved (medians of 15 rounds after 3 warm-up rounds): cpu_flash_attention with tiled_rows=1 (the
tiles, the path before the decode form) and tiled_rows=2**30 (the decode form). Causal by position; with and
without a distance-table bias (ALiBi's form). Prints a Markdown table.

    python docs/results/flash-decode-form-ab-amd-epyc/ab.py
"""
import statistics
import time

import torch

from poskit.attention import cpu_flash
from poskit.encodings.kernel_bias import KernelBias, distance_span
from poskit.report.record import machine_info

torch.set_num_threads(2)
T, D, ROUNDS = 8192, 64, 15
print(f"{machine_info()['cpu']}, threads 2, torch {torch.__version__}, bf16 products: "
      f"{cpu_flash.bf16_products_available()}")
print("| dtype | B | heads | kv heads | bias | tiles ms | decode form ms | decode / tiles |")
print("|---|---|---|---|---|---|---|---|")
g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    for B, H, Hkv, biased in ((8, 8, 8, False), (8, 8, 8, True), (8, 8, 2, False), (1, 8, 8, False),
                              (1, 32, 8, False)):
        q = torch.randn(B, H, 1, D, generator=g).to(dtype)
        k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
        qp, kp = torch.tensor([[T - 1]]), torch.arange(T)[None]
        bias = None
        if biased:
            lo, hi = distance_span(qp, kp)
            bias = KernelBias("distance_table", -torch.rand(H, 1)[:, :1] * torch.arange(hi - lo + 1.0), lo)
        runs = {name: (lambda rows=rows: cpu_flash.cpu_flash_attention(
            q, k, v, scale=D ** -0.5, q_positions=qp, k_positions=kp, causal=True, bias=bias, tiled_rows=rows))
            for name, rows in (("tiles", 1), ("decode", 2**30))}
        times = {name: [] for name in runs}
        for round_ in range(3 + ROUNDS):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                if round_ >= 3:
                    times[name].append(time.perf_counter() - start)
        tiles, decode = (statistics.median(times[n]) * 1e3 for n in ("tiles", "decode"))
        print(f"| {str(dtype).split('.')[1]} | {B} | {H} | {Hkv} | {'table' if biased else 'none'} | {tiles:.2f} | "
              f"{decode:.2f} | {decode / tiles:.2f} |", flush=True)
