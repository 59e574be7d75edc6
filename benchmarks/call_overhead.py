"""What one `poskit.attention` call costs beyond its arithmetic: microseconds per call at a shape so small that
the attention itself takes almost nothing (B=1, H=2, T=8, d=16 by default), against a bare
`F.scaled_dot_product_attention` call on the same tensors, and the same for one decode step against a short
KV cache (`cached_attention`) against a bare SDPA call on the cached keys.

Where the arithmetic is small (a GPU, whose kernels at moderate shapes take tens of microseconds; decoding a
small model on a CPU) this per-call cost, Python's and the launches', is what a caller waits for:

    python benchmarks/call_overhead.py --json docs/results/bench-call-overhead-<cpu>/benchmark.json
    python benchmarks/call_overhead.py --device cuda     # host time per call on a GPU (each sample synchronizes)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import start_run, table, write_results  # noqa: E402
from attention import decode_step  # noqa: E402  (benchmarks/attention.py: a step rolled back after, as it times them)

import poskit  # noqa: E402
from poskit.attention.engine import route  # noqa: E402
from poskit.encodings.registration import UntrainedEncodingWarning  # noqa: E402

warnings.simplefilter("ignore", UntrainedEncodingWarning)  # timed, never trained
DEFAULT_ENCODINGS = "none,rope,pope,alibi,relative-capped,cope"
OPTIONS = {"relative-capped": dict(max_distance=64), "cope": dict(p_max=16)}


def per_call_us(fns: dict, calls: int, rounds: int, device: str) -> dict:
    """{label: median microseconds per call}: each round times `calls` calls of every fn in turn (interleaved, so
    that a drift in the machine's speed hits all alike), ended by a synchronize on a GPU."""
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    for fn in fns.values():  # warm-up: tables, plans, a first-use kernel build, autotuning
        for _ in range(20):
            fn()
    sync()
    samples = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            sync()
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            samples[label].append((time.perf_counter() - t) / calls * 1e6)
    return {label: statistics.median(s) for label, s in samples.items()}


def read_printed_table(path: Path) -> dict:
    """(call, encoding) -> us_per_call, read back from this script's printed table (as kept beside an A/B)."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 6 and cells[0] in ("call", "decode") and cells[1] != "encoding":
            rows[(cells[0], cells[1])] = float(cells[3])
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--encodings", default=DEFAULT_ENCODINGS, help=f"comma-separated (default {DEFAULT_ENCODINGS})")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--T", type=int, default=8, help="sequence length of the full calls")
    p.add_argument("--D", type=int, default=16)
    p.add_argument("--cached", type=int, default=32, help="keys in the cache at the decode step")
    p.add_argument("--calls", type=int, default=500, help="calls per timed sample")
    p.add_argument("--rounds", type=int, default=7, help="interleaved samples per row (the median is reported)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quick", action="store_true", help="20 calls, 1 round: a check that every row runs")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the table as a benchmark document (part call_overhead; `poskit report` renders "
                        "it where a docs page has a table=benchmark marker)")
    args, raw_argv, started, start = start_run(p, argv)
    for flag in ("B", "H", "T", "D", "cached", "calls", "rounds", "threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be a positive integer, got {getattr(args, flag)}")
    if args.quick:
        args.calls, args.rounds = 20, 1
    names = [n for n in args.encodings.split(",") if n]
    unknown = [n for n in names if n not in poskit.available_encodings()]
    if unknown:
        p.error(f"--encodings must be among {poskit.available_encodings()}, got {unknown}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    length = max(args.T, args.cached + 1)
    q, k, v = (torch.randn(args.B, args.H, length, args.D, generator=g).to(args.device) for _ in range(3))
    qt, kt, vt = (t[:, :, :args.T] for t in (q, k, v))
    kc, vc = k[:, :, :args.cached + 1], v[:, :, :args.cached + 1]
    q1 = q[:, :, args.cached:args.cached + 1]
    fns = {("call", "SDPA alone"): lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True),
           ("decode", "SDPA alone"): lambda: F.scaled_dot_product_attention(q1, kc, vc)}
    paths = {("call", "SDPA alone"): "-", ("decode", "SDPA alone"): "-"}
    with torch.no_grad():
        for name in names:
            enc = poskit.build_encoding(name, head_dim=args.D, num_heads=args.H, dim=args.H * args.D,
                                        **OPTIONS.get(name, {})).to(args.device)
            if enc.kind == "absolute":  # added to the embeddings, never inside attention
                continue
            fns[("call", name)] = (lambda enc: lambda: poskit.attention(qt, kt, vt, enc, is_causal=True))(enc)
            paths[("call", name)] = route(enc, qt, kt, is_causal=True)
            cached = (t[:, :, :args.cached] for t in (q, k, v))
            fns[("decode", name)] = decode_step(name, enc, *cached, room=16)
            paths[("decode", name)] = "cached_attention"
        us = per_call_us(fns, args.calls, args.rounds, args.device)
    rows = []
    for (what, name), t in us.items():
        bare = us[(what, "SDPA alone")]
        rows.append({"call": what, "encoding": name, "path": paths[(what, name)], "us_per_call": f"{t:.1f}",
                     "over_sdpa_us": f"{t - bare:.1f}", "vs_sdpa": f"{t / bare:.1f}x"})
    rows.sort(key=lambda r: (r["call"] != "call", r["encoding"] != "SDPA alone"))
    columns = ["call", "encoding", "path", "us_per_call", "over_sdpa_us", "vs_sdpa"]
    print(f"# poskit.attention's cost per call beyond its arithmetic: B={args.B} H={args.H} T={args.T} "
          f"d={args.D}, decode against {args.cached} cached keys, {args.device}, {args.threads} thread(s); medians "
          f"of {args.rounds} interleaved samples of {args.calls} calls\n")
    print(table(rows, columns))
    if args.json:
        settings = {k: getattr(args, k) for k in ("B", "H", "T", "D", "cached", "calls", "rounds", "device")}
        settings["encodings"] = names
        write_results(args.json, "benchmarks/call_overhead.py", raw_argv, settings,
                      {"call_overhead": {"columns": columns, "rows": rows}}, started, start)


if __name__ == "__main__":
    main()
