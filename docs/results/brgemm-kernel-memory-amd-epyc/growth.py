"""RSS and step time over a long bf16 decode through cached_attention, one new token per step from 4096 cached
keys: does the process grow with the code oneDNN generates for each new brgemm shape (a decode step's last key tile
grows by one key per step), and what do the steps that meet new shapes cost?

    python growth.py H HKV STEPS ENCODING      e.g. 8 8 1024 rope (the kernel's attention), 16 1 1024 pope (PoPE's
                                               decode in the products form: 16 rows per kv head)

POSKIT_CPU_KERNEL_LIB picks the library (the one before the change and the one after, with one calibration file)."""
import ctypes
import statistics
import sys
import time

import torch

import poskit
from poskit.attention import KVCache, cached_attention, cpu_flash


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def memory_mb():
    """(RSS, heap in use, heap freed but kept by glibc) in MB."""
    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024
    info = _libc.mallinfo2()
    return rss, info.uordblks / 2**20, info.fordblks / 2**20


torch.manual_seed(0)
H, Hkv, steps, name = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
d, T0 = 64, 4096
enc = poskit.build_encoding(name, head_dim=d, num_heads=H).to(torch.bfloat16)
cache = KVCache(num_layers=1, max_length=T0 + steps + 1)


def new(heads, n):
    return torch.randn(1, heads, n, d).bfloat16()


with torch.no_grad():
    pos = 0
    while pos < T0:  # the prompt in chunks of 504 tokens
        n = min(504, T0 - pos)
        cached_attention(new(H, n), new(Hkv, n), new(Hkv, n), enc, cache, 0, torch.arange(pos, pos + n))
        pos += n
    times, marks = [], []
    base = memory_mb()
    for s in range(steps):
        q1, k1, v1 = new(H, 1), new(Hkv, 1), new(Hkv, 1)
        started = time.perf_counter()
        cached_attention(q1, k1, v1, enc, cache, 0, torch.tensor([pos]))
        times.append(time.perf_counter() - started)
        pos += 1
        if (s + 1) % 128 == 0:
            marks.append((s + 1, round(memory_mb()[0] - base[0], 1)))
    rss, used, kept = (round(a - b, 1) for a, b in zip(memory_mb(), base))
print(f"{name}, {H // Hkv} query rows per kv head, bf16 products: {cpu_flash.uses_bf16_products(torch.bfloat16)}")
print("RSS growth (MB) after steps:", marks)
print(f"at the end: RSS +{rss} MB, heap in use +{used} MB, heap freed and kept +{kept} MB")
half = steps // 2
print("step ms, median: first %d steps %.3f, next %d %.3f" % (
    half, 1000 * statistics.median(times[:half]), steps - half, 1000 * statistics.median(times[half:])))
