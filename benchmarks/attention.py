"""Attention benchmark: every encoding's poskit path against RoPE + SDPA, PoPE against its peers, decode.

    python benchmarks/attention.py                       # the full grid (B=8, H=8, d=64, T 256/1024/4096)
    python benchmarks/attention.py --quick                # every row once at a small size (about a minute)
    python benchmarks/attention.py --shapes 1x4096,8x1024 --modes fwdbwd --encodings rope,pope,alibi \
        --without-kernel --skip-peers --skip-decode        # the compiled CPU kernel (the default) against the
                                                          # paths without it (POSKIT_CPU_KERNEL=0), per shape

Prints the machine (CPU model, the instruction set the kernel targets, torch, date) and markdown tables; ratios
are against RoPE + SDPA measured in the same process, same B/T/dtype/mode:
`ratio` for the time, `mem_ratio` for the peak memory (every row reports its peak, `peak_MB`: the
allocator's high-water mark during one call above what was allocated before it). Each row names the path
poskit takes ([blocked-contextual] for CoPE on CPU, [blocked-bias] for the relative encodings). Only
paths that materialise T x T tensors (the reference, the naive complex PoPE peers) are skipped when their
estimated memory exceeds --max-gb.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (allocator_peak_bytes, interleaved_medians, keep_freed_memory, start_run,  # noqa: E402
                      table, write_results)

import poskit  # noqa: E402
from poskit.attention import KVCache, cached_attention  # noqa: E402
from poskit.attention import cpu_flash  # noqa: E402
from poskit.attention.blocked import blocked_attention  # noqa: E402
from poskit.attention import engine  # noqa: E402
from poskit.attention.engine import route  # noqa: E402
from poskit.encodings.registration import UntrainedEncodingWarning  # noqa: E402

# the encodings here are timed, never trained: that they belong to no nn.Module is the point, not a mistake
warnings.simplefilter("ignore", UntrainedEncodingWarning)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OPTIONS = {
    "rope-linear": dict(factor=4.0), "rope-ntk": dict(factor=4.0),
    "rope-dynamic": dict(factor=4.0, original_max_positions=1024),
    "rope-yarn": dict(factor=4.0, original_max_positions=1024),
    "relative-capped": dict(max_distance=256), "learned": dict(max_positions=8192),
    "cope": dict(p_max=64),
    "rope-llama3": dict(factor=4.0, original_max_positions=1024, low_freq_factor=1.0, high_freq_factor=4.0),
    "rope-longrope": dict(factor=4.0, original_max_positions=1024),
}


def build(name, H, D, dtype, T=None, device="cpu"):
    options = dict(OPTIONS.get(name, {}))
    if name == "rope-longrope":  # one factor per rotated pair
        options.update(short_factor=[1.0] * (D // 2), long_factor=[4.0] * (D // 2))
    if name == "relative" and T:
        options["max_distance"] = T  # every offset of the sequence has its embedding
    return poskit.build_encoding(name, head_dim=D, num_heads=H, dim=H * D, **options).to(device=device, dtype=dtype)


def inputs(B, H, T, D, dtype, grad, device="cpu"):
    g = torch.Generator().manual_seed(0)  # drawn on the CPU, so that every device times the same numbers
    return [torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def runner(fn, q, k, v, mode, calls=1):
    """One timed sample: `calls` calls of fn (forward, or forward + backward), waiting for the device at the end.
    A CUDA call returns before its kernels finish, so a sample ends with a synchronize; `calls` > 1 spreads the
    launch and synchronize overhead of short GPU calls (interleaved_medians' times are then divided by it)."""
    def call():
        if mode == "fwd":
            with torch.no_grad():
                fn(q, k, v)
        else:
            out = fn(q, k, v)
            out.backward(torch.ones_like(out))
            for t in (q, k, v):
                t.grad = None

    def run():
        for _ in range(calls):
            call()
        if q.is_cuda:
            torch.cuda.synchronize()
    return run


# --- PoPE peers ---------------------------------------------------------------------------------------
def pope_naive_complex(enc):
    """The obvious implementation: complex q~, k~ (eq. 4-5) and materialised complex logits."""
    def fn(q, k, v):
        T, d = q.shape[2], q.shape[3]
        pos = torch.arange(T, dtype=torch.float32, device=q.device)[:, None] * enc.inv_freq.float()
        delta = enc.clamped_delta(q).float()[:, None, :]
        qc = torch.polar(F.softplus(q.float()), pos.expand_as(q))
        kc = torch.polar(F.softplus(k.float()), (pos + delta).expand_as(k))
        logits = (qc.conj() @ kc.transpose(-1, -2)).real / math.sqrt(d)
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return (logits.softmax(-1) @ v.float()).to(q.dtype)
    return fn


def pope_pytorch_style(enc):
    """As PoPE-pytorch does it: softplus, explicit 2d-wide interleaved (cos, sin) q/k, SDPA with v at d
    (unequal head dims: CPU SDPA falls back to its math path)."""
    def fn(q, k, v):
        T = q.shape[2]
        freqs = torch.arange(T, dtype=torch.float32, device=q.device)[:, None] * enc.inv_freq.float()
        delta = enc.clamped_delta(q).float()[:, None, :]
        mq, mk = F.softplus(q), F.softplus(k)
        q2 = torch.stack((mq * freqs.cos(), mq * freqs.sin()), -1).flatten(-2).to(q.dtype)
        k2 = torch.stack((mk * (freqs + delta).cos(), mk * (freqs + delta).sin()), -1).flatten(-2).to(q.dtype)
        return F.scaled_dot_product_attention(q2, k2, v, is_causal=True, scale=1 / math.sqrt(q.shape[-1]))
    return fn


def pope_padded_sdpa(enc):
    """poskit's Cartesian q/k through SDPA with v zero-padded to 2d (flash kernel, a third of it on zeros)."""
    def fn(q, k, v):
        pos = torch.arange(q.shape[2], device=q.device)[None]
        q2, k2 = enc.transform_qk(q, k, pos, pos)
        return F.scaled_dot_product_attention(q2, k2, F.pad(v, (0, q.shape[-1])), is_causal=True,
                                              scale=1 / math.sqrt(q.shape[-1]))[..., : v.shape[-1]]
    return fn


def rope_sdpa_baseline(enc):
    def fn(q, k, v):
        pos = torch.arange(q.shape[2], device=q.device)[None]
        q2, k2 = enc.transform_qk(q, k, pos, pos)
        return F.scaled_dot_product_attention(q2, k2, v, is_causal=True)
    return fn


def with_backend(enc, backend):
    """poskit.attention asked for one backend (the fused Triton kernels where `auto` takes another path)."""
    def fn(q, k, v):
        return poskit.attention(q, k, v, enc, is_causal=True, backend=backend)
    return fn


def without_kernel(enc):
    """poskit.attention with the compiled CPU kernel switched off (POSKIT_CPU_KERNEL=0): the path a machine without
    a compiler takes."""
    def fn(q, k, v):
        with cpu_flash.switched("0"):
            return poskit.attention(q, k, v, enc, is_causal=True)
    return fn


def machine(device: str = "cpu") -> str:
    """One line naming what the numbers were measured on."""
    from poskit.attention import kernel_build
    from poskit.cli.kernel import cpu_model

    gpu = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}), " if device == "cuda" else ""
    return (f"{gpu}{cpu_model()}, {os.cpu_count()} CPUs, instruction set {kernel_build.isa_level()}, torch "
            f"{torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
            f"{os.getloadavg()[0]:.1f} at the start")


def failures(runs: dict) -> dict:
    """{label: "failed: <error>"} for the runs whose one untimed call raises (a kernel that does not compile on
    this machine, say), so that the others are still measured."""
    failed = {}
    for label, run in runs.items():
        try:
            run()
        except Exception as e:  # any error: the row reports it
            first = (str(e).strip().splitlines() or [""])[-1][:160]
            failed[label] = f"failed: {type(e).__name__}: {first}"
            print(f"{label}: {failed[label]}", file=sys.stderr, flush=True)
    return failed


PEERS = ("pope: padded-v SDPA", "pope: PoPE-pytorch style", "pope: naive complex")


def est_reference_gb(B, H, T):
    return 6 * B * H * T * T * 8 / 2**30  # a handful of (B, H, T, T) temporaries


def bench_grid(args):
    H, D = args.H, args.D
    rows, peers = [], []  # peers: poskit's pope against the other PoPE implementations, same inputs
    names = poskit.available_encodings() if args.encodings == "all" else args.encodings.split(",")
    baseline = "RoPE+SDPA (baseline)"
    for B, T in args.shapes:
        for dname in args.dtypes:
            dtype = DTYPES[dname]
            for mode in args.modes:
                grad = mode == "fwdbwd"
                q, k, v = inputs(B, H, T, D, dtype, grad, args.device)
                cases = [(baseline, rope_sdpa_baseline(build("rope", H, D, dtype, device=args.device)), False)]
                for name in names:
                    enc = build(name, H, D, dtype, T, args.device)
                    absolute = enc.kind == "absolute"
                    if absolute:  # added to the embeddings: inside attention a model uses "none" (attention refuses it)
                        enc = build("none", H, D, dtype, device=args.device)
                    path = route(enc, q, k)
                    label = f"{name} [{path}]" + (" (= none in attention)" if absolute else "")
                    fn = (lambda enc: lambda q, k, v: poskit.attention(q, k, v, enc, is_causal=True))(enc)
                    # only the reference path is O(T^2) in memory (the blocked paths keep one query block's logits)
                    heavy = path == "reference" and est_reference_gb(B, H, T) > args.max_gb
                    cases.append((label, fn, heavy))
                    if args.without_kernel and path == "cpu-flash":
                        with cpu_flash.switched("0"):
                            off = route(enc, q, k)
                        heavy = off == "reference" and est_reference_gb(B, H, T) > args.max_gb
                        cases.append((f"{name}, POSKIT_CPU_KERNEL=0 [{off}]", without_kernel(enc), heavy))
                    if args.with_triton and path != "triton" and engine.triton_serves(enc):
                        cases.append((f"{name}, backend=triton [{route(enc, q, k, 'triton')}]",
                                      with_backend(enc, "triton"), False))
                if "pope" in names and not args.skip_peers:
                    pope = build("pope", H, D, dtype, device=args.device)
                    cases += [
                        ("pope: padded-v SDPA", pope_padded_sdpa(pope), False),
                        ("pope: PoPE-pytorch style", pope_pytorch_style(pope), est_reference_gb(B, H, T) / 3 > args.max_gb),
                        ("pope: naive complex", pope_naive_complex(pope), est_reference_gb(B, H, T) > args.max_gb),
                    ]
                once = {label: runner(fn, q, k, v, mode) for label, fn, heavy in cases if not heavy}
                failed = failures(once)  # a path that raises gets its error in the table, not the run's end
                runs = {label: runner(fn, q, k, v, mode, args.calls) for label, fn, heavy in cases
                        if not heavy and label not in failed}
                times = {label: ms / args.calls for label, ms in
                         interleaved_medians(runs, rounds=args.repeats, warmup=args.warmup).items()}
                peaks = {label: allocator_peak_bytes(once[label], args.device) / 2**20 for label in runs}
                for label, fn, heavy in cases:
                    if heavy:
                        rows.append(dict(B=B, T=T, dtype=dname, mode=mode, path=label, ms="skipped (memory)",
                                         peak_MB=f"~{est_reference_gb(B, H, T) * 1024:.0f} (estimated)"))
                        continue
                    if label in failed:
                        rows.append(dict(B=B, T=T, dtype=dname, mode=mode, path=label, ms=failed[label]))
                        print(rows[-1], file=sys.stderr, flush=True)
                        continue
                    rows.append(dict(B=B, T=T, dtype=dname, mode=mode, path=label, ms=f"{times[label]:.1f}",
                                     ratio=f"{times[label] / times[baseline]:.2f}", peak_MB=f"{peaks[label]:.0f}",
                                     mem_ratio=f"{peaks[label] / max(peaks[baseline], 1e-9):.2f}"))
                    print(rows[-1], file=sys.stderr, flush=True)
                pope_ms = next((ms for label, ms in times.items() if label.startswith("pope [")), None)
                for label in PEERS:
                    if pope_ms is not None and label in times:
                        peers.append(dict(B=B, T=T, dtype=dname, mode=mode, peer=label, peer_ms=f"{times[label]:.1f}",
                                          pope_ms=f"{pope_ms:.1f}", speedup=f"{times[label] / pope_ms:.2f}x"))
    return rows, peers


class CartesianCacheDecode:
    """PoPE decode against a cache of 2d-wide Cartesian keys mu_k [cos(s theta), sin(s theta)] (what poskit
    could cache instead of magnitudes): the form the magnitude cache is measured against, built from poskit's
    own pieces (same preallocated cache, the blocked path), exact."""

    def __init__(self, enc, k, v, positions, capacity):
        self.enc, self.cache = enc, KVCache(num_layers=1, max_length=capacity)
        self.cache.append(0, enc.encode_k(k, positions[None]), v, positions, encoded=True)

    def __call__(self, q1, k1, v1, position):
        pos = position[None]
        layer = self.cache.append(0, self.enc.encode_k(k1, pos), v1, position, encoded=True)
        q2 = self.enc.encode_q(q1, pos, scale=1 / math.sqrt(q1.shape[-1]))
        return blocked_attention(q2, layer.keys, layer.values, scale=1.0, q_positions=pos,
                                 k_positions=layer.positions, causal=True)


KERNEL_OFF = ", POSKIT_CPU_KERNEL=0"  # a decode row's label ending so runs its steps with the kernel off


def decode_step(label, enc, q, k, v, room):
    """A function running one decode step at position L against L cached keys, rolled back after; the cache has
    room for `room` tokens after the L (generation's cache keeps room for the tokens still to come, so that its
    keys are a view with gaps between heads; room 1: the step fills the cache exactly)."""
    if label.endswith(KERNEL_OFF):
        step = decode_step(label[:-len(KERNEL_OFF)], enc, q, k, v, room)

        def without_kernel_step():
            with cpu_flash.switched("0"):
                step()
        return without_kernel_step
    L = k.shape[2]
    q1, k1, v1 = (t[:, :, :1].clone() for t in (q, k, v))
    new_position = torch.tensor([L], device=q.device)
    if label.endswith("Cartesian cache"):
        decode = CartesianCacheDecode(enc, k, v, torch.arange(L, device=q.device), L + room)

        def step():
            decode(q1, k1, v1, new_position)
            decode.cache.crop(L)
        return step
    cache = KVCache(num_layers=1, max_length=L + room)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(L, device=q.device))  # prefill

    def step():
        cached_attention(q1, k1, v1, enc, cache, 0, new_position)
        cache.crop(L)  # roll back so that every timed step sees L cached keys
    return step


def synchronized(step):
    """step, waiting for the device's queued kernels at its end (a no-op on the CPU)."""
    def run():
        step()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    return run


@contextlib.contextmanager
def recorded_paths():
    """The list of the paths poskit's planner chooses while inside (a decode step's plan is made inside
    cached_attention, after the append)."""

    seen, original = [], engine.plan_inputs

    def recording(*args, **kwargs):
        planned = original(*args, **kwargs)
        seen.append(planned.path)
        return planned
    engine.plan_inputs = recording
    try:
        yield seen
    finally:
        engine.plan_inputs = original


def bench_decode(args):
    """One decode step (one new token per sequence) against a cache of L keys: append + attend."""
    B, H, D = args.B, args.H, args.D
    rows = []
    forms = (("rope", "rope"), ("pope", "pope"), ("pope, Cartesian cache", "pope"), ("alibi", "alibi"),
             ("cope", "cope"))
    if args.without_kernel:  # the encodings whose decode step the kernel serves by default, with it off; RoPE's
        # is the speed goals' baseline (RoPE + SDPA) where this machine's calibration gives RoPE's step to the kernel
        forms += tuple((f"{name}{KERNEL_OFF}", name) for name in ("rope", "pope", "alibi", "cope"))
    for dname in args.decode_dtypes:
        dtype = DTYPES[dname]
        for L in args.decode_lengths:
            q, k, v = inputs(B, H, L, D, dtype, False, args.device)
            k, v = k[:, :args.decode_kv_heads].contiguous(), v[:, :args.decode_kv_heads].contiguous()
            with torch.no_grad():
                steps = {label: synchronized(decode_step(label, build(name, H, D, dtype, device=args.device), q, k, v,
                                                         args.decode_room))
                         for label, name in forms}
                paths = {}
                for label, step in steps.items():
                    with recorded_paths() as seen:
                        step()
                    paths[label] = seen[-1] if seen else "blocked"  # (the Cartesian cache calls the blocked path)
                times = interleaved_medians(steps, rounds=args.repeats * 5, warmup=3)
                peaks = {label: allocator_peak_bytes(step, args.device) / 2**20 for label, step in steps.items()}
            for label, _ in forms:
                ms = times[label]
                rows.append(dict(dtype=dname, cache=L, room=args.decode_room, kv_heads=args.decode_kv_heads,
                                 encoding=f"{label} [{paths[label]}]",
                                 ms_per_step=f"{ms:.3f}", tokens_per_s=f"{B / ms * 1000:.0f}",
                                 vs_rope=f"{times['rope'] / ms:.2f}x", peak_MB=f"{peaks[label]:.1f}"))
    return rows


def shapes(text: str) -> list[tuple[int, int]]:
    """"1x4096,8x1024" -> [(1, 4096), (8, 1024)]."""
    try:
        pairs = [tuple(int(n) for n in part.lower().split("x")) for part in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"--shapes takes BxT pairs like 1x4096,8x1024, got {text!r}")
    return pairs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--T", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024, 4096])
    p.add_argument("--shapes", type=shapes, default=None,
                   help="BxT pairs, comma-separated (1x4096,8x1024): the grid's shapes instead of --B times --T")
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["fp32", "bf16"])
    p.add_argument("--modes", type=lambda s: s.split(","), default=["fwd", "fwdbwd"])
    p.add_argument("--encodings", default="all", help="comma-separated names or 'all'")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-gb", type=float, default=6.0, help="skip materialising paths estimated above this")
    p.add_argument("--decode-lengths", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 8192])
    p.add_argument("--decode-dtypes", type=lambda s: s.split(","), default=["fp32", "bf16"])
    p.add_argument("--decode-room", type=int, default=1024,
                   help="tokens the cache has room for after the cached ones (generation keeps room for the tokens "
                        "still to come; 1: the step fills the cache exactly, as in measurements before 2026-11-27)")
    p.add_argument("--decode-kv-heads", type=int, default=None,
                   help="kv heads of the decode rows' cache, dividing --H (grouped-query attention: --H query heads "
                        "share them); default --H, no grouping")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the tensors live: cuda times poskit's GPU paths (the fused Triton kernels) against "
                        "RoPE + SDPA's flash kernel")
    p.add_argument("--calls", type=int, default=None,
                   help="calls per timed sample, the sample's time divided by it (default 1 on cpu, 20 on cuda, "
                        "where one call is too short to time alone)")
    p.add_argument("--warmup", type=int, default=1, help="untimed samples per path before the rounds (compilation, "
                   "autotuning, allocator)")
    p.add_argument("--without-kernel", action="store_true",
                   help="beside each row on the compiled CPU kernel (the default path where it serves), the same "
                        "encoding with it switched off (POSKIT_CPU_KERNEL=0: the path without a compiler); in the "
                        "decode table, RoPE's, PoPE's, ALiBi's and CoPE's steps")
    p.add_argument("--with-triton", action="store_true",
                   help="beside each row whose default path is not the fused Triton kernel of an encoding that has "
                        "one (PoPE's full sequences go to SDPA on CUDA), the same encoding with backend='triton'")
    p.add_argument("--cpu-kernel", action="store_true",
                   help="no effect (the compiled CPU kernel is the default now); accepted so older commands run")
    p.add_argument("--skip-peers", action="store_true", help="no rows of other PoPE implementations")
    p.add_argument("--skip-grid", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the tables as a benchmark document (docs/results/NAME/benchmark.json: "
                        "`poskit report` renders it where a docs page has a table=benchmark marker)")
    p.add_argument("--quick", action="store_true",
                   help="a check that every row runs, in about a minute: B=2, T=256, fp32, 1 round, decode at 256 keys "
                        "(overrides --B, --T, --dtypes, --repeats and the decode lengths/dtypes)")
    args, raw_argv, started, start = start_run(p, argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if args.with_triton:  # the engine's own refusal (no triton, CPU tensors without the interpreter), before measuring
        try:
            route(build("pope", 1, 64, torch.float32, device=args.device), torch.zeros(1, 1, 1, 64, device=args.device),
                  backend="triton")
        except ValueError as e:
            p.error(f"--with-triton: {e}")
    if args.calls is None:
        args.calls = 20 if args.device == "cuda" else 1
    for flag in ("calls", "repeats", "decode_room"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.decode_kv_heads is None:
        args.decode_kv_heads = args.H
    if args.decode_kv_heads < 1 or args.H % args.decode_kv_heads:
        p.error(f"--decode-kv-heads must be a positive divisor of --H ({args.H}), got {args.decode_kv_heads}")
    if args.quick:
        args.B, args.T, args.shapes, args.dtypes, args.repeats = 2, [256], None, ["fp32"], 1
        args.decode_lengths, args.decode_dtypes = [256], ["fp32"]
    if args.shapes is None:
        args.shapes = [(args.B, T) for T in args.T]
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# attention benchmark on {machine(args.device)}\n")
    print(f"# shapes (B, T) {args.shapes}, H={args.H} d={args.D}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, device {args.device}; medians of {args.repeats} interleaved rounds of {args.calls} call(s); glibc keeps freed memory (benchmarks/_harness.py)\n")
    grid_columns = ["B", "T", "dtype", "mode", "path", "ms", "ratio", "peak_MB", "mem_ratio"]
    peer_columns = ["B", "T", "dtype", "mode", "peer", "peer_ms", "pope_ms", "speedup"]
    decode_columns = ["dtype", "cache", "room", "kv_heads", "encoding", "ms_per_step", "tokens_per_s", "vs_rope",
                      "peak_MB"]
    parts = {}
    if not args.skip_grid:
        rows, peers = bench_grid(args)
        parts["attention"] = {"columns": grid_columns, "rows": rows}
        print(table(rows, grid_columns))
        print()
        if peers:
            parts["peers"] = {"columns": peer_columns, "rows": peers}
            print("## pope: poskit's path against other PoPE implementations (speedup = their time / poskit's)\n")
            print(table(peers, peer_columns))
            print()
    if not args.skip_decode:
        decode = bench_decode(args)
        parts["decode"] = {"columns": decode_columns, "rows": decode}
        print("## decode: one new token per sequence against a cache of `cache` keys with room for `room` more "
              "(append + attend; the path in brackets)\n")
        print(table(decode, decode_columns))
    if args.json:
        settings = {"shapes": [list(s) for s in args.shapes], "H": args.H, "D": args.D, "dtypes": args.dtypes,
                    "modes": args.modes, "encodings": args.encodings, "repeats": args.repeats,
                    "without_kernel": args.without_kernel, "decode_lengths": args.decode_lengths,
                    "decode_dtypes": args.decode_dtypes, "decode_room": args.decode_room,
                    "decode_kv_heads": args.decode_kv_heads, "device": args.device, "calls": args.calls,
                    "baseline": "RoPE+SDPA, same inputs, interleaved rounds"}
        write_results(args.json, "benchmarks/attention.py", raw_argv, settings, parts, started, start)


if __name__ == "__main__":
    keep_freed_memory()
    main()
