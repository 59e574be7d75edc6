"""KERPLE (Chi et al. 2022): kernelized relative positional embedding. A conditionally positive definite kernel of
the distance, with two positive learned parameters per head, is added to the logits: the log kernel
-r1 log(1 + r2 |m - n|) ("kerple-log") or the power kernel -r1 |m - n|^r2 with r2 <= 2 ("kerple-power").
"""
from __future__ import annotations

import torch
from torch import nn

from ..util.validate import check_real
from .alibi import bias_dtype, distance
from .base import PositionalEncoding, register
from .kernel_bias import KernelBias, distance_span, distances

KERNELS = ("log", "power")
POWER_MAX = 2.0  # |m - n|^p is conditionally positive definite for 0 < p <= 2 only


class KerpleBias(PositionalEncoding):
    """KERPLE: logit(m, n) = scale * q_m . k_n + k_h(|m - n|) with a per-head kernel

    log:   k(d) = -r1 log(1 + r2 d)      (r1, r2 > 0; "kerple-log")
    power: k(d) = -r1 d^r2               (r1 > 0, 0 < r2 <= 2; "kerple-power")

    r1 and r2 are learned, one of each per head, and kept in the paper's set as its released code keeps them:
    projected into [eps, inf) (r2 of the power kernel: [eps, 2]) when built and after every optimizer step
    (encodings/projection.py), and clamped into it in the forward pass. Initialisation as the released code:
    log: r1 ~ U(0, 2), r2 ~ U(0, 1); power: r1 ~ U(0, 1), r2 ~ U(0, 2), before the projection. The bias
    reads positions alone; it takes the blocked learned-bias path on CPU.

    Paper: Chi, Fan, Ramadge, Rudnicky, "KERPLE: Kernelized Relative Positional Embedding for Length
    Extrapolation" (arXiv 2205.09921: the power and logarithmic variants of its kernelized bias;
    initialisation and eps = 0.01 from its released code, github.com/chijames/KERPLE).

    Options (defaults):
        kernel: 'log' or 'power', fixed by the registered name (kerple-log, kerple-power).
        eps=0.01: the lower bound of r1 and r2.
    """
    kind = "bias"
    bias_reads_q = False  # a function of positions: q is not read

    def __init__(self, *, head_dim: int, num_heads: int, kernel: str = "log", eps: float = 0.01):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.eps = check_real(eps, "eps", minimum=0, strict=True)
        if kernel == "power" and self.eps > POWER_MAX:
            raise ValueError(f"eps must be <= {POWER_MAX} for the power kernel (r2 lies in [eps, 2]), got {eps}")
        r1_span, r2_span = (2.0, 1.0) if kernel == "log" else (1.0, POWER_MAX)
        self.r1 = nn.Parameter(torch.rand(num_heads) * r1_span)
        self.r2 = nn.Parameter(torch.rand(num_heads) * r2_span)
        self.project_parameters_()

    @property
    def r2_max(self) -> float | None:
        return POWER_MAX if self.kernel == "power" else None

    def project_parameters_(self) -> None:
        """Put r1 and r2 back into their sets, in place (after each optimizer step; idempotent)."""
        with torch.no_grad():
            self.r1.clamp_(min=self.eps)
            self.r2.clamp_(min=self.eps, max=self.r2_max)

    def bias(self, q, q_positions, k_positions, scale):
        dtype = bias_dtype(q.dtype)
        d = distance(q_positions, k_positions).abs().to(dtype)  # (1|B, 1, Tq, Tk)
        return self._kernel_of(d, (-1, 1, 1))  # (1|B, H, Tq, Tk)

    def _kernel_of(self, d: torch.Tensor, shape: tuple) -> torch.Tensor:
        """The per-head kernel of the absolute distances d (float), r1 and r2 viewed as `shape` (heads first)
        to broadcast against d."""
        r1 = self.r1.to(d.dtype).clamp(min=self.eps).view(shape)
        r2 = self.r2.to(d.dtype).clamp(min=self.eps, max=self.r2_max).view(shape)
        if self.kernel == "log":
            return -r1 * torch.log1p(r2 * d)
        return -r1 * d.pow(r2)

    def kernel_bias(self, q_positions, k_positions):
        """The kernel of every distance t - s that occurs (encodings/kernel_bias.py): (H, R)."""
        span = distance_span(q_positions, k_positions)
        if span is None:
            return None
        d = distances(*span, q_positions.device).abs().to(torch.float32)
        return KernelBias("distance_table", self._kernel_of(d, (-1, 1)).contiguous(), span[0])

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kernel={self.kernel!r}, eps={self.eps}"


for _kernel in KERNELS:
    register(f"kerple-{_kernel}", kernel=_kernel)(KerpleBias)
