"""RoPE (RoFormer eq. 14-16, 34) and its context-extension variants (paper 001):
position interpolation ("rope-linear"), NTK-aware ("rope-ntk"), dynamic NTK ("rope-dynamic") and YaRN ("rope-yarn");
and HF transformers' "rope-llama3" and "rope-longrope" (rope_scaling.py).

Angles are computed in float64 from integer positions and only the final cos/sin are cast to the
input dtype, so positions up to 1e6 keep the relative-position property in fp32.
"""
from __future__ import annotations

import torch

from . import rope_hf
from . import rope_scaling as variants  # the module; `rope_scaling` is also HF's option name
from .angles import AngleTables
from .axial import axial_cos_sin, axial_frequencies, check_axial_dims
from .base import PositionalEncoding, build_encoding, register

LAYOUTS = ("interleaved", "half")
SCALINGS = tuple(variants.ROPE_INIT_FUNCTIONS)  # ("none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")


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
            pairs = torch.view_as_complex(_complex_viewable(x_rot.reshape(*x_rot.shape[:-1], rd // 2, 2)))
            out = torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)
        else:
            x0, x1 = x_rot[..., 0::2], x_rot[..., 1::2]
            out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    else:  # "half": pairs (x_i, x_{i+rd/2}), the HF/Llama form
        x0, x1 = x_rot[..., : rd // 2], x_rot[..., rd // 2 :]
        out = torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out


def _complex_viewable(x: torch.Tensor) -> torch.Tensor:
    """x (..., 2) as torch.view_as_complex takes it: x itself where its pairs are adjacent and every other stride
    and its offset are even (a KV cache's view, whose heads lie `capacity` rows apart, is: copying it would cost a
    copy of the cache at every decode step), else a contiguous copy."""
    even = all(s % 2 == 0 for s in x.stride()[:-1]) and x.storage_offset() % 2 == 0
    return x if x.stride(-1) == 1 and even else x.contiguous()


def layout_permutation(head_dim: int, src: str, dst: str, rotary_dim: int | None = None) -> torch.Tensor:
    """(head_dim,) int64 index: channel j of one head in layout `dst` is channel perm[j] in layout `src`.

    'interleaved' pairs channels (2i, 2i+1), 'half' pairs (i, i + rd/2), i < rd/2 = rotary_dim/2 (default
    head_dim); channels past rotary_dim pass through. Reordering q and k alike leaves every logit unchanged."""
    rd = head_dim if rotary_dim is None else rotary_dim
    for value, name in ((src, "src"), (dst, "dst")):
        if value not in LAYOUTS:
            raise ValueError(f"{name} must be one of {list(LAYOUTS)}, got {value!r}")
    if isinstance(rd, bool) or not isinstance(rd, int) or rd < 2 or rd % 2 or rd > head_dim:
        raise ValueError(f"rotary_dim must be an even int in [2, head_dim={head_dim}], got {rd!r}")
    rest = torch.arange(rd, head_dim)
    if src == dst:
        return torch.arange(head_dim)
    pairs = torch.arange(rd).view(rd // 2, 2)  # interleaved channel of (pair i, member m)
    if src == "interleaved":  # half channel m * rd/2 + i is interleaved channel 2i + m
        return torch.cat((pairs.t().reshape(-1), rest))
    return torch.cat((torch.argsort(pairs.t().reshape(-1)), rest))  # the inverse: interleaved 2i + m <- half


def convert_qk_layout(weight: torch.Tensor, *, head_dim: int, src: str, dst: str,
                      rotary_dim: int | None = None) -> torch.Tensor:
    """A q or k projection's weight (num_heads * head_dim, in_features) or bias (num_heads * head_dim,) with
    each head's output channels reordered from RoPE layout `src` to `dst` ('interleaved' or 'half'): a model
    whose rope uses `dst` computes with the result the logits it computed in `src` with `weight` (HF's
    Llama conversion script applies the interleaved -> half permutation to Meta's checkpoints). rotary_dim:
    the rotated channels per head (default head_dim); the others keep their place. Apply it to q and k, never
    to v or the output projection."""
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (1, 2) or weight.shape[0] % head_dim:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a (num_heads * {head_dim}, in_features) projection weight or its "
                         f"(num_heads * {head_dim},) bias, got {shape}")
    perm = layout_permutation(head_dim, src, dst, rotary_dim)
    heads = weight.shape[0] // head_dim
    index = (torch.arange(heads)[:, None] * head_dim + perm[None, :]).reshape(-1).to(weight.device)
    return weight.index_select(0, index)


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
        base=None: the frequency base; None is RoFormer's 10000.0. HF's name: rope_theta.
        layout=None: channel pairs (x_2i, x_2i+1) as in the paper ('interleaved', what None means), or 'half':
            (x_i, x_i+d/2), the rotate_half layout of HF's Llama family. HF's name: rope_interleave (True:
            'interleaved', False: 'half'). `convert_qk_layout` moves q/k projection weights between the two.
        rotary_dim=None: rotate only the first rotary_dim channels (even); None = all head_dim. HF's name:
            partial_rotary_factor (rotary_dim = int(head_dim * partial_rotary_factor)).
        scaling='none': fixed by the registered name (rope, rope-linear, rope-ntk, rope-dynamic, rope-yarn,
            rope-llama3, rope-longrope).
        factor=None: the scale s = L'/L; required by every scaled variant (no paper default; rope-longrope
            takes attention_factor instead; rope-yarn and rope-longrope derive it from max_position_embeddings).
        original_max_positions=None: the training length L; required by rope-dynamic, rope-yarn, rope-llama3
            and rope-longrope. HF's name: original_max_position_embeddings (rope-dynamic: max_position_embeddings).
        low_freq_factor=None, high_freq_factor=None: rope-llama3's band (Llama 3.1 uses 1 and 4); required.
        short_factor=None, long_factor=None: rope-longrope's per-frequency divisors; required.
        attention_factor=None: rope-yarn's and rope-longrope's cos/sin multiplier (default from factor).
        beta_fast=None, beta_slow=None: rope-yarn's ramp ends in rotations within the original context (None:
            YaRN's 32 and 1). truncate=None: rope-yarn rounds the ramp ends outwards to whole dims (None: True).
        mscale=None, mscale_all_dim=None: rope-yarn's attention factor as DeepSeek sets it, given together:
            (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1).
        axial_dims=None: axial positions (images, video; plain rope only): a list of even channel counts, one
            per coordinate, summing to rotary_dim; positions then carry a trailing coordinate axis (T, n) or
            (B, T, n), and coordinate a rotates its own channel group with frequencies base^(-2i/d_a)
            (encodings/axial.py). Relative invariance then holds per axis.
        rope_theta=None, original_max_position_embeddings=None, max_position_embeddings=None,
        partial_rotary_factor=None, rope_interleave=None, rope_scaling=None, rope_parameters=None: Hugging Face's
            names and rope dicts, read as HF reads them (encodings/rope_hf.py); a value given under two names
            must agree.
        Options without a default raise one ValueError listing every missing one (build_encoding).
    """
    kind = "qk"

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        base: float | None = None,
        layout: str | None = None,
        rotary_dim: int | None = None,
        scaling: str = "none",
        factor: float | None = None,
        original_max_positions: int | None = None,
        low_freq_factor: float | None = None,
        high_freq_factor: float | None = None,
        short_factor: list[float] | None = None,
        long_factor: list[float] | None = None,
        attention_factor: float | None = None,
        beta_fast: float | None = None,
        beta_slow: float | None = None,
        truncate: bool | None = None,
        mscale: float | None = None,
        mscale_all_dim: float | None = None,
        axial_dims: list[int] | None = None,
        rope_theta: float | None = None,
        original_max_position_embeddings: int | None = None,
        max_position_embeddings: int | None = None,
        partial_rotary_factor: float | None = None,
        rope_interleave: bool | None = None,
        rope_scaling: dict | None = None,
        rope_parameters: dict | None = None,
    ):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rope (channels are rotated in pairs), got {head_dim}")
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {scaling!r}")
        o = rope_hf.resolve_options(scaling, head_dim, dict(
            base=base, layout=layout, rotary_dim=rotary_dim, factor=factor,
            original_max_positions=original_max_positions, low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor, short_factor=short_factor, long_factor=long_factor,
            attention_factor=attention_factor, beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate,
            mscale=mscale, mscale_all_dim=mscale_all_dim, rope_theta=rope_theta,
            original_max_position_embeddings=original_max_position_embeddings,
            max_position_embeddings=max_position_embeddings, partial_rotary_factor=partial_rotary_factor,
            rope_interleave=rope_interleave, rope_scaling=rope_scaling, rope_parameters=rope_parameters))
        base, layout = o.get("base", 10000.0), o.get("layout", "interleaved")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
        rotary_dim = o.get("rotary_dim", head_dim)
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be an even int in [2, head_dim={head_dim}], got {rotary_dim!r}")
        # the ranges of base, factor and original_max_positions are checked by build_encoding (base.OPTION_CHECKS)
        # or, given under HF names, by rope_hf; the scaling function checks that the options its variant needs are given
        self.base, self.layout, self.rotary_dim = float(base), layout, rotary_dim
        self.scaling, self.factor, self.original_max_positions = scaling, o.get("factor"), o.get("original_max_positions")
        self._variant = variants.ROPE_INIT_FUNCTIONS[scaling]
        # the options only some variants read (HF names); each variant checks those it reads, and no other takes them
        self._rope_parameters = variants.RopeParameters(
            rotary_dim, self.base, self.factor, self.original_max_positions,
            **{name: o.get(name) for name in variants.VARIANT_OPTIONS})
        variants.check_variant_options(scaling, self._rope_parameters)
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
        # the scaling variant declares the options it cannot default (factor, original_max_positions, ...); an
        # option given under its HF name (or derived as HF derives it) counts as given
        scaling = options.get("scaling", "none")
        variant = variants.ROPE_INIT_FUNCTIONS[scaling]
        try:
            given = rope_hf.resolve_options(scaling, None, {k: v for k, v in options.items() if k != "scaling"})
        except ValueError:
            return ()  # the constructor raises it, naming the option
        missing = tuple(o for o in variant.requires if given.get(o) is None)
        one_of = variant.requires_one_of
        if one_of and all(given.get(o) is None for o in one_of):
            missing += ("|".join(one_of),)  # "a|b": one of them
        return missing

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
        # the same positions (a self-attention call's): one lookup serves both
        same = k_positions is q_positions and k.dtype == q.dtype
        kc, ks = (qc, qs) if same else self.cos_sin(k_positions, k.dtype, seq_len)
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

    @property
    def test_time_scalings(self) -> tuple[str, ...]:
        # a scaling stretches the one 1-d context of a model trained unscaled: not a scaled one, not axial positions
        if self.scaling != "none" or self.axial_dims is not None:
            return ()
        return tuple(s for s in SCALINGS if s != "none")

    def with_scaling(self, scaling: str, **options) -> "RotaryEncoding":
        """The registered RoPE variant `scaling` with `options` and this encoding's base, layout and rotary_dim,
        on its device (a test-time swap: evaluate/extrapolation.py)."""
        if scaling not in self.test_time_scalings:
            return super().with_scaling(scaling, **options)
        return build_encoding(rope_hf.encoding_name(scaling), head_dim=self.head_dim, num_heads=self.num_heads,
                              base=self.base, layout=self.layout, rotary_dim=self.rotary_dim,
                              **options).to(self.inv_freq.device)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", base={self.base}, layout={self.layout!r}, rotary_dim={self.rotary_dim}, scaling={self.scaling!r}, factor={self.factor}"
            + (f", axial_dims={list(self.axial_dims)}" if self.axial_dims is not None else "")
        )


# one registered name per scaling variant, all served by RotaryEncoding with the variant fixed
for _scaling in SCALINGS:
    register("rope" if _scaling == "none" else f"rope-{_scaling}", scaling=_scaling)(RotaryEncoding)
