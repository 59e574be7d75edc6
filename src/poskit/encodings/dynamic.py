"""Dynamic position bias: an MLP maps the relative distance to one logit bias per head (x-transformers'
DynamicPositionBias; the 1-D form of Swin Transformer V2's continuous position bias with log-spaced
distances). `DistanceMLP`, the scalar-to-heads MLP, is shared with FIRE (encodings/fire.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..util.validate import check_int
from .alibi import bias_dtype, distance
from .base import PositionalEncoding, register
from .kernel_bias import KernelBias, distance_span

ACTIVATIONS = {"relu": F.relu, "silu": F.silu}


class DistanceMLP(nn.Module):
    """x (...) -> (..., out): Linear(1, width), activation, (depth - 1) x [Linear(width, width), activation],
    Linear(width, out). Plain parameters rather than nn.Linear modules, so that a model's initialisation of its
    own Linear layers leaves them alone; each is initialised as nn.Linear does, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    for weights and biases (the peers' MLPs are nn.Linear)."""

    def __init__(self, width: int, depth: int, out: int, activation: str):
        super().__init__()
        sizes = [1] + [width] * depth + [out]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(fan_out, fan_in).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(fan_out).uniform_(-bound, bound)))
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.unsqueeze(-1)
        last = len(self.weights) - 1
        for n, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = F.linear(h, w.to(h.dtype), b.to(h.dtype))
            if n < last:
                h = ACTIVATIONS[self.activation](h)
        return h

    def extra_repr(self) -> str:
        return f"sizes={[1] + [w.shape[0] for w in self.weights]}, activation={self.activation!r}"


def heads_first(values: torch.Tensor) -> torch.Tensor:
    """(1|B, 1, Tq, Tk, H) per-pair MLP outputs -> the (1|B, H, Tq, Tk) bias."""
    return values.squeeze(1).permute(0, 3, 1, 2)


@register("dynamic")
class DynamicPositionBias(PositionalEncoding):
    """Dynamic position bias: logit(t, s) = scale * q_t . k_s + f(x(t - s))_h, f an MLP from one number to one
    bias per head.

    f: Linear(1, hidden), SiLU, (depth - 1) x [Linear(hidden, hidden), SiLU], Linear(hidden, num_heads), applied
    to the signed distance x = t - s, or with log_distance=True to sign(t - s) log(1 + |t - s|) (SwinV2's
    log-spaced coordinates in one dimension). The MLP is evaluated once per distinct distance that
    occurs and gathered, as x-transformers does. The bias reads positions alone; it takes the blocked
    learned-bias path on CPU.

    Paper: x-transformers' DynamicPositionBias (Wang, github.com/lucidrains/x-transformers), after Liu, Hu, Lin,
    Yao, Xie, Wei, Ning, Cao, Zhang, Dong, Wei, Guo, "Swin Transformer V2: Scaling Up Capacity and Resolution"
    (arXiv 2111.09883, section 3.3, continuous relative position bias with log-spaced coordinates).

    Options (defaults):
        hidden=None: the MLP width; None is num_heads * head_dim // 4 (x-transformers' dim // 4 for a model
            width of num_heads * head_dim).
        depth=2: the number of hidden layers (x-transformers' default).
        log_distance=False: feed sign(d) log(1 + |d|) instead of the distance d itself.
    """
    kind = "bias"
    bias_reads_q = False  # a function of positions: q is not read

    def __init__(self, *, head_dim: int, num_heads: int, hidden: int | None = None, depth: int = 2,
                 log_distance: bool = False):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        hidden = max(1, num_heads * head_dim // 4) if hidden is None else check_int(hidden, "hidden", minimum=1)
        self.depth = check_int(depth, "depth", minimum=1)
        self.hidden, self.log_distance = hidden, bool(log_distance)
        self.mlp = DistanceMLP(hidden, self.depth, num_heads, "silu")

    def features(self, d: torch.Tensor) -> torch.Tensor:
        """The MLP's input for the signed distances d (float)."""
        return torch.sign(d) * torch.log1p(d.abs()) if self.log_distance else d

    def bias(self, q, q_positions, k_positions, scale):
        dtype = bias_dtype(q.dtype)
        d = distance(q_positions, k_positions)  # (1|B, 1, Tq, Tk) int64
        if d.numel() == 0:
            return torch.zeros(*d.shape[:1], self.num_heads, *d.shape[2:], dtype=dtype, device=d.device)
        lo, hi = int(d.min()), int(d.max())
        if hi - lo + 1 <= d.numel():  # the MLP once per distance in [lo, hi], then gathered per pair
            return heads_first(self.table(lo, hi, dtype, d.device)[d - lo])
        # (positions so sparse that the range of distances outnumbers the pairs: per pair instead)
        return heads_first(self.mlp(self.features(d.to(dtype))))

    def table(self, lo: int, hi: int, dtype, device) -> torch.Tensor:
        """(R, H): the MLP's bias for each distance lo..hi."""
        return self.mlp(self.features(torch.arange(lo, hi + 1, device=device).to(dtype)))

    def kernel_bias(self, q_positions, k_positions):
        """The MLP once per distance t - s that occurs (encodings/kernel_bias.py): (H, R)."""
        span = distance_span(q_positions, k_positions)
        if span is None:
            return None
        return KernelBias("distance_table", self.table(*span, torch.float32, q_positions.device).T.contiguous(), span[0])

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", hidden={self.hidden}, depth={self.depth}, "
                f"log_distance={self.log_distance}")
