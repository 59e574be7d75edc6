"""PoPE's Cartesian q/k transform, mu [cos(a - delta), sin(a - delta)] with mu = softplus(q), forward and forward +
backward: the compiled kernel's one-pass ops against torch's elementwise path in the same process.

    python benchmarks/polar_transform.py                                  # the demo LM's query and two long shapes
    python benchmarks/polar_transform.py --shapes 32x4x64x32 --dtypes fp32 --rounds 15
    python benchmarks/polar_transform.py --json docs/results/NAME/benchmark.json   # for `poskit report`

Paths, each timed once per round, rounds interleaved (medians; ratios paired per round against torch's path):
"one pass (kernel)" is `encodings.polar_pair` with the kernel's ops (its default where the kernel builds);
"elementwise (torch)" is the same call with the kernel switched off (POSKIT_CPU_KERNEL=0: F.softplus, the rotated
tables, two products, and their backward); "softplus + sigmoid (torch)" is torch's softplus forward and its
sigmoid (what the transform's backward needs of softplus) alone, the floor of any path built on torch's own
functions. Shapes are B x H x T x d of the query (the phase bias's rotation per head included, as PoPE's q).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _harness import keep_freed_memory, start_run, table, write_results  # noqa: E402
from poskit.attention import cpu_flash  # noqa: E402
from poskit.attention.kernel_timing import interleaved  # noqa: E402
from poskit.encodings.polar_pair import polar_pair  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PATHS = ("one pass (kernel)", "elementwise (torch)", "softplus + sigmoid (torch)")


def _inputs(B: int, H: int, T: int, d: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, T, d, generator=g).to(dtype).requires_grad_()
    a = torch.randn(1, 1, T, d, generator=g) * 3
    delta = torch.rand(1, H, 1, d, generator=g) * -6.28
    grad = torch.randn(B, H, T, 2 * d, generator=g).to(dtype)
    return x, a.cos(), a.sin(), (delta.cos(), delta.sin()), grad


def _runs(x, ca, sa, rotation, grad) -> dict:
    """{path: (forward, forward + backward)} callables."""
    def transform(switch: str, backward: bool):
        def run():
            with cpu_flash.switched(switch):
                out = polar_pair(x, ca, sa, True, rotation=rotation, scale=0.125)
                if backward:
                    torch.autograd.grad(out, (x,), grad)
        return run

    xd = x.detach()

    def softplus_sigmoid(backward: bool):
        def run():
            F.softplus(xd)
            if backward:
                torch.sigmoid(xd)
        return run

    return {PATHS[0]: (transform("1", False), transform("1", True)),
            PATHS[1]: (transform("0", False), transform("0", True)),
            PATHS[2]: (softplus_sigmoid(False), softplus_sigmoid(True))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x4x64x32,1x8x4096x64,8x8x1024x64",
                    help="BxHxTxd query shapes, comma-separated (default: the demo LM's, then two long ones)")
    ap.add_argument("--dtypes", default="fp32,bf16", help=f"comma-separated, from {','.join(DTYPES)}")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20, help="calls per timing (short calls are timed in batches)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the benchmark document (for `poskit report`) to this path")
    args, raw_argv, started, start = start_run(ap, argv)
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes must be among {','.join(DTYPES)}, got {','.join(bad)}")
    if args.rounds < 1 or args.calls < 1:
        ap.error("--rounds and --calls must be at least 1")
    torch.set_num_threads(args.threads)
    if not cpu_flash.available():
        sys.exit("the compiled CPU kernel is not available on this machine (`poskit kernel info` says why)")
    rows = []
    for shape in args.shapes.split(","):
        B, H, T, d = (int(v) for v in shape.split("x"))
        for name in dtypes:
            runs = _runs(*_inputs(B, H, T, d, DTYPES[name]))
            for mode, which in (("fwd", 0), ("fwdbwd", 1)):
                fns = {path: pair[which] for path, pair in runs.items()}

                def run(path: str) -> float:  # seconds per call, over args.calls calls
                    started = time.perf_counter()
                    for _ in range(args.calls):
                        fns[path]()
                    return (time.perf_counter() - started) / args.calls
                times = interleaved(run, list(PATHS), args.rounds)
                for path in PATHS:
                    ratio = statistics.median(a / b for a, b in zip(times[path], times[PATHS[1]]))
                    rows.append({"shape": shape, "dtype": name, "mode": mode, "path": path,
                                 "us": f"{1e6 * statistics.median(times[path]):.0f}", "ratio": f"{ratio:.2f}"})
                    print(rows[-1], file=sys.stderr, flush=True)
    columns = ["shape", "dtype", "mode", "path", "us", "ratio"]
    print(f"PoPE's Cartesian q/k transform (softplus, rotation, scale), {args.threads} threads, medians of "
          f"{args.rounds} interleaved rounds of {args.calls} calls; ratio: paired, against torch's elementwise path")
    print(table(rows, columns))
    if args.json:
        settings = {"shapes": args.shapes, "dtypes": dtypes, "rounds": args.rounds, "calls": args.calls}
        write_results(args.json, "benchmarks/polar_transform.py", raw_argv, settings,
                      {"polar_transform": {"columns": columns, "rows": rows}}, started, start)


if __name__ == "__main__":
    keep_freed_memory()
    main()
