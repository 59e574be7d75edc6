"""Legendre-polynomial absolute encoding (Aggarwal, eq. 14): PE(pos, i) = P_pos(x_i), x_i = linspace(-1, 1, dim).

P_n is evaluated by Bonnet's recurrence (n+1) P_{n+1} = (2n+1) x P_n - n P_{n-1} in float64, which is
forward-stable on [-1, 1]: values stay bounded by 1 for any degree. Rows up to `cache_rows` are kept.
Higher positions cost O(1) each, whatever the position: P_n(+-1) = (+-1)^n exactly, and at interior points
Stieltjes' series in theta = arccos(x) (Szego, Orthogonal Polynomials, eq. 8.21.14), which needs only a few
terms once 2 n sin(theta) >= STIELTJES_MIN; the rare pairs below that (degrees < STIELTJES_MIN / (2 sin theta))
continue the recurrence.
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


def recurrence_rows(degrees: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P_n(x) for each n in `degrees` by Bonnet's recurrence, without storing the rows in between (O(max n))."""
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


# The series' term ratio is about (m + 1) / (2 n sin(theta)): from 64 on, STIELTJES_TERMS terms reach 1e-18.
STIELTJES_MIN = 64.0
STIELTJES_TERMS = 24


def _gamma_ratio(n: np.ndarray) -> np.ndarray:
    """Gamma(n + 1) / Gamma(n + 3/2) for n >= 31 without cancelling lgamma's (O(n log n)-sized) values:
    Stirling's series for the difference, with z * log1p(1 / (2z)) in place of z ln(z + 1/2) - z ln z."""
    z = n.astype(np.float64) + 1.0
    w = z + 0.5
    log_ratio = (-0.5 * np.log(z) - z * np.log1p(0.5 / z) + 0.5
                 + (1 / z - 1 / w) / 12 - (1 / z**3 - 1 / w**3) / 360 + (1 / z**5 - 1 / w**5) / 1260)
    return np.exp(log_ratio)


def stieltjes_rows(degrees: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P_n(x) for degrees n (N,) >= 31 and interior x (dim,) with 2 n sin(theta) >= STIELTJES_MIN: (N, dim).

    P_n(cos t) = (4/pi) C_n sum_m a_m cos((n + m + 1/2) t - (m + 1/2) pi/2) / (2 sin t)^(m + 1/2), with
    C_n = 4^n n!^2 / (2n + 1)! = (sqrt(pi)/2) Gamma(n+1)/Gamma(n+3/2) and a_m = (1/2)_m^2 / (m! (n + 3/2)_m).
    The phase (n + 1/2) t is taken in long double: at n = 1e9 a float64 t would already be off by ~1e-7 rad.
    The terms then turn by the same angle t - pi/2 each, a float64 complex multiply.
    """
    n = degrees.astype(np.float64)[:, None]  # (N, 1)
    t_long = np.arccos(x.astype(np.longdouble))[None, :]
    pi_long = np.arccos(np.longdouble(-1))
    phase = (degrees.astype(np.longdouble)[:, None] + np.longdouble(0.5)) * t_long - pi_long / 4
    rot = np.cos(phase).astype(np.float64) + 1j * np.sin(phase).astype(np.float64)  # exp(i phase_0)
    t = t_long.astype(np.float64)
    turn = np.exp(1j * (t - np.pi / 2))  # phase_{m+1} - phase_m
    two_sin = 2 * np.sin(t)
    coef = np.ones_like(n)  # a_m / (2 sin t)^m
    total = np.zeros((degrees.size, x.size))
    for m in range(STIELTJES_TERMS):
        total += coef * rot.real
        coef = coef * ((m + 0.5) ** 2 / ((m + 1) * (n + 1.5 + m))) / two_sin
        rot = rot * turn
    c_n = 0.5 * np.sqrt(np.pi) * _gamma_ratio(degrees)[:, None]
    return (4 / np.pi) * c_n * total / np.sqrt(two_sin)


def legendre_rows(degrees: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P_n(x) for each n in `degrees` (any shape, int), at the points x (dim,): (*degrees.shape, dim) float64.

    O(1) per degree where Stieltjes' series converges fast, the recurrence (up to the largest such degree) for
    the remaining pairs near the ends of [-1, 1], and the closed forms P_n(1) = 1, P_n(-1) = (-1)^n.
    """
    flat = np.asarray(degrees, dtype=np.int64).reshape(-1)
    out = np.empty((flat.size, x.size), dtype=np.float64)
    ends = np.abs(x) == 1.0
    out[:, ends] = np.where(x[ends] > 0, 1.0, np.where(flat % 2 == 0, 1.0, -1.0)[:, None])
    inner = np.flatnonzero(~ends)
    # 2 n sin(theta) = 2 n sqrt(1 - x^2) against the threshold: which (degree, point) pairs the series serves
    # (the threshold implies n >= 32, where _gamma_ratio is accurate)
    series = 2.0 * flat[:, None] * np.sqrt(1.0 - x[inner] ** 2)[None, :] >= STIELTJES_MIN
    rows = np.flatnonzero(series.any(1))
    if rows.size:
        out[np.ix_(rows, inner)] = stieltjes_rows(flat[rows], x[inner])
    rest_rows = np.flatnonzero((~series).any(1))
    if rest_rows.size:  # degrees below STIELTJES_MIN / (2 sin theta) for some point: bounded by the grid's ends
        slow = recurrence_rows(flat[rest_rows], x[inner])
        keep = ~series[rest_rows]
        block = out[np.ix_(rest_rows, inner)]
        block[keep] = slow[keep]
        out[np.ix_(rest_rows, inner)] = block
    return out.reshape(*np.shape(degrees), x.size)


@register("legendre")
class LegendreEncoding(PositionalEncoding):
    """Legendre-polynomial absolute positions added to the token embeddings.

    PE(pos, i) = P_pos(x_i), x_i equally spaced in [-1, 1] (dim points), P_n the Legendre polynomial of degree n.

    Paper: Aggarwal, "PoPE: Legendre Orthogonal Polynomials Based Position Encoding" (eq. 14); named
    "legendre" in poskit, since "pope" is the polar method.

    Options (defaults):
        dim (required): the model width.
        cache_rows=8192: degrees kept in a precomputed table; higher ones are evaluated on demand.
    """
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
