"""xPos (Sun et al. 2022): RoPE whose rotated pairs are also scaled, the query up and the key down, so that the
logit of pair i decays by zeta_i^((n - m) / scale_base) with the distance n - m.

The scale of one token depends on its own position alone, but it is exponential in that position: written
per token from position 0, zeta^(+-n / B) leaves float32 past n ~ 36k (float16: ~4.5k) for the fastest-decaying
pair, where the product of an overflowed query factor and an underflowed key factor is NaN. Only the product
matters (zeta^(n/B) zeta^(-m/B) = zeta^((n - m)/B)), so each call measures positions from one centre of its own
(the middle of its query positions) before exponentiating, as the peers do (rotary-embedding-torch centres on
the middle of the sequence). A decode step then has its query at the centre: factor 1, and key factors
zeta^((n - m)/B) <= 1 that can only underflow, which is the logit's own value. The centre is chosen per call,
so the KV cache keeps raw keys (cache_form "raw") and the keys are scaled at each step.
"""
from __future__ import annotations

import torch

from ..util.validate import check_real
from .angles import AngleTables
from .base import PositionalEncoding, register
from .rotary import LAYOUTS, rotate


def xpos_zeta(head_dim: int, gamma: float) -> torch.Tensor:
    """zeta_i = (2i / d + gamma) / (1 + gamma), i = 0..d/2-1, one per rotated pair: float64 (d/2,) in (0, 1)."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + gamma) / (1.0 + gamma)


def centre_of(positions: torch.Tensor) -> torch.Tensor:
    """The middle of each row's positions, (1|B, T) -> (1|B, 1) float64 (0 for an empty row): the origin the
    exponential scales of one call are measured from."""
    if positions.shape[-1] == 0:
        return torch.zeros(positions.shape[0], 1, dtype=torch.float64, device=positions.device)
    lo = positions.amin(-1, keepdim=True).double()
    hi = positions.amax(-1, keepdim=True).double()
    return (lo + hi) / 2


@register("xpos")
class XPosEncoding(PositionalEncoding):
    """xPos: RoPE with a per-frequency exponential scale, so that each rotated pair's logit decays with distance.

    q'_n = zeta^(n / B) R(n theta) q_n and k'_m = zeta^(-m / B) R(m theta) k_m per channel pair i, with the
    RoPE frequencies theta_i = base^(-2i/d) and zeta_i = (2i/d + gamma) / (1 + gamma), so that
    q'_n . k'_m = sum_i zeta_i^((n - m) / B) [pair i of q_n^T R((m - n) theta) k_m]:
    a RoPE logit whose pair i is damped by zeta_i^(distance / B) (zeta_i < 1: fast-rotating pairs decay fastest).
    B is scale_base. Positions are measured from one centre per call (the middle of the query positions),
    which changes no logit and keeps the scales inside floating point (module docstring); in a causal call
    logits stay finite for any absolute positions while the queries of one call span less than about
    2 * 36k positions in float32 (2 * 4.5k in float16). Without a causal mask a key far after its query gets
    a growing factor, as the formula says; xPos is meant for causal attention.

    Paper: Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song, Wei, "A Length-Extrapolatable
    Transformer" (arXiv 2212.10554: f_q, f_k with zeta and the scale base; gamma = 0.4 and scale_base = 512
    as in its released code, torchscale's XPOS). rotary-embedding-torch's use_xpos has the same
    zeta and scales, measured from the middle of the sequence (tests/test_peers_newenc.py).

    Options (defaults):
        base=10000.0: the RoPE frequency base.
        scale_base=512.0: B, the number of positions over which pair i's logit is damped by a factor zeta_i.
        gamma=0.4: the offset in zeta_i = (2i/d + gamma) / (1 + gamma), which sets the slowest decay.
        layout='interleaved': channel pairs (x_2i, x_2i+1) as in the paper, or 'half': (x_i, x_i+d/2).
    """
    kind = "qk"
    cache_form = "raw"  # each call picks its own centre (module docstring)

    def __init__(self, *, head_dim: int, num_heads: int, base: float = 10000.0, scale_base: float = 512.0,
                 gamma: float = 0.4, layout: str = "interleaved"):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for xpos (channels are rotated in pairs), got {head_dim}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
        # base's range is checked by build_encoding (base.OPTION_CHECKS)
        self.scale_base = check_real(scale_base, "scale_base", minimum=0, strict=True)
        self.gamma = check_real(gamma, "gamma", minimum=0, strict=True)  # gamma > 0 keeps every zeta_i > 0
        self.base, self.layout = float(base), layout
        inv_freq = self.base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # float64 (d/2,)
        self.register_buffer("log_zeta", xpos_zeta(head_dim, self.gamma).log(), persistent=False)  # float64 (d/2,)
        self._angles = AngleTables()

    def scaled_rotation(self, x: torch.Tensor, positions: torch.Tensor, centre: torch.Tensor, sign: float,
                        angles: tuple[torch.Tensor, torch.Tensor] | None = None):
        """zeta^(sign (p - centre) / B) R(p theta) x for each token of x (B, H, T, d) at positions (1|B, T); the
        scale and the angles are formed in float64 and cast once. angles: the positions' (cos, sin) in float64
        where already looked up."""
        cos, sin = angles if angles is not None else self._angles.lookup(positions, self.inv_freq, torch.float64)
        power = (positions.double() - centre.to(positions.device)) / self.scale_base  # (1|B, T)
        scale = torch.exp(sign * power.unsqueeze(-1) * self.log_zeta.to(positions.device))
        c, s = (cos * scale).to(x.dtype).unsqueeze(1), (sin * scale).to(x.dtype).unsqueeze(1)
        return rotate(x, c, s, self.layout)

    def transform_qk(self, q, k, q_positions, k_positions):
        centre = centre_of(q_positions)  # one origin for the queries and keys of this call
        angles = self._angles.lookup(q_positions, self.inv_freq, torch.float64)  # (1|B, T, d/2) each
        # the same positions (a self-attention call's): one lookup serves both
        k_angles = angles if k_positions is q_positions else None
        return (self.scaled_rotation(q, q_positions, centre, 1.0, angles),
                self.scaled_rotation(k, k_positions, centre, -1.0, k_angles))

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", base={self.base}, scale_base={self.scale_base}, gamma={self.gamma}, "
                f"layout={self.layout!r}")
