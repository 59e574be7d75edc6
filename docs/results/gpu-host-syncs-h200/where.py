"""Where poskit.attention waits for the GPU (host syncs) and what they cost: one process, CUDA."""
import collections, statistics, sys, time, traceback, warnings
import torch
sys.path.insert(0, "benchmarks")
import poskit
from poskit.attention import KVCache, cached_attention
from poskit.encodings import angles
from attention import build, inputs, rope_sdpa_baseline

dev = "cuda" if torch.cuda.is_available() else "cpu"
dt = torch.bfloat16 if dev == "cuda" else torch.float32
warnings.simplefilter("ignore")
hits = collections.Counter()
def show(message, category, filename, lineno, file=None, line=None):
    st = [f for f in traceback.extract_stack() if "poskit" in f.filename]
    hits[" <- ".join(f"{f.filename.split('src/')[-1]}:{f.lineno}" for f in st[-3:][::-1]) or filename] += 1
def syncs(label, fn):
    hits.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        if dev == "cuda": torch.cuda.set_sync_debug_mode("warn")
        try: fn()
        finally:
            if dev == "cuda": torch.cuda.set_sync_debug_mode("default")
    print(f"{label}: {sum(hits.values())} syncs", flush=True)
    for w, c in hits.most_common(6): print("    ", c, w, flush=True)

H, D = 8, 64
for B, T in [(1, 4096)]:
    q, k, v = inputs(B, H, T, D, dt, True, dev)
    for name in ["rope", "pope", "alibi", "relative-capped", "cope"]:
        enc = build(name, H, D, dt, T, dev)
        fn = lambda: poskit.attention(q, k, v, enc, is_causal=True)
        fn().sum().backward()
        syncs(f"{name} fwd", fn)
        syncs(f"{name} fwd+bwd", lambda: fn().sum().backward())
    enc = build("rope", H, D, dt, T, dev)
    syncs("rope baseline (transform_qk + SDPA)", lambda: rope_sdpa_baseline(enc)(q, k, v))
# decode steps
for name in ["rope", "pope", "alibi", "cope"]:
    enc = build(name, H, D, dt, 8192, dev)
    try:
        from attention import decode_step
        qd, kd, vd = (torch.randn(8, H, 1024, D, device=dev, dtype=dt) for _ in range(3))
        step = decode_step(name, enc, qd, kd, vd, 64)
        step()
        syncs(f"{name} decode step", step)
    except Exception as e:
        print(name, "decode failed", type(e).__name__, e)

def timed(fn, calls=50, rounds=7):
    out = []
    for _ in range(rounds):
        if dev == "cuda": torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls): fn()
        if dev == "cuda": torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(out)

original = angles.AngleTables.lookup
def direct(self, positions, inv_freq, dtype, cache=True):
    return original(self, positions, inv_freq, dtype, cache=False)
for B, T in [(1, 4096), (8, 1024), (1, 16384)]:
    q, k, v = inputs(B, H, T, D, dt, False, dev)
    for name in ["rope", "pope"]:
        enc = build(name, H, D, dt, T, dev)
        res = {}
        for r in range(2):
            for mode in ("table", "direct"):
                angles.AngleTables.lookup = original if mode == "table" else direct
                res.setdefault(mode, []).append(timed(lambda: poskit.attention(q, k, v, enc, is_causal=True)))
                res.setdefault(mode + " baseline", []).append(timed(lambda: rope_sdpa_baseline(enc)(q, k, v)))
        angles.AngleTables.lookup = original
        print(f"B={B} T={T} {name} fwd ms/call:", {m: [round(x, 3) for x in xs] for m, xs in res.items()}, flush=True)
