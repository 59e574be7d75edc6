"""A/B of poskit.attention's per-call time on CUDA between two copies of the code, in alternating subprocesses,
plus each copy's host syncs per call (torch.cuda.set_sync_debug_mode).

Run from the repository root, with the old code's src/ copied to .scratch/before_src/src (`git archive dc1bfb5
src/poskit | tar -x -C .scratch/before_src`); wrote ab.json and, through tee, ab.log. where.py beside it found
where the old code's syncs came from (where-before.log)."""
import json, os, statistics, subprocess, sys, time, warnings

def worker():
    import torch
    sys.path.insert(0, "benchmarks")
    import poskit
    from attention import build, inputs, decode_step
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    warnings.simplefilter("ignore")
    H, D = 8, 64
    calls, rounds = (20, 5) if dev == "cuda" else (1, 2)
    def sync():
        if dev == "cuda": torch.cuda.synchronize()
    def count_syncs(fn):
        n = [0]
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda *a, **k: n.__setitem__(0, n[0] + 1)
            if dev == "cuda": torch.cuda.set_sync_debug_mode("warn")
            try: fn()
            finally:
                if dev == "cuda": torch.cuda.set_sync_debug_mode("default")
        return n[0]
    out = []
    shapes = [(1, 4096), (8, 1024), (1, 16384)] if dev == "cuda" else [(1, 256)]
    for B, T in shapes:
        for mode in ("fwd", "fwdbwd"):
            q, k, v = inputs(B, H, T, D, dt, mode == "fwdbwd", dev)
            for name in ("rope", "pope", "alibi", "relative-capped"):
                if T > 8192 and name in ("alibi", "relative-capped"):
                    continue
                enc = build(name, H, D, dt, T, dev)
                if mode == "fwd":
                    fn = lambda: poskit.attention(q, k, v, enc, is_causal=True)
                else:
                    fn = lambda: poskit.attention(q, k, v, enc, is_causal=True).sum().backward()
                with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                    fn(); fn(); sync()
                    syncs = count_syncs(fn); sync()
                    ts = []
                    for _ in range(rounds):
                        sync(); t = time.perf_counter()
                        for _ in range(calls): fn()
                        sync(); ts.append((time.perf_counter() - t) / calls * 1e3)
                out.append(dict(B=B, T=T, mode=mode, enc=name, ms=statistics.median(ts), syncs=syncs))
    for name in ("rope", "pope", "alibi", "cope"):
        q, k, v = inputs(8, H, 8192 if dev == "cuda" else 256, D, dt, False, dev)
        with torch.no_grad():
            step = decode_step(name, build(name, H, D, dt, device=dev), q, k, v, 1024)
            step(); step(); sync()
            syncs = count_syncs(step)
            ts = []
            for _ in range(rounds):
                sync(); t = time.perf_counter()
                for _ in range(calls): step()
                sync(); ts.append((time.perf_counter() - t) / calls * 1e3)
        out.append(dict(B=8, T=8192, mode="decode", enc=name, ms=statistics.median(ts), syncs=syncs))
    print("RESULT " + json.dumps(out), flush=True)

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    worker()
elif __name__ == "__main__":
    runs = {}
    for rnd in range(2):
        for code, src in (("before", ".scratch/before_src/src"), ("after", "src")):
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            t = time.time()
            p = subprocess.run([sys.executable, __file__, "worker"], env=env, capture_output=True, text=True, timeout=120)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if not line:
                print(code, "failed", p.stderr[-2000:], flush=True); continue
            runs.setdefault(code, []).append(json.loads(line[0][7:]))
            print(f"{code} round {rnd}: {time.time() - t:.0f} s", " ".join(f"{r['enc'][:5]}/{r['mode'][:4]}/{r['T']}:{r['ms']:.2f}:{r['syncs']}" for r in runs[code][-1]), flush=True)
    out_dir = os.environ.get("OUT", ".")
    json.dump(runs, open(os.path.join(out_dir, "ab.json"), "w"))
    before, after = runs["before"], runs["after"]
    print("B T mode enc | before ms (2 runs) | after ms (2 runs) | syncs before -> after")
    for i, row in enumerate(before[0]):
        b = [r[i]["ms"] for r in before]; a = [r[i]["ms"] for r in after]
        print(f"{row['B']} {row['T']} {row['mode']} {row['enc']} | {b[0]:.3f} {b[1]:.3f} | {a[0]:.3f} {a[1]:.3f} | "
              f"{row['syncs']} -> {after[0][i]['syncs']}", flush=True)
