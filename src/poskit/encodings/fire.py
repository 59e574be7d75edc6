"""FIRE (Li et al. 2023): functional interpolation for relative positions. An MLP maps the log-transformed
distance, normalised by the log-transformed query position, to one logit bias per head.

The normaliser is thresholded: queries at positions up to L share one normaliser psi(L), so there the bias
depends on the distance alone (shift-invariant); past L the same distance maps to a smaller input, which is
how FIRE interpolates to lengths it was not trained on (progressive interpolation).
"""
from __future__ import annotations

import torch
from torch import nn

from ..util.validate import check_int, check_real
from .alibi import bias_dtype, distance
from .base import PositionalEncoding, register
from .dynamic import DistanceMLP, heads_first
from .kernel_bias import KernelBias, distance_span, distances


@register("fire")
class FIREBias(PositionalEncoding):
    """FIRE: logit(i, j) = scale * q_i . k_j + f_theta(psi(|i - j|) / (psi(max(L, i)) + eps))_h.

    psi(x) = log(|c x| + 1) with c learned; L = |l * threshold_init| with the multiplier l learned (initially
    1); f_theta: Linear(1, mlp_width), ReLU, Linear(mlp_width, num_heads), one output per head. i is the
    query's position and j the key's. The paper states FIRE for causal attention (i >= j); its listing takes
    |i - j|, which is used here for keys after the query too. The bias reads positions alone; it takes the
    blocked learned-bias path on CPU.

    Paper: Li, You, Guruganesh, Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar, Bhojanapalli, "Functional
    Interpolation for Relative Positions Improves Long Context Transformers" (arXiv 2310.04418: the FIRE bias
    with the log transform psi and the thresholded normaliser; defaults from its reference listing:
    mlp_width 32, c = 0.1, L = 512 with a learned multiplier, eps = 1e-6).

    Options (defaults):
        mlp_width=32: the hidden width of f_theta.
        c_init=0.1: the initial c of the log transform psi(x) = log(|c x| + 1).
        threshold_init=512.0: the initial threshold L (queries before L share the normaliser psi(L)).
        eps=1e-06: added to the normaliser.
    """
    kind = "bias"
    bias_reads_q = False  # a function of positions: q is not read

    def __init__(self, *, head_dim: int, num_heads: int, mlp_width: int = 32, c_init: float = 0.1,
                 threshold_init: float = 512.0, eps: float = 1e-6):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        self.mlp_width = check_int(mlp_width, "mlp_width", minimum=1)
        c_init = check_real(c_init, "c_init", minimum=0, strict=True)
        self.threshold_init = check_real(threshold_init, "threshold_init", minimum=0)
        self.eps = check_real(eps, "eps", minimum=0, strict=True)  # > 0: psi(max(L, i)) is 0 at L = 0, i <= 0
        self.c = nn.Parameter(torch.tensor(c_init))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # L = |threshold_scale * threshold_init|
        self.mlp = DistanceMLP(self.mlp_width, 1, num_heads, "relu")

    def normalised_distance(self, q_positions, k_positions, dtype) -> torch.Tensor:
        """psi(|i - j|) / (psi(max(L, i)) + eps) for every pair: (1|B, 1, Tq, Tk) in dtype."""
        c = self.c.to(dtype)
        threshold = (self.threshold_scale.to(dtype) * self.threshold_init).abs()
        near = torch.log1p((c * distance(q_positions, k_positions).abs().to(dtype)).abs())
        reach = torch.log1p((c * torch.maximum(q_positions.to(dtype), threshold)).abs()) + self.eps  # (1|B, Tq)
        return near / reach[:, None, :, None]

    def bias(self, q, q_positions, k_positions, scale):
        return heads_first(self.mlp(self.normalised_distance(q_positions, k_positions, bias_dtype(q.dtype))))

    def kernel_bias(self, q_positions, k_positions):
        """A table over the distances t - s (encodings/kernel_bias.py) while every query is at or before the
        threshold L: there psi(max(L, i)) is psi(L) for all of them, so the bias is a function of the distance
        alone, computed here by the same formula for a query at position 0. Past L the normaliser differs per
        query and no per-distance table is exact: None (the blocked path)."""
        span = distance_span(q_positions, k_positions)
        if span is None:
            return None
        dtype = torch.float32
        threshold = (self.threshold_scale.to(dtype) * self.threshold_init).abs()
        if not bool((q_positions.to(dtype) <= threshold).all()):
            return None
        d = distances(*span, q_positions.device)
        origin = torch.zeros(1, 1, dtype=d.dtype, device=d.device)
        x = self.normalised_distance(origin, -d[None], dtype)  # (1, 1, 1, R): distance 0 - (-d) = d
        return KernelBias("distance_table", heads_first(self.mlp(x))[0, :, 0].contiguous(), span[0])

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mlp_width={self.mlp_width}, threshold_init={self.threshold_init}"
