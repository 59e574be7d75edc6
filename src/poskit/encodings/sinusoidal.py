"""Sinusoidal absolute encoding (Vaswani et al.; RoFormer eq. 4):
PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
from __future__ import annotations

import torch

from .absolute import check_embed_positions, check_even_dim
from .base import PositionalEncoding, register


@register("sinusoidal")
class SinusoidalEncoding(PositionalEncoding):
    """Sinusoidal absolute positions added to the token embeddings.

    PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), computed in float64.

    Paper: Vaswani et al., "Attention Is All You Need", as in RoFormer eq. 4 and paper 001.

    Options (defaults):
        dim (required): the model width (even).
        base=10000.0: the wavelength base.
    """
    kind = "absolute"

    def __init__(self, *, head_dim: int, num_heads: int, dim: int, base: float = 10000.0):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        check_even_dim(dim, "sinusoidal")
        self.dim, self.base = dim, float(base)

    def embed(self, positions) -> torch.Tensor:
        positions = check_embed_positions(positions)
        # angles in float64 so that large positions keep their phase; cast once at the end
        i = torch.arange(0, self.dim, 2, dtype=torch.float64, device=positions.device)
        angles = positions.double().unsqueeze(-1) / self.base ** (i / self.dim)
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., dim) interleaved sin, cos
        return pe.float()
