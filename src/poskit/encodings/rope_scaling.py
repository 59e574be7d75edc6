"""Inverse frequencies and attention factors of RoPE and its context-extension variants, one function each.

Every variant is one function with one signature, ``fn(params, seq_len) -> (inv_freq, attention_factor)``,
and one entry of `ROPE_INIT_FUNCTIONS` (the pattern of HF transformers' ``ROPE_INIT_FUNCTIONS``): inv_freq
is a float64 tensor of rotary_dim // 2 frequencies, attention_factor multiplies cos and sin (so the
logits by its square). `seq_len` (the current length: longest position + 1) is None at construction and
given at every call only to variants whose entry is `length_dependent`. Each function checks the options
it needs and raises ValueError naming a missing one. `poskit.encodings.rotary` registers one encoding per
entry ("rope" for "none", "rope-<name>" for the others), so a new variant is one function and one entry.

The formulas follow the article "Why Position Matters" (paper 001) and are written to agree with HF
transformers' rope types "default", "linear", "dynamic", "yarn", "llama3" and "longrope"
(``modeling_rope_utils``), which are the de-facto reference for checkpoints in the wild. "llama3" and
"longrope" are not in our papers: they follow HF (see their functions for where HF's longrope departs from
the LongRoPE paper). The options keep HF's names (``original_max_positions`` is HF's
``original_max_position_embeddings``; rope_hf.py accepts HF's own spellings and rope_parameters dicts).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # YaRN's ramp ends, in rotations within the original context


@dataclass(frozen=True)
class RopeParameters:
    """What a scaling function may read (HF passes its config): the rotated width d (rotary_dim), the base,
    and the options of the scaled variants (None when not given)."""

    rotary_dim: int
    base: float
    factor: float | None = None
    original_max_positions: int | None = None
    # llama3: the wavelength band (in units of the original context) between kept and interpolated frequencies
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    # longrope: one divisor per frequency below / above the original context, and the cos/sin multiplier
    short_factor: "tuple[float, ...] | list[float] | None" = None
    long_factor: "tuple[float, ...] | list[float] | None" = None
    attention_factor: float | None = None
    # yarn: the ramp ends (rotations within the original context), whether they are rounded to whole
    # dimensions, and DeepSeek's attention-factor pair mscale / mscale_all_dim
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None


#: options read only by some variants (the `options` of their RopeVariant); giving one to another variant is an error
VARIANT_OPTIONS = ("low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "attention_factor",
                   "beta_fast", "beta_slow", "truncate", "mscale", "mscale_all_dim")


RopeInitFunction = Callable[[RopeParameters, "int | None"], "tuple[torch.Tensor, float]"]


class RopeVariant(NamedTuple):
    init: RopeInitFunction
    #: the frequencies change with the current length (dynamic NTK): nothing can be cached across lengths,
    #: and the KV cache keeps raw keys
    length_dependent: bool = False
    #: which of VARIANT_OPTIONS the variant reads
    options: tuple[str, ...] = ()
    #: options this variant needs and no paper gives a default for (build_encoding lists the missing ones)
    requires: tuple[str, ...] = ()
    #: options of which this variant needs one (the first is listed as missing when none is given)
    requires_one_of: tuple[str, ...] = ()


def default_inv_freq(rotary_dim: int, base) -> torch.Tensor:
    """theta_i = base^(-2i/d), i = 0..d/2-1 (RoFormer eq. 15). `base` a float, or a 0-d float64 tensor (traced)."""
    device = base.device if isinstance(base, torch.Tensor) else None
    return 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)


def _required_factor(p: RopeParameters, variant: str) -> float:
    # ranges are checked by build_encoding (base.OPTION_CHECKS); here only presence
    if p.factor is None:
        raise ValueError(f"factor must be a number >= 1 for rope scaling {variant!r}, got None")
    return p.factor


def _required_original_max(p: RopeParameters, variant: str) -> int:
    if p.original_max_positions is None:
        raise ValueError(f"original_max_positions (the training context) must be an int >= 1 for rope "
                         f"scaling {variant!r}, got None")
    return p.original_max_positions


def _required_real(p: RopeParameters, name: str, variant: str, minimum: float = 0.0) -> float:
    # a finite number > minimum (these options are not in base.OPTION_CHECKS: only their variant reads them)
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= minimum:
        raise ValueError(f"{name} must be a finite number > {minimum:g} for rope scaling {variant!r}, got {value!r}")
    return float(value)


def _per_frequency(p: RopeParameters, name: str, variant: str) -> torch.Tensor:
    # one positive finite number per rotated pair: rotary_dim // 2 of them (HF: head_dim * partial_rotary_factor // 2)
    value, n = getattr(p, name), p.rotary_dim // 2
    values = None
    if isinstance(value, (list, tuple)):
        try:
            values = [float(x) for x in value if not isinstance(x, bool)]
        except (TypeError, ValueError):
            pass
    if values is None or len(values) != len(value) or len(values) != n or not all(math.isfinite(x) and x > 0 for x in values):
        raise ValueError(f"{name} must be a list of rotary_dim // 2 = {n} positive finite numbers (one per frequency) "
                         f"for rope scaling {variant!r}, got {value!r}")
    return torch.tensor(values, dtype=torch.float64)


def check_variant_options(scaling: str, p: RopeParameters) -> None:
    """Reject options that only another variant reads (HF ignores them; here a typo'd rope type would go unseen)."""
    used = ROPE_INIT_FUNCTIONS[scaling].options
    for name in VARIANT_OPTIONS:
        if getattr(p, name) is not None and name not in used:
            readers = [f"rope-{v}" for v, variant in ROPE_INIT_FUNCTIONS.items() if name in variant.options]
            this = "rope" if scaling == "none" else f"rope-{scaling}"
            raise ValueError(f"{name} applies only to {', '.join(readers)}, not to {this}")


def default_rope(p: RopeParameters, seq_len: int | None = None):
    """Plain RoPE: no scaling options apply."""
    if p.factor is not None or p.original_max_positions is not None:
        scaled = ", ".join(f"rope-{name}" for name in ROPE_INIT_FUNCTIONS if name != "none")
        raise ValueError(f"factor and original_max_positions apply only to {scaled}")
    return default_inv_freq(p.rotary_dim, p.base), 1.0


def linear_scaling(p: RopeParameters, seq_len: int | None = None):
    """Position interpolation (Chen et al.): positions divided by `factor`, i.e. every frequency divided by it."""
    factor = _required_factor(p, "linear")
    return default_inv_freq(p.rotary_dim, p.base) / factor, 1.0


def ntk_aware_scaling(p: RopeParameters, seq_len: int | None = None):
    """NTK-aware: the base grows to base * s^(d / (d - 2)), stretching low frequencies most."""
    factor, d = _required_factor(p, "ntk"), p.rotary_dim
    if d <= 2:
        raise ValueError(f"rotary_dim must be > 2 for NTK-aware scaling, got {d}")
    return default_inv_freq(d, p.base * factor ** (d / (d - 2))), 1.0


def dynamic_ntk_base(rotary_dim: int, base: float, factor: float, seq_len: int, original_max_positions: int) -> float:
    """HF 'dynamic': for seq_len > original_max_positions the base becomes
    base * ((s * L / L_orig) - (s - 1))^(d / (d - 2)); otherwise it is unchanged.

    seq_len may be a 0-d int tensor (under torch.compile, where reading it as an int is a graph break): the
    same formula, the branch taken by torch.where, a 0-d float64 tensor returned."""
    if isinstance(seq_len, torch.Tensor):
        grown = base * ((factor * seq_len.double() / original_max_positions) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        return torch.where(seq_len > original_max_positions, grown, torch.full_like(grown, base))
    if seq_len <= original_max_positions:
        return base
    return base * ((factor * seq_len / original_max_positions) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def dynamic_ntk_scaling(p: RopeParameters, seq_len: int | None = None):
    """Dynamic NTK (HF 'dynamic'): the base grows with the current length beyond original_max_positions;
    seq_len None (construction) gives the unscaled frequencies."""
    factor, original = _required_factor(p, "dynamic"), _required_original_max(p, "dynamic")
    if seq_len is None:
        return default_inv_freq(p.rotary_dim, p.base), 1.0
    return default_inv_freq(p.rotary_dim, dynamic_ntk_base(p.rotary_dim, p.base, factor, seq_len, original)), 1.0


def yarn_attention_factor(factor: float) -> float:
    """YaRN's temperature: 0.1 ln(s) + 1 (1 for s <= 1), applied to both q and k."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _yarn_mscale(factor: float, mscale: float) -> float:
    # DeepSeek's generalisation of the temperature: 0.1 mscale ln(s) + 1 (1 for s <= 1)
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_correction_dim(num_rotations: float, rotary_dim: int, base: float, max_positions: int) -> float:
    # the dimension index whose wavelength fits `num_rotations` times into the original context
    return (rotary_dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def _yarn_options(p: RopeParameters) -> tuple[float, float, bool]:
    beta_fast = YARN_BETA_FAST if p.beta_fast is None else _required_real(p, "beta_fast", "yarn")
    beta_slow = YARN_BETA_SLOW if p.beta_slow is None else _required_real(p, "beta_slow", "yarn")
    if not beta_fast > beta_slow:  # the ramp runs from beta_fast rotations down to beta_slow
        raise ValueError(f"beta_fast must be > beta_slow for rope scaling 'yarn' (defaults 32 and 1), got "
                         f"beta_fast={beta_fast!r}, beta_slow={beta_slow!r}")
    truncate = True if p.truncate is None else p.truncate
    if not isinstance(truncate, bool):
        raise ValueError(f"truncate must be true or false (a bool) for rope scaling 'yarn', got {truncate!r}")
    return beta_fast, beta_slow, truncate


def _yarn_attention(p: RopeParameters, factor: float) -> float:
    """attention_factor if given; else mscale(s, mscale) / mscale(s, mscale_all_dim) when both are given
    (DeepSeek); else 0.1 ln(s) + 1. HF ignores one of mscale / mscale_all_dim without the other, and both
    beside attention_factor: poskit refuses those combinations instead of dropping an option unseen."""
    pair = (p.mscale is not None, p.mscale_all_dim is not None)
    if p.attention_factor is not None:
        if any(pair):
            raise ValueError("attention_factor and mscale/mscale_all_dim both set the attention factor of rope "
                             "scaling 'yarn': give one of them")
        return _required_real(p, "attention_factor", "yarn")
    if pair == (True, True):
        mscale = _required_real(p, "mscale", "yarn")
        mscale_all_dim = _required_real(p, "mscale_all_dim", "yarn")
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    if any(pair):
        raise ValueError("mscale and mscale_all_dim go together for rope scaling 'yarn' (attention factor = "
                         "(0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1)): give both or neither")
    return yarn_attention_factor(factor)


def yarn_scaling(p: RopeParameters, seq_len: int | None = None):
    """YaRN, NTK-by-parts: high frequencies (many rotations in the original context) are kept, low
    frequencies are interpolated by `factor`, with a linear ramp between the dims where a wavelength fits
    beta_fast (default 32) and beta_slow (default 1) times into the original context, rounded outwards to
    whole dims unless truncate=False; attention factor 0.1 ln(s) + 1 on q and k, or `attention_factor`, or
    DeepSeek's mscale / mscale_all_dim ratio (_yarn_attention)."""
    factor, original = _required_factor(p, "yarn"), _required_original_max(p, "yarn")
    rotary_dim, base = p.rotary_dim, p.base
    beta_fast, beta_slow, truncate = _yarn_options(p)
    attention = _yarn_attention(p, factor)
    low = _yarn_correction_dim(beta_fast, rotary_dim, base, original)
    high = _yarn_correction_dim(beta_slow, rotary_dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp, as the reference implementation does
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp  # 1 = keep the original frequency
    inv_freq = default_inv_freq(rotary_dim, base)
    inv_freq = (inv_freq / factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
    return inv_freq, attention


def llama3_scaling(p: RopeParameters, seq_len: int | None = None):
    """Llama 3.1's frequency-dependent interpolation (HF 'llama3'). With L = original_max_positions and
    r_i = L theta_i / (2 pi) the rotations of frequency i within the original context: r_i <= low_freq_factor
    (wavelength >= L / low_freq_factor) is interpolated, theta_i / factor; r_i >= high_freq_factor is kept;
    in between, theta_i ((1 - g) / factor + g) with g = (r_i - low) / (high - low), which meets both ends.
    The attention factor is 1."""
    factor, original = _required_factor(p, "llama3"), _required_original_max(p, "llama3")
    low = _required_real(p, "low_freq_factor", "llama3")
    high = _required_real(p, "high_freq_factor", "llama3")
    if not high > low:
        raise ValueError(f"high_freq_factor must be > low_freq_factor for rope scaling 'llama3' (the band between them is "
                         f"blended), got high_freq_factor={high!r}, low_freq_factor={low!r}")
    inv_freq = default_inv_freq(p.rotary_dim, p.base)
    rotations = original * inv_freq / (2 * math.pi)
    g = ((rotations - low) / (high - low)).clamp(0, 1)  # 0: interpolate, 1: keep
    return inv_freq * ((1 - g) / factor + g), 1.0


def longrope_attention_factor(factor: float, original_max_positions: int) -> float:
    """HF 'longrope' (from Phi-3): sqrt(1 + ln(s) / ln(L_orig)) for s > 1, else 1; multiplies cos and sin."""
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original_max_positions))


def longrope_scaling(p: RopeParameters, seq_len: int | None = None):
    """LongRoPE as HF 'longrope' runs it (Phi-3 checkpoints): theta_i / lambda_i with lambda = long_factor when
    the current length exceeds original_max_positions, short_factor otherwise (and at construction); the
    attention factor is `attention_factor` if given, else longrope_attention_factor(factor).

    Where HF departs from the LongRoPE paper (Ding et al. 2024; not among poskit's papers): the paper also
    leaves the first n^ positions un-interpolated, which HF (and so poskit) does not; the short/long switch on
    the current length and the sqrt attention factor come from Phi-3's implementation, not the paper. poskit
    follows HF so that Phi-3-style configs load unchanged. HF derives a missing `factor` from
    max_position_embeddings / original_max_position_embeddings; poskit has no max_position_embeddings, so
    one of factor or attention_factor must be given."""
    original = _required_original_max(p, "longrope")
    short = _per_frequency(p, "short_factor", "longrope")
    long = _per_frequency(p, "long_factor", "longrope")
    if p.attention_factor is not None:
        attention = _required_real(p, "attention_factor", "longrope")
    elif p.factor is not None:
        attention = longrope_attention_factor(p.factor, original)
    else:
        raise ValueError("rope scaling 'longrope' needs factor (target context / original_max_positions, a number >= 1) "
                         "or attention_factor (a number > 0), got neither")
    if isinstance(seq_len, torch.Tensor):  # traced by torch.compile: the switch without a data-dependent branch
        ext = torch.where(seq_len > original, long.to(seq_len.device), short.to(seq_len.device))
    else:
        ext = long if seq_len is not None and seq_len > original else short
    return default_inv_freq(p.rotary_dim, p.base) / ext, attention


# scaling name -> variant; rotary.py registers "rope" for "none" and "rope-<name>" for every other entry
ROPE_INIT_FUNCTIONS: dict[str, RopeVariant] = {
    "none": RopeVariant(default_rope),
    "linear": RopeVariant(linear_scaling, requires=("factor",)),
    "ntk": RopeVariant(ntk_aware_scaling, requires=("factor",)),
    "dynamic": RopeVariant(dynamic_ntk_scaling, length_dependent=True, requires=("factor", "original_max_positions")),
    "yarn": RopeVariant(yarn_scaling, options=("attention_factor", "beta_fast", "beta_slow", "truncate", "mscale",
                                               "mscale_all_dim"),
                        requires=("factor", "original_max_positions")),
    "llama3": RopeVariant(llama3_scaling, options=("low_freq_factor", "high_freq_factor"),
                          requires=("factor", "original_max_positions", "low_freq_factor", "high_freq_factor")),
    "longrope": RopeVariant(longrope_scaling, length_dependent=True,
                            options=("short_factor", "long_factor", "attention_factor"),
                            requires=("original_max_positions", "short_factor", "long_factor"),
                            requires_one_of=("factor", "attention_factor")),
}
