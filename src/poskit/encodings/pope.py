"""PoPE, polar coordinate position embedding (Gopalakrishnan et al., eq. 2-9).

logit(t, s) = scale * sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_hc),
theta_c = base^(-c/d), c = 0..d-1 (one frequency per channel, twice RoPE's count).

In attention it is applied in the Cartesian form of eq. 6-9: q' = mu_q [cos(t theta - delta), sin(t theta - delta)]
and k' = mu_k [cos(s theta), sin(s theta)], so logit = scale * q'.k' over width 2d. The phase bias is put on the
query side (cos(a_k - a_q + delta) is unchanged) so that grouped-query keys stay shared across the query heads.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .angles import AngleTables
from .axial import axial_cos_sin, axial_frequencies, check_axial_dims
from .base import PositionalEncoding, register
from .polar_pair import polar_pair

DELTA_INITS = ("zero", "uniform")
DELTA_MIN, DELTA_MAX = -2 * math.pi, 0.0


def _table_dtype(x: torch.Tensor) -> torch.dtype:
    # float64 inputs (references, gradcheck) get float64 tables; everything else fp32 tables
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@register("pope")
class PolarEncoding(PositionalEncoding):
    """PoPE: polar coordinates, magnitude from content and phase from position alone.

    logit(t, s) = scale * sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_hc), with
    theta_c = base^(-c/d), c = 0..d-1 (eq. 2-5), computed in the Cartesian form of eq. 6-9 (q'/k' 2d wide).
    delta (num_heads, head_dim) is a learned phase bias, bounded to [-2 pi, 0]. The paper's "we bound delta so
    that it always lies in [-2 pi, 0]" admits two readings, both available:

    - the bound on the value used (default, `delta_projection=False`): delta is clamped in the forward pass,
      as PoPE-pytorch does. An entry that an update pushes outside the interval stays there, frozen at the
      bound (the clamp passes it no gradient); with the zero initialisation most entries stay at 0.
    - the bound on the parameter (`delta_projection=True`): delta is also projected back into the interval
      after every optimizer step, so every entry keeps a gradient and moves into the interior.

    They train differently: the projection breaks selective copy (docs/reproductions.md, "PoPE's phase-bias
    rule", measured over every reproduction that trains PoPE), hence the default. Either rule belongs to the
    encoding itself, so it holds in any training loop (poskit's trainer, a plain PyTorch loop, the Hugging
    Face Trainer): the projection runs after the step of any torch optimizer that holds delta
    (encodings/projection.py), nothing for a loop to call.

    Paper: Gopalakrishnan, Csordas, Schmidhuber, Mozer, "Decoupling the What and Where With Polar
    Coordinate Positional Embedding" (eq. 2-9; ablations without softplus / delta: Table 8).

    Trainable: delta (with phase_bias=True) trains only as part of the model the optimizer trains. Assign the
    encoding as an attribute of your nn.Module (poskit.nn.Attention and poskit's models do), so that
    model.parameters() holds it; built at module level and passed to poskit.attention(), it never trains, and
    attention() warns once (UntrainedEncodingWarning, encodings/registration.py).

    Options (defaults):
        base=10000.0: the frequency base theta of theta_c = theta^(-c/d).
        delta_init='zero': delta starts at 0, or 'uniform' in [-2 pi, 0].
        softplus=True: magnitudes softplus(x); False uses x itself (the paper's ablation).
        phase_bias=True: learn delta; False fixes it at 0 (the paper's ablation).
        delta_projection=False: False clamps delta in the forward pass only; True also projects it into
            [-2 pi, 0] after each optimizer step (see above).
        axial_dims=None: axial positions (images, video): a list of channel counts, one per coordinate, summing
            to head_dim; positions then carry a trailing coordinate axis (T, n) or (B, T, n), and coordinate a
            drives its own channel group with frequencies base^(-c/d_a), c < d_a (encodings/axial.py, as
            PoPE-pytorch's AxialPoPE). Relative invariance then holds per axis.

    In linear attention (`linear_attention` of poskit.attention, linear_form "polar"): q and k are complex
    vectors mu e^{i phi} whose magnitudes mu = softplus(.) are already non-negative, so they are the feature
    map; the numerator is the real part of their complex inner product (the PoPE logit without the scale,
    sum_c mu_q mu_k cos((s - t) theta_c + delta_c)) and the normaliser the inner product of the magnitudes,
    sum_c mu_q mu_k, which bounds the numerator's weight in absolute value (|cos| <= 1). Without softplus
    (the ablation) magnitudes may be negative and the normaliser may vanish: linear_form is then None.
    """
    kind = "qk"

    def __init__(
        self,
        *,
        head_dim: int,
        num_heads: int,
        base: float = 10000.0,
        delta_init: str = "zero",
        softplus: bool = True,
        phase_bias: bool = True,
        delta_projection: bool = False,
        axial_dims: list[int] | None = None,
    ):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if delta_init not in DELTA_INITS:
            raise ValueError(f"delta_init must be one of {list(DELTA_INITS)}, got {delta_init!r}")
        if not base > 1:
            raise ValueError(f"base must be > 1, got {base!r}")
        self.base, self.delta_init, self.softplus, self.phase_bias = float(base), delta_init, bool(softplus), bool(phase_bias)
        self.delta_projection = bool(delta_projection)
        # theta_c = base^(-c/d), c = 0..d-1, in float64 (axial: the same per coordinate group, d -> d_a)
        inv_freq = base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim)
        self.axial_dims = None
        if axial_dims is not None:
            self.axial_dims = check_axial_dims(axial_dims, head_dim, channels_per_frequency=1, total_name="head_dim")
            inv_freq, axis = axial_frequencies(
                self.axial_dims, lambda d: self.base ** (-torch.arange(d, dtype=torch.float64) / d))
            self.register_buffer("axial_axis", axis, persistent=False)  # which coordinate each channel reads
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if self.phase_bias:
            delta = torch.zeros(num_heads, head_dim)
            if delta_init == "uniform":
                delta.uniform_(DELTA_MIN, DELTA_MAX)
            self.delta = nn.Parameter(delta)  # (num_heads, head_dim), clamped to [-2 pi, 0] in forward
        else:
            self.register_parameter("delta", None)
        self._angles = AngleTables()

    def project_parameters_(self) -> None:
        """Put delta back into [-2 pi, 0] in place (with delta_projection; a no-op otherwise).

        Runs after every step of an optimizer that holds delta (encodings/projection.py). Its effect: the
        forward clamp passes no gradient to an entry outside [-2 pi, 0], and with delta_init="zero" every entry
        starts on the edge 0, so about half of them step above 0 on the first update and would never receive
        a gradient again; projected back onto the edge they keep theirs (the clamp's gradient includes its
        bounds). Forward values are unchanged by the projection itself: the clamp maps both to 0."""
        if self.delta is not None and self.delta_projection:
            with torch.no_grad():
                self.delta.clamp_(DELTA_MIN, DELTA_MAX)

    @property
    def projects_parameters(self) -> bool:
        # read at each optimizer step, so the option may be switched on a built encoding
        return self.delta is not None and self.delta_projection

    def statistics(self) -> dict[str, float]:
        """Where the phase bias sits: the fraction of entries the forward clamp puts on the bound 0 (at or above
        it: under the clamp alone an entry above 0 gets no gradient again), on the bound -2 pi, strictly
        inside, and the mean and minimum of the clamped values. Empty without a phase bias."""
        if self.delta is None:
            return {}
        with torch.no_grad():
            raw = self.delta.detach().float()
            used = raw.clamp(DELTA_MIN, DELTA_MAX)
            return {"delta_at_zero": float((raw >= DELTA_MAX).float().mean()),
                    "delta_at_minus_2pi": float((raw <= DELTA_MIN).float().mean()),
                    "delta_inside": float(((raw > DELTA_MIN) & (raw < DELTA_MAX)).float().mean()),
                    "delta_mean": float(used.mean()), "delta_min": float(used.min())}

    def clamped_delta(self, like: torch.Tensor) -> torch.Tensor:
        """The phase bias actually used, (num_heads, head_dim); zeros without phase_bias."""
        if self.delta is None:
            return torch.zeros(self.num_heads, self.head_dim, device=like.device, dtype=like.dtype)
        return self.delta.clamp(DELTA_MIN, DELTA_MAX).to(like.dtype)

    def clamped_delta_fp32(self, device) -> torch.Tensor:
        """The phase bias in fp32 whatever the inputs' dtype: the fused kernels keep phases (and delta's
        gradient) in fp32 so that half-precision inputs do not round delta."""
        if self.delta is None:
            return torch.zeros(self.num_heads, self.head_dim, device=device, dtype=torch.float32)
        return self.delta.float().clamp(DELTA_MIN, DELTA_MAX)

    def magnitude(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x) if self.softplus else x

    @property
    def position_coords(self) -> int:
        return 0 if self.axial_dims is None else len(self.axial_dims)

    @property
    def linear_form(self):
        # the softplus magnitudes are the non-negative features (class docstring); x itself is not
        return "polar" if self.softplus else None

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32):
        """cos and sin of positions * theta, each (*positions.shape, d), computed in float64 then cast; axial
        positions (..., n) -> (..., d), each channel reading its own coordinate."""
        if self.axial_dims is not None:
            return axial_cos_sin(positions, self.inv_freq, self.axial_axis, dtype)
        return self._angles.lookup(positions, self.inv_freq, dtype)

    def cartesian_q(self, q: torch.Tensor, q_positions: torch.Tensor, scale: float = 1.0,
                    tables: tuple | None = None) -> torch.Tensor:
        """(B, H, T, d) -> (B, H, T, 2d): scale * mu [cos(a - delta), sin(a - delta)] (eq. 6, bias moved to q).

        `scale` multiplies the small angle tables instead of the 2d-wide result, so folding the attention
        scale into q costs nothing. `tables`: cos_sin(q_positions, ...) where the caller has it already.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q must have num_heads={self.num_heads} heads for this pope encoding (delta is per head), got {q.shape[1]}")
        cos, sin = self.cos_sin(q_positions, _table_dtype(q)) if tables is None else tables
        cos, sin = cos.unsqueeze(1).to(q.dtype), sin.unsqueeze(1).to(q.dtype)  # (1|B, 1, T, d)
        rotation = None
        if self.delta is not None:
            # the per-head rotation by -delta is applied inside polar_pair, which keeps it factored: the rotated
            # (1|B, H, T, d) tables are never saved for the backward
            delta = self.clamped_delta(q)[None, :, None, :]  # (1, H, 1, d)
            rotation = (delta.cos(), delta.sin())
        return polar_pair(q, cos, sin, self.softplus, rotation=rotation, scale=scale)

    def cartesian_k(self, k: torch.Tensor, k_positions: torch.Tensor, tables: tuple | None = None) -> torch.Tensor:
        """(B, Hkv, T, d) -> (B, Hkv, T, 2d): mu [cos(a), sin(a)] (eq. 7 without the bias); `tables` as
        cartesian_q's."""
        cos, sin = self.cos_sin(k_positions, _table_dtype(k)) if tables is None else tables
        return polar_pair(k, cos.unsqueeze(1).to(k.dtype), sin.unsqueeze(1).to(k.dtype), self.softplus)

    cache_form = "magnitude"  # the KV cache holds softplus(k), d wide (attention/pope_decode.py says why)

    qk_width = 2  # encoded q/k are twice head_dim wide: on CPU the engine prefers its blocked path

    fused_kernel = "triton_pope"  # attention/triton_pope.py, fed through the polar interface above
    # On an H100 (bf16, docs/benchmarks.md) SDPA on the 2d-wide Cartesian q/k ran 1.3-1.5x RoPE + SDPA (padded v)
    # or below it (unpadded, as PoPE-pytorch), the fused kernel 2.2-5.4x; the kernel keeps decode and its
    # lower memory (backend="triton")
    fused_kernel_for_full_sequences = False

    def encode_q(self, q, q_positions, scale: float = 1.0):
        return self.cartesian_q(q, q_positions, scale)

    def encode_k(self, k, k_positions):
        return self.cartesian_k(k, k_positions)

    def transform_qk(self, q, k, q_positions, k_positions):
        # the same positions (a self-attention call's): one lookup serves both
        same = k_positions is q_positions and _table_dtype(k) == _table_dtype(q)
        tables = self.cos_sin(q_positions, _table_dtype(q)) if same else None
        return self.cartesian_q(q, q_positions, tables=tables), self.cartesian_k(k, k_positions, tables=tables)

    def component_frequencies(self) -> torch.Tensor:
        """theta_c = base^(-c/d) of each of the d complex components, float64 (head_dim,)."""
        return self.inv_freq.detach().to(torch.float64).cpu()

    def component_magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """The modulus of each complex feature, |mu(x_c)| (softplus(x_c), or |x_c| without softplus): (..., d)."""
        return self.magnitude(x).abs()

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", base={self.base}, delta_init={self.delta_init!r}, softplus={self.softplus}, "
                                       f"phase_bias={self.phase_bias}, delta_projection={self.delta_projection}"
                                       + (f", axial_dims={list(self.axial_dims)}" if self.axial_dims is not None else ""))
