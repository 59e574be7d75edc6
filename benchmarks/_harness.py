"""Timing and peak-memory helpers shared by the benchmark scripts.

Times are medians over repeats (these machines are noisy). Peak memory is the allocator's high-water mark
during one call above what was allocated before it: on CUDA from torch.cuda.max_memory_allocated, on CPU
from the profiler's memory events (the resident set is no measure there: freed pages are kept or returned
at the allocator's whim). Every script prints ratios against a baseline measured in the same process.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch


# glibc hands large freed blocks back to the OS, so a path that allocates hundreds of MB per call pays page
# faults on every call: measured at B=8, H=8, T=1024, forward+backward, PoPE 1.48x -> 1.78x RoPE + SDPA and
# the CoPE reference 6.5x -> 27x, depending on what ran before. A training process reuses its memory; so
# that the benchmarks time the kernels and not the OS, glibc is told to keep freed memory.
_KEEP_FREED = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**36)}


def keep_freed_memory() -> None:
    """Re-run this script with glibc keeping freed memory (the settings must be set before the process starts)."""
    if any(os.environ.get(k) != v for k, v in _KEEP_FREED.items()):
        os.environ.update(_KEEP_FREED)
        os.execv(sys.executable, [sys.executable, *sys.argv])


def allocator_peak_bytes(fn, device: str = "cpu") -> int:
    """Bytes allocated at the peak of one call of fn() above what was allocated when it started."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    # "[memory]" instant events carry the allocator's running total; its rise above the first value is the peak
    mem = sorted((e["ts"], e["args"]["Total Allocated"], e["args"]["Bytes"]) for e in events
                 if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}))
    if not mem:
        return 0
    base = mem[0][1] - mem[0][2]
    return max(total for _, total, _ in mem) - base


def median_ms(fn, repeats: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def interleaved_medians(fns: dict, rounds: int = 3, warmup: int = 1) -> dict:
    """{label: median ms}, timing every fn once per round, round after round, so that a drift in the
    machine's speed (other tenants, clocks) hits all of them alike and their ratios stay meaningful."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - t)
    return {label: 1000 * statistics.median(ts) for label, ts in times.items()}


def measure(fn, repeats: int = 3, warmup: int = 1) -> tuple[float, float]:
    """(median ms, peak MB allocated by one call)."""
    ms = median_ms(fn, repeats, warmup)
    return ms, allocator_peak_bytes(fn) / 2**20


def table(rows: list[dict], columns: list[str]) -> str:
    """A markdown table."""
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    line = "| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |"
    sep = "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|"
    body = ["| " + " | ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def check_results_path(path) -> None:
    """Refuse a results path that could not be written: a directory, or a file under a directory that cannot be
    made or written (training.files.check_writable_dir). Creates nothing."""
    from pathlib import Path

    from poskit.training.files import check_writable_dir

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory; give a file path such as docs/results/NAME/benchmark.json")
    check_writable_dir(path.parent, "its directory")


def start_run(parser, argv) -> tuple:
    """(args, the argv as typed, start time, start state) for a benchmark script's main: the code and load are
    recorded as the measurement starts, not as it ends, and a --json path that cannot be written is refused
    before any measuring, not after it."""
    started = time.perf_counter()
    from poskit.report.benchmark import start_state

    start = start_state()
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if getattr(args, "json", None):
        try:
            check_results_path(args.json)
        except ValueError as e:
            parser.error(f"--json: {e}")
    return args, raw_argv, started, start


def write_results(path, script: str, argv: list[str], settings: dict, parts: dict, started: float,
                  start: dict) -> None:
    """Write the benchmark document (poskit.report.benchmark) of this run to `path`: the command as typed (paths
    under the working directory made relative), the machine with its instruction set, threads and load at the
    start, the settings and every table part ({name: {"columns": [...], "rows": [...]}}); `poskit report` renders
    it where docs carry a `table=benchmark` marker. `start`: poskit.report.benchmark.start_state() of the run's
    start, so that the code and load recorded are those measured."""
    from poskit.attention import kernel_build
    from poskit.report.benchmark import new_document, write_document
    from poskit.report.record import portable_command

    doc = new_document(portable_command(["python", script, *argv]), settings, parts,
                       threads=torch.get_num_threads(), isa=kernel_build.isa_level(),
                       wall_seconds=time.perf_counter() - started, start=start)
    print(f"wrote {write_document(path, doc)}", file=sys.stderr)
