"""Learned relative position embeddings (CoPE paper eq. 1; Shaw et al.): logit = scale * q_t . (k_s + e[t - s]).

One embedding per offset in [-max_distance, max_distance], shared across heads (offsets < 0 only occur
without a causal mask). Offsets beyond the table raise ValueError, unless cap=True ("relative-capped"),
where they use the last embedding, i.e. "far away" (CoPE paper §5.4).
"""
from __future__ import annotations

import torch
from torch import nn

from .alibi import distance
from .base import PositionalEncoding, register
from .kernel_bias import KernelBias


class RelativeEncoding(PositionalEncoding):
    """Learned relative positions: logit(t, s) = scale * q_t . (k_s + e[t - s]).

    One embedding per offset in [-max_distance, max_distance], shared across heads; offsets beyond the table
    raise ValueError, or with cap=True ("relative-capped") use the last embedding.

    Paper: Shaw et al., as the relative baseline of the CoPE paper (Golovneva et al., eq. 1, section 5.4).

    Trainable: the offset embeddings train only as part of the model the optimizer trains. Assign the encoding
    as an attribute of your nn.Module (poskit.nn.Attention and poskit's models do), so that model.parameters()
    holds them; built at module level and passed to poskit.attention(), it never trains, and attention() warns
    once (UntrainedEncodingWarning, encodings/registration.py).

    Options (defaults):
        max_distance=256: the largest offset with its own embedding.
        cap=False: clip larger offsets to max_distance instead of refusing them (fixed True by "relative-capped").
        init_std=0.02: standard deviation of the normal initialisation.
    """
    kind = "bias"

    def __init__(self, *, head_dim: int, num_heads: int, max_distance: int = 256, cap: bool = False, init_std: float = 0.02):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        # max_distance's range is checked by build_encoding (base.OPTION_CHECKS)
        self.max_distance, self.cap = max_distance, bool(cap)
        self.embeddings = nn.Parameter(torch.randn(2 * max_distance + 1, head_dim) * init_std)  # row o + M: offset o

    def check_positions(self, q_positions, k_positions, visible) -> None:
        if self.cap:
            return
        too_far = (distance(q_positions, k_positions).abs() > self.max_distance) & visible
        if too_far.any():
            far = int((distance(q_positions, k_positions).abs() * visible).max())
            raise ValueError(
                f"relative offsets must be within max_distance={self.max_distance}, got {far}; "
                f"raise max_distance or use cap=True (relative-capped)"
            )

    def bias(self, q, q_positions, k_positions, scale):
        m = self.max_distance
        offset = distance(q_positions, k_positions).clamp(-m, m)  # (1|B, 1, Tq, Tk); far pairs use the last row
        # q . e[o] only for the offsets that occur (a table of max_distance 8192 against 64 positions would
        # otherwise cost 256x the logits), then gathered per (t, s)
        lo, hi = (int(x) for x in offset.aminmax())  # one host read, not two (each waits for a GPU)
        z = q @ self.embeddings[lo + m:hi + m + 1].to(q.dtype).T  # (B, H, Tq, hi - lo + 1)
        index = (offset - lo).expand(q.shape[0], q.shape[1], -1, -1)
        return scale * z.gather(-1, index)

    def kernel_bias(self, q_positions, k_positions):
        """scale * q_t . e[clamp(t - s)] computed inside the compiled CPU kernel (encodings/kernel_bias.py);
        offsets past max_distance are clamped, as here (without cap, check_positions refuses visible ones)."""
        return KernelBias("offset_embeddings", self.embeddings, self.max_distance)


register("relative")(RelativeEncoding)


@register("relative-capped", cap=True)
class CappedRelativeEncoding(RelativeEncoding):
    """Relative PE whose offsets beyond max_distance use the last embedding (RelativeEncoding with cap=True).

    Paper: the relative-capped baseline of the CoPE paper (Golovneva et al., section 5.4).

    Trainable: the offset embeddings train only as part of the model the optimizer trains. Assign the encoding
    as an attribute of your nn.Module (poskit.nn.Attention and poskit's models do), so that model.parameters()
    holds them; built at module level and passed to poskit.attention(), it never trains, and attention() warns
    once (UntrainedEncodingWarning, encodings/registration.py).

    Options (defaults): max_distance=256, init_std=0.02, as for relative; cap=True is fixed.
    """
