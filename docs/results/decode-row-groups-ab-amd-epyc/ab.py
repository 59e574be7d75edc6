"""Variants of the compiled kernel in one process, interleaved: each built from a commit's cpu_flash.cpp (with text
replacements) under an operator namespace of its own, so that torch loads them side by side.

    python ab.py OUTDIR NAME=COMMIT[:old=>new] ...   (run from the repository root)

builds OUTDIR/NAME/lib.so for each variant (its source: `git show COMMIT:src/poskit/attention/cpu_flash.cpp`,
then each replacement), then times the flash decode form (`decode`) at B=8, d=64, 8192 cached keys, causal, over
new queries x heads per kv head, and PoPE's magnitude decode, per dtype: medians of 22 rounds after 3, every
variant once per round. Prints a Markdown table of milliseconds.
"""
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from poskit.attention import kernel_build
from poskit.report.record import machine_info


def build(out: Path, name: str, spec: str) -> None:
    commit, _, rule = spec.partition(":")
    src = subprocess.run(["git", "show", f"{commit}:src/poskit/attention/cpu_flash.cpp"], check=True,
                         capture_output=True, text=True).stdout
    src = src.replace("TORCH_LIBRARY(poskit_cpu_flash,", f"TORCH_LIBRARY({name},")
    if rule:
        old, new = rule.split("=>")
        assert old in src, old
        src = src.replace(old, new)
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "cpu_flash.cpp").write_text(src)
    kernel_build.SOURCE = out / name / "cpu_flash.cpp"
    subprocess.run(kernel_build.compile_command("c++", out / name / "lib.so"), check=True)
    torch.ops.load_library(str(out / name / "lib.so"))


def timed(calls: dict) -> dict:
    times = {n: [] for n in calls}
    for _ in range(25):
        for n, call in calls.items():
            start = time.perf_counter()
            call()
            times[n].append(time.perf_counter() - start)
    return {n: statistics.median(t[3:]) * 1e3 for n, t in times.items()}


def main():
    out = Path(sys.argv[1])
    variants = dict(arg.split("=", 1) for arg in sys.argv[2:])
    for name, spec in variants.items():
        build(out, name, spec)
    torch.set_num_threads(2)
    print(f"{machine_info()['cpu']}, threads 2, torch {torch.__version__}; variants: {variants}\n")
    print("| call | dtype | shape | " + " | ".join(variants) + " |")
    print("|---|---|---|" + "---|" * len(variants))
    g = torch.Generator().manual_seed(0)
    T, D = 8192, 64
    empty, nopad, nopos = torch.empty(0), torch.empty(0, dtype=torch.bool), torch.empty(0, 0, dtype=torch.int64)
    for dtype in (torch.float32, torch.bfloat16):
        for B, H, Hkv, Tq in ((8, 8, 8, 1), (8, 8, 8, 4), (8, 32, 8, 1), (8, 8, 8, 8)):
            q = torch.randn(B, H, Tq, D, generator=g).to(dtype)
            k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
            args = (q, k, v, 0.125, True, torch.arange(T - Tq, T)[None], torch.arange(T)[None], nopad, 0, empty,
                    0, 0, 0.0)
            ms = timed({n: (lambda n=n: getattr(torch.ops, n).decode(*args)) for n in variants})
            print(f"| decode form | {dtype} | B={B} H={H} Hkv={Hkv} Tq={Tq} | "
                  + " | ".join(f"{m:.2f}" for m in ms.values()) + " |", flush=True)
        for Hkv, R in ((2, 4), (8, 4), (8, 1)):
            mu = torch.rand(8, Hkv, T, D, generator=g).to(dtype)
            v = torch.randn(8, Hkv, T, D, generator=g).to(dtype)
            angles = torch.rand(1, T, 2 * D, generator=g) * 2 - 1
            rows = torch.randn(8, Hkv, R, 2 * D, generator=g) / D
            ms = timed({n: (lambda n=n: getattr(torch.ops, n).magnitude_decode(rows, mu, v, angles, nopad, nopos,
                                                                                nopos, False, 16))
                        for n in variants})
            print(f"| PoPE's decode | {dtype} | B=8 Hkv={Hkv} R={R} | "
                  + " | ".join(f"{m:.2f}" for m in ms.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
