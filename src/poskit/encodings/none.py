"""No positional information at all (NoPE): attention is permutation-equivariant except for the causal mask."""
from .base import PositionalEncoding, register


@register("none")
class NoEncoding(PositionalEncoding):
    """NoPE: no positional information; only the causal mask breaks permutation symmetry.

    The baseline of the comparisons: logit(t, s) = scale * q_t . k_s.

    Paper: the "none" baseline of the CoPE paper (Golovneva et al., Tables 2-4) and of the PoPE paper.

    Options (defaults): none besides head_dim and num_heads.
    """
    kind = "none"

    def __init__(self, *, head_dim: int, num_heads: int):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
