"""RoPE (RoFormer eq. 14-16, 34) and its context-extension variants (paper 001):
position interpolation ("rope-linear"), NTK-aware ("rope-ntk"), dynamic NTK ("rope-dynamic") and YaRN ("rope-yarn").

Angles are computed in float64 from integer positions and only the final cos/sin are cast to the
input dtype, so positions up to 1e6 keep the relative-position property in fp32.
"""
from __future__ import annotations

import torch

from . import rope_scaling
from .angles import AngleTables
from .base import PositionalEncoding, register

LAYOUTS = ("interleaved", "half")
SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] channels of x by the angles whose cos/sin are given (eq. 34).

    x: (..., T, D); cos, sin: broadcastable to (..., T, rd/2). Channels past rd pass through unchanged.
    """
    rd = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    if layout == "interleaved":  # pairs (x_2i, x_2i+1): the paper's form
        if x.dtype in (torch.float32, torch.float64):
            # a complex multiply is one fused kernel forward and backward: ~6x faster than stack/flatten on CPU
            pairs = torch.view_as_complex(x_rot.reshape(*x_rot.shape[:-1], rd // 2, 2).contiguous())
            out = torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)
        else:
            x0, x1 = x_rot[..., 0::2], x_rot[..., 1::2]
            out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    else:  # "half": pairs (x_i, x_{i+rd/2}), the HF/Llama form
        x0, x1 = x_rot[..., : rd // 2], x_rot[..., rd // 2 :]
        out = torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out


class RotaryEncoding(PositionalEncoding):
    kind = "qk"

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        base: float = 10000.0,
        layout: str = "interleaved",
        rotary_dim: int | None = None,
        scaling: str = "none",
        factor: float | None = None,
        original_max_positions: int | None = None,
    ):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rope (channels are rotated in pairs), got {head_dim}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be an even int in [2, head_dim={head_dim}], got {rotary_dim!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {scaling!r}")
        # the ranges of base, factor and original_max_positions are checked by build_encoding (base.OPTION_CHECKS)
        if scaling == "none":
            if factor is not None or original_max_positions is not None:
                raise ValueError("factor and original_max_positions apply only to rope-linear, rope-ntk, rope-dynamic, rope-yarn")
        else:
            if factor is None:
                raise ValueError(f"factor must be a number >= 1 for rope scaling {scaling!r}, got None")
            if scaling in ("dynamic", "yarn") and original_max_positions is None:
                raise ValueError(f"original_max_positions (the training context) must be an int >= 1 for rope "
                                 f"scaling {scaling!r}, got None")
        self.base, self.layout, self.rotary_dim = float(base), layout, rotary_dim
        self.scaling, self.factor, self.original_max_positions = scaling, factor, original_max_positions
        if scaling == "none":
            inv_freq, self.attention_factor = rope_scaling.default_inv_freq(rotary_dim, self.base), 1.0
        elif scaling == "linear":
            inv_freq, self.attention_factor = rope_scaling.linear_scaling(rotary_dim, self.base, factor)
        elif scaling == "ntk":
            inv_freq, self.attention_factor = rope_scaling.ntk_aware_scaling(rotary_dim, self.base, factor)
        elif scaling == "yarn":
            inv_freq, self.attention_factor = rope_scaling.yarn_scaling(rotary_dim, self.base, factor, original_max_positions)
        else:  # dynamic: frequencies depend on the sequence length, see inv_freq_for
            inv_freq, self.attention_factor = rope_scaling.default_inv_freq(rotary_dim, self.base), 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # float64, (rotary_dim/2,)
        self._angles = AngleTables(gain=self.attention_factor)

    def inv_freq_for(self, seq_len: int) -> torch.Tensor:
        if self.scaling == "dynamic":
            return rope_scaling.dynamic_ntk_scaling(
                self.rotary_dim, self.base, self.factor, seq_len, self.original_max_positions
            )[0].to(self.inv_freq.device)
        return self.inv_freq

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, seq_len: int | None = None):
        """cos and sin (times the attention factor) of positions * inv_freq: each (*positions.shape, rd/2)."""
        if self.scaling == "dynamic":  # frequencies depend on the length: nothing to cache
            inv_freq = self.inv_freq_for(seq_len if seq_len is not None else int(positions.max()) + 1)
            return self._angles.lookup(positions, inv_freq, dtype, cache=False)
        return self._angles.lookup(positions, self.inv_freq, dtype)

    @property
    def caches_encoded_keys(self) -> bool:
        """Keys can be cached already rotated unless the frequencies change with the length (dynamic NTK)."""
        return self.scaling != "dynamic"

    def encode_q(self, q, q_positions):
        c, s = self.cos_sin(q_positions, q.dtype)
        return rotate(q, c.unsqueeze(1), s.unsqueeze(1), self.layout)

    encode_k = encode_q  # RoPE treats queries and keys alike

    def transform_qk(self, q, k, q_positions, k_positions):
        # dynamic NTK: one base for the whole call, chosen by the longest position seen (HF semantics)
        seq_len = int(torch.maximum(q_positions.max(), k_positions.max())) + 1
        qc, qs = self.cos_sin(q_positions, q.dtype, seq_len)
        kc, ks = self.cos_sin(k_positions, k.dtype, seq_len)
        return (
            rotate(q, qc.unsqueeze(1), qs.unsqueeze(1), self.layout),
            rotate(k, kc.unsqueeze(1), ks.unsqueeze(1), self.layout),
        )

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", base={self.base}, layout={self.layout!r}, rotary_dim={self.rotary_dim}, scaling={self.scaling!r}, factor={self.factor}"
        )


register("rope", scaling="none")(RotaryEncoding)


@register("rope-linear", scaling="linear")
class LinearScaledRotary(RotaryEncoding):
    """Position interpolation (Chen et al.): positions divided by `factor`."""


@register("rope-ntk", scaling="ntk")
class NTKRotary(RotaryEncoding):
    """NTK-aware base change: base' = base * factor^(d/(d-2))."""


@register("rope-dynamic", scaling="dynamic")
class DynamicNTKRotary(RotaryEncoding):
    """Dynamic NTK (HF 'dynamic'): the base grows with the current length beyond original_max_positions."""


@register("rope-yarn", scaling="yarn")
class YarnRotary(RotaryEncoding):
    """YaRN: NTK-by-parts frequencies (beta_fast=32, beta_slow=1) and attention factor 0.1 ln(s) + 1 on q and k."""
