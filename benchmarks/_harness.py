"""Timing and peak-memory helpers shared by the benchmark scripts.

Times are medians over repeats (these machines are noisy); peak memory is the growth of the process's
resident set during the call, sampled by a background thread (torch ops release the GIL), which is what
a CPU user actually pays. Every script prints ratios against a baseline measured in the same process.
"""
from __future__ import annotations

import gc
import os
import statistics
import threading
import time

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakRSS:
    """Context manager: .peak_mb is the largest RSS growth seen while the block ran."""

    def __init__(self, interval: float = 0.0005):
        self.interval, self.peak_mb = interval, 0.0

    def __enter__(self):
        gc.collect()
        self.base = rss_bytes()
        self.peak = self.base
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.peak_mb = (self.peak - self.base) / 2**20


def median_ms(fn, repeats: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def measure(fn, repeats: int = 3, warmup: int = 1) -> tuple[float, float]:
    """(median ms, peak MB of one call)."""
    ms = median_ms(fn, repeats, warmup)
    with PeakRSS() as peak:
        fn()
    return ms, peak.peak_mb


def table(rows: list[dict], columns: list[str]) -> str:
    """A markdown table."""
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    line = "| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |"
    sep = "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|"
    body = ["| " + " | ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) + " |" for r in rows]
    return "\n".join([line, sep, *body])
