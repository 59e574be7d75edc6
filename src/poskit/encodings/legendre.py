"""Legendre-polynomial absolute encoding (Aggarwal, eq. 14): PE(pos, i) = P_pos(x_i), x_i = linspace(-1, 1, dim).

P_n is evaluated by Bonnet's recurrence (n+1) P_{n+1} = (2n+1) x P_n - n P_{n-1} in float64, which is
forward-stable on [-1, 1]: values stay bounded by 1 for any degree. Rows up to `cache_rows` are kept;
higher positions are computed on demand by continuing the recurrence (O(max position) time, O(dim) memory).
"""
from __future__ import annotations

import numpy as np
import torch

from .absolute import check_embed_positions
from .base import PositionalEncoding, register


def legendre_table(max_degree: int, x: np.ndarray) -> np.ndarray:
    """P_0..P_max_degree evaluated at x, shape (max_degree + 1, len(x)), float64."""
    out = np.empty((max_degree + 1, x.size), dtype=np.float64)
    out[0] = 1.0
    if max_degree >= 1:
        out[1] = x
    for n in range(1, max_degree):
        out[n + 1] = ((2 * n + 1) * x * out[n] - n * out[n - 1]) / (n + 1)
    return out


def legendre_rows(degrees: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P_n(x) for each n in `degrees`, without storing the rows in between."""
    want = {int(d) for d in np.unique(degrees)}
    rows: dict[int, np.ndarray] = {}
    prev, cur = np.ones_like(x), x.copy()
    if 0 in want:
        rows[0] = prev.copy()
    if 1 in want:
        rows[1] = cur.copy()
    for n in range(1, int(degrees.max())):
        prev, cur = cur, ((2 * n + 1) * x * cur - n * prev) / (n + 1)
        if n + 1 in want:
            rows[n + 1] = cur.copy()
    return np.stack([rows[int(d)] for d in degrees.reshape(-1)]).reshape(*degrees.shape, x.size)


@register("legendre")
class LegendreEncoding(PositionalEncoding):
    kind = "absolute"

    def __init__(self, *, head_dim: int, num_heads: int, dim: int, cache_rows: int = 8192):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if dim < 2:  # an int >= 1 already (build_encoding); linspace(-1, 1, 1) would not reach +1
            raise ValueError(f"dim must be an int >= 2 for the legendre encoding, got {dim!r}")
        self.dim = dim
        self.x = np.linspace(-1.0, 1.0, dim)
        self._cache = torch.from_numpy(legendre_table(cache_rows - 1, self.x))  # (cache_rows, dim) float64

    def embed_float64(self, positions) -> torch.Tensor:
        positions = check_embed_positions(positions)
        flat = positions.reshape(-1).cpu()
        out = torch.empty(flat.numel(), self.dim, dtype=torch.float64)
        cached = flat < self._cache.shape[0]
        out[cached] = self._cache[flat[cached]]
        if (~cached).any():
            out[~cached] = torch.from_numpy(legendre_rows(flat[~cached].numpy(), self.x))
        return out.reshape(*positions.shape, self.dim).to(positions.device)

    def embed(self, positions) -> torch.Tensor:
        return self.embed_float64(positions).float()
