"""Running independent jobs (one training run each) as parallel single-thread processes.

On a small CPU, N single-thread processes beat one N-thread process for small models: the matrices are too
small for intra-op threading to pay off, and the runs stay deterministic whatever the machine's core count.
Processes are started with "spawn" so that no parent state (threads, RNG) leaks into them.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Callable


def _single_thread() -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def check_workers(workers, name: str = "workers") -> None:
    """Callers check `workers` before they create directories; run_parallel checks again for direct use."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"{name} must be a positive int (or unset: the CPU count), got {workers!r}")


def run_parallel(fn: Callable, jobs: list, workers: int | None = None, labels: list[str] | None = None,
                 quiet: bool = False) -> list:
    """Call `fn(job)` for every job record (picklable: see jobs.py), at most `workers` at a time, each in its
    own single-thread process; results in job order. With workers == 1 the jobs run in this process (still
    single-threaded)."""
    check_workers(workers)
    workers = default_workers() if workers is None else workers
    labels = labels or [str(i) for i in range(len(jobs))]
    results: list = [None] * len(jobs)
    t0 = time.perf_counter()

    def report(i):
        if not quiet:
            print(f"  [{sum(r is not None for r in results)}/{len(jobs)}] {labels[i]} done "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    if workers == 1 or len(jobs) == 1:
        import torch

        threads = torch.get_num_threads()
        _single_thread_intra(1)
        try:
            for i, job in enumerate(jobs):
                results[i] = fn(job)
                report(i)
        finally:
            _single_thread_intra(threads)
        return results
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn"),
                             initializer=_single_thread) as pool:
        pending: dict[Future, int] = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                results[i] = fut.result()  # re-raises a worker's exception here
                report(i)
    return results


def _single_thread_intra(n: int) -> None:
    import torch

    torch.set_num_threads(n)
