"""RoPE (RoFormer eq. 14-16, 34) and its context-extension variants (paper 001):
position interpolation ("rope-linear"), NTK-aware ("rope-ntk"), dynamic NTK ("rope-dynamic") and YaRN ("rope-yarn");
and HF transformers' "rope-llama3" and "rope-longrope" (rope_scaling.py).

Angles are computed in float64 from integer positions and only the final cos/sin are cast to the
input dtype, so positions up to 1e6 keep the relative-position property in fp32.
"""
from __future__ import annotations

import torch

from . import rope_scaling
from .angles import AngleTables
from .axial import axial_cos_sin, axial_frequencies, check_axial_dims
from .base import PositionalEncoding, register

LAYOUTS = ("interleaved", "half")
SCALINGS = tuple(rope_scaling.ROPE_INIT_FUNCTIONS)  # ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] channels of x by the angles whose cos/sin are given (eq. 34).

    x: (..., T, D); cos, sin: broadcastable to (..., T, rd/2). Channels past rd pass through unchanged.
    """
    rd = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    if layout == "interleaved":  # pairs (x_2i, x_2i+1): the paper's form
        if x.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling():
            # a complex multiply is one fused kernel forward and backward: ~6x faster than stack/flatten on CPU;
            # inductor has no complex codegen (it falls back to eager ops), so traced code takes the real form
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
    """RoPE: rotates each pair of q/k channels by position * theta_i, so q_t . k_s depends only on t - s.

    q'_t = R(t theta) q_t, k'_s = R(s theta) k_s with R a block-diagonal 2x2 rotation per channel pair and
    theta_i = base^(-2i/d), i = 0..d/2-1 (RoFormer eq. 14-16, element-wise form eq. 34). The registered
    variants change the frequencies (rope_scaling.py, paper 001): "rope-linear" theta_i / s (position
    interpolation), "rope-ntk" base * s^(d/(d-2)), "rope-dynamic" the NTK base grown with the current length
    past original_max_positions, "rope-yarn" NTK-by-parts with ramp ends beta_fast=32, beta_slow=1 and the
    attention temperature 0.1 ln(s) + 1 on cos and sin; "rope-llama3" and "rope-longrope" follow HF
    transformers' rope types of those names (Llama 3.1, Phi-3; rope_scaling.py says where they come from).

    Paper: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (eq. 14-16, 34); the
    scalings: "Why Position Matters" (paper 001: linear scaling, NTK-aware scaling, YaRN).

    Options (defaults):
        base=10000.0: the frequency base (RoFormer's 10000).
        layout='interleaved': channel pairs (x_2i, x_2i+1) as in the paper, or 'half': (x_i, x_i+d/2) (HF/Llama).
        rotary_dim=None: rotate only the first rotary_dim channels (even); None = all head_dim.
        scaling='none': fixed by the registered name (rope, rope-linear, rope-ntk, rope-dynamic, rope-yarn,
            rope-llama3, rope-longrope).
        factor=None: the scale s = L'/L; required by every scaled variant (no paper default; rope-longrope
            takes attention_factor instead).
        original_max_positions=None: the training length L; required by rope-dynamic, rope-yarn, rope-llama3
            and rope-longrope.
        low_freq_factor=None, high_freq_factor=None: rope-llama3's band (Llama 3.1 uses 1 and 4); required.
        short_factor=None, long_factor=None: rope-longrope's per-frequency divisors; required.
        attention_factor=None: rope-longrope's cos/sin multiplier (default from factor).
        axial_dims=None: axial positions (images, video; plain rope only): a list of even channel counts, one
            per coordinate, summing to rotary_dim; positions then carry a trailing coordinate axis (T, n) or
            (B, T, n), and coordinate a rotates its own channel group with frequencies base^(-2i/d_a)
            (encodings/axial.py). Relative invariance then holds per axis.
        Options without a default raise one ValueError listing every missing one (build_encoding).
    """
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
        low_freq_factor: float | None = None,
        high_freq_factor: float | None = None,
        short_factor: list[float] | None = None,
        long_factor: list[float] | None = None,
        attention_factor: float | None = None,
        axial_dims: list[int] | None = None,
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
        # the ranges of base, factor and original_max_positions are checked by build_encoding (base.OPTION_CHECKS);
        # the scaling function checks that the options its variant needs are given
        self.base, self.layout, self.rotary_dim = float(base), layout, rotary_dim
        self.scaling, self.factor, self.original_max_positions = scaling, factor, original_max_positions
        self._variant = rope_scaling.ROPE_INIT_FUNCTIONS[scaling]
        # llama3 / longrope options (HF names); each variant checks those it reads, and no other variant takes them
        self._rope_parameters = rope_scaling.RopeParameters(
            rotary_dim, self.base, factor, original_max_positions, low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor, short_factor=short_factor, long_factor=long_factor,
            attention_factor=attention_factor)
        rope_scaling.check_variant_options(scaling, self._rope_parameters)
        # length-dependent variants (dynamic) start from their frequencies at construction; see inv_freq_for
        inv_freq, self.attention_factor = self._variant.init(self._rope_parameters, None)
        self.axial_dims = None
        if axial_dims is not None:
            self.axial_dims = check_axial_dims(axial_dims, rotary_dim, channels_per_frequency=2,
                                               total_name="rotary_dim")
            if scaling != "none":  # the scalings stretch one 1-d context length; an image has one per axis
                raise ValueError(f"axial_dims is accepted by plain rope only, not with scaling {scaling!r}")
            inv_freq, axis = axial_frequencies(
                self.axial_dims, lambda d: self.base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
            self.register_buffer("axial_axis", axis, persistent=False)  # which coordinate each frequency reads
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # float64, (rotary_dim/2,)
        self._angles = AngleTables(gain=self.attention_factor)

    @classmethod
    def required_options(cls, options: dict) -> tuple[str, ...]:
        # the scaling variant declares the options it cannot default (factor, original_max_positions, ...)
        variant = rope_scaling.ROPE_INIT_FUNCTIONS[options.get("scaling", "none")]
        one_of = variant.requires_one_of
        return variant.requires + (("|".join(one_of),) if one_of else ())  # "a|b": one of them

    @classmethod
    def options_context(cls, options: dict) -> str:
        return f" for rope scaling {options.get('scaling', 'none')!r}"

    @property
    def position_coords(self) -> int:
        return 0 if self.axial_dims is None else len(self.axial_dims)

    @property
    def linear_form(self):
        """RoPE rotates the features in linear attention (RoFormer eq. 19); a length-dependent variant (dynamic
        NTK) cannot: the keys summed into the running state would need re-rotating as the length grows."""
        return None if self.length_dependent else "rotation"

    @property
    def length_dependent(self) -> bool:
        """The frequencies change with the current length (dynamic NTK)."""
        return self._variant.length_dependent

    def inv_freq_for(self, seq_len: int) -> torch.Tensor:
        if self.length_dependent:
            return self._variant.init(self._rope_parameters, seq_len)[0].to(self.inv_freq.device)
        return self.inv_freq

    @staticmethod
    def call_length(q_positions: torch.Tensor, k_positions: torch.Tensor) -> int:
        """The current length of a call for length-dependent variants: its largest position + 1. Traced by
        torch.compile, a 0-d tensor: an int would be a data-dependent graph break (fullgraph=True refuses it),
        and the variant computes its frequencies from the tensor instead (rope_scaling.dynamic_ntk_base)."""
        longest = torch.maximum(q_positions.max(), k_positions.max()) + 1
        return longest if torch.compiler.is_compiling() else int(longest)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, seq_len: int | None = None):
        """cos and sin (times the attention factor) of positions * inv_freq: each (*positions.shape, rd/2);
        axial positions (..., n) -> (..., rd/2), each frequency reading its own coordinate."""
        if self.axial_dims is not None:
            return axial_cos_sin(positions, self.inv_freq, self.axial_axis, dtype, self.attention_factor)
        if self.length_dependent:  # frequencies depend on the length: nothing to cache
            inv_freq = self.inv_freq_for(seq_len if seq_len is not None else int(positions.max()) + 1)
            return self._angles.lookup(positions, inv_freq, dtype, cache=False)
        return self._angles.lookup(positions, self.inv_freq, dtype)

    @property
    def cache_form(self) -> str:
        """Keys are cached already rotated unless the frequencies change with the length (dynamic NTK)."""
        return "raw" if self.length_dependent else "encoded"

    def encode_k(self, k, k_positions):
        c, s = self.cos_sin(k_positions, k.dtype)
        return rotate(k, c.unsqueeze(1), s.unsqueeze(1), self.layout)

    def encode_q(self, q, q_positions, scale: float = 1.0):
        # RoPE treats queries and keys alike; the scale multiplies every channel (rotated or passed through)
        out = self.encode_k(q, q_positions)
        return out * scale if scale != 1.0 else out

    def transform_qk(self, q, k, q_positions, k_positions):
        # dynamic NTK: one base for the whole call, chosen by the longest position seen (HF semantics); the
        # other variants need no length, and reading one would cost a data-dependent int (a graph break)
        seq_len = self.call_length(q_positions, k_positions) if self.length_dependent else None
        qc, qs = self.cos_sin(q_positions, q.dtype, seq_len)
        kc, ks = self.cos_sin(k_positions, k.dtype, seq_len)
        return (
            rotate(q, qc.unsqueeze(1), qs.unsqueeze(1), self.layout),
            rotate(k, kc.unsqueeze(1), ks.unsqueeze(1), self.layout),
        )

    def component_frequencies(self) -> torch.Tensor:
        """theta_i of each rotated pair (the frequencies at construction for rope-dynamic), float64 (rotary_dim/2,)."""
        return self.inv_freq.detach().to(torch.float64).cpu()

    def component_magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """The 2-norm of each rotated pair of x (..., head_dim) -> (..., rotary_dim/2), the pairs of `layout`
        (a rotation keeps it, so it is content alone); channels past rotary_dim have no frequency and are left out."""
        rd = self.rotary_dim
        if self.layout == "interleaved":
            x0, x1 = x[..., 0:rd:2], x[..., 1:rd:2]
        else:
            x0, x1 = x[..., : rd // 2], x[..., rd // 2: rd]
        return torch.sqrt(x0 * x0 + x1 * x1)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", base={self.base}, layout={self.layout!r}, rotary_dim={self.rotary_dim}, scaling={self.scaling!r}, factor={self.factor}"
            + (f", axial_dims={list(self.axial_dims)}" if self.axial_dims is not None else "")
        )


# one registered name per scaling variant, all served by RotaryEncoding with the variant fixed
for _scaling in SCALINGS:
    register("rope" if _scaling == "none" else f"rope-{_scaling}", scaling=_scaling)(RotaryEncoding)
