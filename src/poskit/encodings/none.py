"""No positional information at all (NoPE): attention is permutation-equivariant except for the causal mask."""
from .base import PositionalEncoding, register


@register("none")
class NoEncoding(PositionalEncoding):
    kind = "none"

    def __init__(self, *, head_dim: int, num_heads: int):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
