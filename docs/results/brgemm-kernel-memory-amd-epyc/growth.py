"""RSS and step time over a long bf16 PoPE decode in the products form (H / Hkv rows per kv head, one new token
per step, from 4096 cached keys): does oneDNN's per-shape brgemm kernel cache grow without bound (the last key block's size
changes every step), and what do first-seen shapes cost? Usage: python growth.py H HKV STEPS"""
import statistics, sys, time
import torch, poskit
from poskit.attention import KVCache, cached_attention, cpu_flash

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

torch.manual_seed(0)
H, Hkv, d, T0, steps = int(sys.argv[1]), int(sys.argv[2]), 64, 4096, int(sys.argv[3])
enc = poskit.build_encoding("pope", head_dim=d, num_heads=H).to(torch.bfloat16)
cache = KVCache(num_layers=1, max_length=T0 + steps + 1)
with torch.no_grad():
    q, k, v = torch.randn(1, H, T0, d).bfloat16(), torch.randn(1, Hkv, T0, d).bfloat16(), torch.randn(1, Hkv, T0, d).bfloat16()
    cached_attention(q[:, :, -8:], k[:, :, :8], v[:, :, :8], enc, cache, 0, torch.arange(8))  # tiny prefill
    # fill the rest by chunks of 504 (kernel decode steps of several tokens)
    pos = 8
    while pos < T0:
        n = min(504, T0 - pos)
        cached_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], enc, cache, 0, torch.arange(pos, pos + n))
        pos += n
    times, marks = [], []
    base = rss_mb()
    for s in range(steps):
        q1, k1, v1 = torch.randn(1, H, 1, d).bfloat16(), torch.randn(1, Hkv, 1, d).bfloat16(), torch.randn(1, Hkv, 1, d).bfloat16()
        t = time.perf_counter()
        cached_attention(q1, k1, v1, enc, cache, 0, torch.tensor([pos]))
        times.append(time.perf_counter() - t)
        pos += 1
        if (s + 1) % 128 == 0:
            marks.append((s + 1, round(rss_mb() - base, 1)))
print("rows per kv head", H // Hkv, "products", cpu_flash.uses_bf16_products(torch.bfloat16))
print("rss growth MB at steps:", marks)
half = steps // 2
print("median ms first half %.3f second half %.3f" % (1000 * statistics.median(times[:half]), 1000 * statistics.median(times[half:])))
print("mean ms first half %.3f second half %.3f" % (1000 * statistics.mean(times[:half]), 1000 * statistics.mean(times[half:])))
