"""Timing the compiled CPU kernel one way against another in one process, shared by the machine's calibration
(kernel_calibration, `poskit kernel calibrate`) and benchmarks/kernel_tiles.py.

A timer is run(choice) -> seconds of one call made the chosen way (a query-tile height, bf16 products on or off,
the kernel on or off); `interleaved` runs every choice once per round, the order reversed every other round, so
that a drift in the machine's speed between rounds falls on every choice alike.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable

import torch


def _causal_inputs(B: int, T: int, E: int, H: int, Dv: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, H, T, E, generator=g).to(dtype).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(B, H, T, Dv, generator=g).to(dtype)
    return q, k, v, grad, torch.arange(T)[None]


def _timed_backward(forward: Callable[[], torch.Tensor], grad: torch.Tensor, leaves) -> float:
    """Seconds of forward() (untimed where it returns an output computed before) and its backward; the leaves'
    gradients cleared after."""
    started = time.perf_counter()
    forward().backward(grad)
    elapsed = time.perf_counter() - started
    for x in leaves:
        x.grad = None
    return elapsed


def backward_timer(B: int, T: int, E: int, *, H: int = 8, Dv: int = 64) -> Callable[[int], float]:
    """run(tile) -> seconds of one causal fp32 backward of the kernel at (B, H, T) with q/k width E and value
    width Dv, its backward on `tile`-row query tiles. Only the backward is timed: the forward runs with the default
    tile (its output and logsumexp do not depend on the tiling), and the tile under test goes to the backward alone."""
    from . import cpu_flash

    q, k, v, grad, positions = _causal_inputs(B, T, E, H, Dv, torch.float32)

    def run(tile: int) -> float:
        out = cpu_flash.cpu_flash_attention(q, k, v, scale=E ** -0.5, q_positions=positions, k_positions=positions,
                                            causal=True, block_q_backward=tile)
        return _timed_backward(lambda: out, grad, (q, k, v))
    return run


def products_timer(B: int, T: int, E: int, *, H: int = 8, Dv: int = 64) -> Callable[[bool], float]:
    """run(products) -> seconds of one causal bf16 forward + backward of the kernel at (B, H, T), q/k width E,
    value width Dv, with its bf16 products (True) or bf16 widened to fp32 (False)."""
    from . import cpu_flash

    q, k, v, grad, positions = _causal_inputs(B, T, E, H, Dv, torch.bfloat16)

    def run(products: bool) -> float:
        return _timed_backward(lambda: cpu_flash.cpu_flash_attention(
            q, k, v, scale=E ** -0.5, q_positions=positions, k_positions=positions, causal=True,
            bf16_products=products), grad, (q, k, v))
    return run


def interleaved(run: Callable[[Hashable], float], choices: list, rounds: int) -> dict:
    """Each choice's times over `rounds` rounds (after one warm-up call each), the order reversed every other
    round."""
    for choice in choices:
        run(choice)
    times = {choice: [] for choice in choices}
    for r in range(rounds):
        for choice in (choices if r % 2 == 0 else choices[::-1]):
            times[choice].append(run(choice))
    return times


def medians_ms(times: dict) -> dict:
    return {choice: 1000 * statistics.median(ts) for choice, ts in times.items()}
