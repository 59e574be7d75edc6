"""Timing the compiled CPU kernel's backward at one query-tile height against another, shared by the machine's
calibration (kernel_calibration, `poskit kernel calibrate`) and benchmarks/kernel_tiles.py.

Only the backward is timed: the forward runs with the default tile (its output and logsumexp do not depend on the
tiling), and the tile under test is handed to the backward alone. Rounds alternate the tiles' order, so that a
drift in the machine's speed between rounds falls on every tile alike.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def backward_timer(B: int, T: int, E: int, *, H: int = 8, Dv: int = 64) -> Callable[[int], float]:
    """run(tile) -> seconds of one causal backward of the kernel at (B, H, T) with q/k width E and value width
    Dv, its backward on `tile`-row query tiles."""
    from . import cpu_flash

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, H, T, E, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g).requires_grad_()
    grad = torch.randn(B, H, T, Dv, generator=g)
    positions = torch.arange(T)[None]

    def run(tile: int) -> float:
        out = cpu_flash.cpu_flash_attention(q, k, v, scale=E ** -0.5, q_positions=positions, k_positions=positions,
                                            causal=True, block_q_backward=tile)
        started = time.perf_counter()
        out.backward(grad)
        elapsed = time.perf_counter() - started
        for x in (q, k, v):
            x.grad = None
        return elapsed
    return run


def interleaved(run: Callable[[int], float], tiles: list[int], rounds: int) -> dict[int, list[float]]:
    """Each tile's times over `rounds` rounds (after one warm-up call each), the order reversed every other round."""
    for tile in tiles:
        run(tile)
    times = {tile: [] for tile in tiles}
    for r in range(rounds):
        for tile in (tiles if r % 2 == 0 else tiles[::-1]):
            times[tile].append(run(tile))
    return times


def medians_ms(times: dict[int, list[float]]) -> dict[int, float]:
    return {tile: 1000 * statistics.median(ts) for tile, ts in times.items()}
