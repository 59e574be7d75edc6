"""Learned absolute position embeddings (RoFormer §2.2): a trainable max_positions x dim table."""
from __future__ import annotations

import torch
from torch import nn

from .absolute import check_embed_positions
from .base import PositionalEncoding, register


@register("learned")
class LearnedEncoding(PositionalEncoding):
    """Learned absolute positions: a trainable (max_positions, dim) table added to the token embeddings.

    x_t <- x_t + P[t]; positions past the table raise ValueError.

    Paper: Su et al., "RoFormer" section 2.2 (the learned absolute baseline it reviews).

    Trainable: the table trains only as part of the model the optimizer trains. Assign the encoding as an
    attribute of your nn.Module (poskit's models do), so that model.parameters() holds it; an encoding built at
    module level and added to the embeddings outside any nn.Module never trains, silently. (attention() refuses
    absolute encodings, so its UntrainedEncodingWarning never sees this one.)

    Options (defaults):
        dim (required): the model width.
        max_positions=2048: rows of the table, the longest position + 1 it can embed.
        init_std=0.02: standard deviation of the normal initialisation.
    """
    kind = "absolute"

    def __init__(self, *, head_dim: int, num_heads: int, dim: int, max_positions: int = 2048, init_std: float = 0.02):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        # dim and max_positions are checked by build_encoding (base.OPTION_CHECKS)
        self.dim, self.max_positions = dim, max_positions
        self.table = nn.Parameter(torch.randn(max_positions, dim) * init_std)

    def embed(self, positions) -> torch.Tensor:
        positions = check_embed_positions(positions).to(self.table.device)
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"positions must be in [0, {self.max_positions - 1}] for a learned table of max_positions="
                f"{self.max_positions}, got {int(positions.max())}"
            )
        return self.table[positions]
