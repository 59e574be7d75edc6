"""PoPE's step of several new tokens against a long KV cache: the compiled kernel's decode (causal by position
inside the step) against the path it replaced for such steps (Cartesian keys rebuilt from the cached magnitudes,
then the blocked path), with RoPE's step beside them; one process, each step rolled back after (cache.crop).

    python docs/results/pope-multi-token-decode-amd-epyc/multi_token_decode.py > output.md
    python docs/results/pope-multi-token-decode-amd-epyc/multi_token_decode.py 256,512   # other counts

B=8, H=8 (8 kv heads), d=64, 8192 cached keys with room for 1024 more, 2 threads; medians of 7 steps after 2.
The paths are chosen by setting pope_decode.KERNEL_MAX_NEW_TOKENS around each step (0: the rebuilt keys).
"""
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import attention as A  # noqa: E402
from poskit.attention import KVCache, cached_attention, pope_decode  # noqa: E402

torch.set_num_threads(2)
B, H, L, D = 8, 8, 8192, 64
commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"commit {commit}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
print("| dtype | new tokens | rope ms | pope, kernel ms | pope, rebuilt keys ms |")
print("|---|---|---|---|---|")
for n in (tuple(int(c) for c in sys.argv[1].split(",")) if len(sys.argv) > 1 else (1, 4, 16, 64, 128)):
    for dt, dname in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        q, k, v = A.inputs(B, H, L, D, dt, False, "cpu")
        ms = {}
        for label, name, limit in (("rope", "rope", 0), ("kernel", "pope", 10**9), ("rebuilt", "pope", 0)):
            enc = A.build(name, H, D, dt, device="cpu")
            cache = KVCache(num_layers=1, max_length=L + 1024)
            saved = pope_decode.KERNEL_MAX_NEW_TOKENS
            with torch.no_grad():
                pope_decode.KERNEL_MAX_NEW_TOKENS = 0  # the prefill on its blocked path, as by default
                cached_attention(q, k, v, enc, cache, 0, torch.arange(L))
                qn, kn, vn = (t[:, :, :n].clone() for t in (q, k, v))
                pos = torch.arange(L, L + n)

                def step():
                    cached_attention(qn, kn, vn, enc, cache, 0, pos)
                    cache.crop(L)
                pope_decode.KERNEL_MAX_NEW_TOKENS = limit
                for _ in range(2):
                    step()
                times = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
                pope_decode.KERNEL_MAX_NEW_TOKENS = saved
            ms[label] = statistics.median(times) * 1e3
        print(f"| {dname} | {n} | {ms['rope']:.1f} | {ms['kernel']:.1f} | {ms['rebuilt']:.1f} |", flush=True)
