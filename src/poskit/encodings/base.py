"""The contract every positional encoding follows, and the registry behind `build_encoding`.

An encoding declares *how* it enters attention through its `kind`, and *which fast paths* serve it through
the capabilities declared on `PositionalEncoding` (`qk_width`, `cache_form`, `fused_kernel`,
`needs_gate_keys`, each with a default). The attention engine, the KV cache, the kernels and the model
dispatch on these declarations only, never on an encoding's name, so adding an encoding touches only its
own module (tests/test_contract.py builds one in a test file and runs it through every path):

- ``"none"``       : contributes nothing.
- ``"absolute"``   : vectors added to the token embeddings (`embed(positions)`); attention refuses it.
- ``"qk"``         : transforms q and k before the dot product (`transform_qk`), e.g. RoPE, PoPE.
- ``"bias"``       : an additive bias on the logits computed from positions (and possibly q), e.g. ALiBi.
- ``"contextual"`` : a bias computed from the logits themselves (gates), e.g. CoPE.
"""
from __future__ import annotations

import functools
import inspect
import types
import typing
from typing import Callable, ClassVar

import torch
from torch import nn

from ..util.validate import check_bool, check_int, check_real
from .projection import project_after_each_step

KINDS = ("none", "absolute", "qk", "bias", "contextual")
CACHE_FORMS = ("raw", "encoded", "magnitude")
# How an encoding enters linear attention (attention/linear.py, RoFormer eq. 19); None: it cannot.
LINEAR_FORMS = ("identity", "rotation", "polar")


class PositionalEncoding(nn.Module):
    """Base class. Subclasses set `kind`, implement the hook of their kind and override the capability
    declarations below that differ from the defaults.

    An encoding is an nn.Module, and some have trainable parameters (PoPE's phase bias, CoPE's position
    embeddings, the relative and learned tables). They train only when the encoding is part of the model the
    optimizer trains: assign it as an attribute of your nn.Module (or build it inside one, as poskit.nn.Attention
    does), so that model.parameters() includes them. An encoding built at module level and passed to
    poskit.attention() is in no model: its parameters never change, without any error. attention() therefore
    warns once per such encoding when it runs with gradients on and the encoding has parameters that require
    grad but was never registered in any nn.Module (UntrainedEncodingWarning, encodings/registration.py)."""

    kind: ClassVar[str] = "none"
    #: registry name this instance was built under (set by build_encoding)
    name: str = ""

    # -- capabilities read by the engine, the KV cache, the kernels and the model ---------------------------
    #: Width of the encoded q and k (what transform_qk / encode_q / encode_k return) in units of head_dim.
    #: 1 for most encodings; PoPE's Cartesian form is 2 (2 * head_dim channels). On CPU, q/k wider than v
    #: take the blocked path (attention/sdpa.py `use_blocked`), which calls encode_q(q, positions, scale)
    #: and encode_k, so a "qk" encoding with qk_width > 1 must implement both.
    qk_width: ClassVar[int] = 1

    #: What the KV cache stores for this encoding's keys (one of CACHE_FORMS); may be a property:
    #: - "raw": k as given; the encoding is applied to the whole cache at every step (every kind: CoPE
    #:   recomputes its gates per query, dynamic NTK re-rotates with the length, ALiBi needs nothing).
    #: - "encoded": encode_k(k, positions), so a decode step encodes only its new tokens; kind "qk" only,
    #:   and only when the encoding of a key does not depend on the other keys (rope, not rope-dynamic).
    #:   Needs encode_q and encode_k.
    #: - "magnitude": polar encodings (PoPE): the cache holds magnitude(k) and the cos/sin of each position
    #:   (attention/pope_decode.py); needs the polar interface of encodings/pope.py PolarEncoding
    #:   (magnitude, cos_sin, clamped_delta_fp32, softplus, encode_q).
    cache_form: str = "raw"

    #: The fused Triton kernel that serves this encoding on CUDA, named by its module under attention/
    #: ("triton_pope": the polar interface above; "triton_cope": kind "contextual" with `p_max`,
    #: `gate_source` and `fused_operands`), or None: no kernel, backend="triton" refuses the encoding.
    fused_kernel: ClassVar[str | None] = None
    #: Whether backend="auto" runs full-sequence calls (training, prefill) through `fused_kernel` on CUDA. False
    #: where SDPA on the encoding's transform_qk measured faster there; decode against a cache keeps the kernel.
    fused_kernel_for_full_sequences: ClassVar[bool] = True
    #: kind "bias" only: whether `bias` reads q (relative PE's q . e) or positions alone (ALiBi). A bias of
    #: positions alone, with no trainable parameter, is built once per shape and reused (and generated block
    #: by block on CPU); one that reads q is recomputed for every call, trained parameters or not.
    bias_reads_q: ClassVar[bool] = True

    @property
    def linear_form(self) -> str | None:
        """How this encoding enters linear attention (`linear_attention` of poskit.attention, RoFormer eq. 19), one
        of LINEAR_FORMS, or None when it cannot (may be overridden by a class attribute or a property):

        - "identity": it does not act inside attention (none; absolute encodings act on the embeddings, and
          attention refuses them).
        - "rotation": encode_q / encode_k (scale 1) are a position-dependent linear map that is applied to the
          non-negative *features* phi(q), phi(k): the numerator uses the mapped features, the normaliser the
          plain ones (RoFormer eq. 19; the rope family).
        - "polar": the encoding's own non-negative magnitudes (`magnitude(x)`) are the features and
          encode_q / encode_k of the raw q / k their Cartesian form, so the numerator is the real part of the
          complex inner product and the normaliser the inner product of the magnitudes (PoPE with softplus).

        Default: "identity" for kinds "none" and "absolute", None otherwise: a bias or a contextual encoding
        changes softmax logits, which linear attention does not have."""
        return "identity" if self.kind in ("none", "absolute") else None

    @property
    def position_coords(self) -> int:
        """Coordinates per position: 0 for scalar positions ((T,) or (B, T)); n >= 1 for axial positions with a
        trailing coordinate axis ((T, n) or (B, T, n), e.g. row and column of an image patch), which an
        encoding built with `axial_dims` declares. The fused kernels and the KV cache take scalar positions
        only; the engine routes axial ones to the paths that take them (reference, sdpa, blocked)."""
        return 0

    @property
    def needs_gate_keys(self) -> bool:
        """True when attention needs `gate_keys` (CoPE gates='separate'): the model then projects them (W_g)
        and the KV cache stores them beside the keys. Every other encoding refuses gate_keys."""
        return False

    #: Coordinates per position that a *model* may give this encoding (M-RoPE's 3: time, height, width); the
    #: model turns them into scalar text positions for attention plus per-token offsets that `encode` rotates
    #: into q and k (models/decoder.py, models/block.py). 0: the model gives scalar positions only.
    coordinate_axes: ClassVar[int] = 0
    #: A classmethod (options) -> the pattern of per-layer specs a model repeats over its layers ("*" is this
    #: encoding; irope's "none" on every k-th layer), or None: every layer of a model uses this encoding.
    layer_pattern: ClassVar = None

    def __init__(self, *, head_dim: int, num_heads: int):
        super().__init__()
        check_int(head_dim, "head_dim", minimum=1)
        check_int(num_heads, "num_heads", minimum=1)
        self.head_dim = head_dim
        self.num_heads = num_heads
        self._register_projection()

    def __setstate__(self, state):
        # copy.deepcopy and unpickling build a new object without __init__: it must be projected too
        super().__setstate__(state)
        self._register_projection()

    def _register_projection(self) -> None:
        if type(self).project_parameters_ is not PositionalEncoding.project_parameters_:
            project_after_each_step(self)

    # -- the public encode API: encode q and k, then call F.scaled_dot_product_attention yourself ---------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, positions=None, *, q_positions=None, k_positions=None):
        """`q_enc, k_enc = enc(q, k, positions)`: q and k with the position information applied, for
        `F.scaled_dot_product_attention(q_enc, k_enc, v, scale=enc.sdpa_scale(head_dim), ...)`.

        q (B, H, Tq, head_dim), k (B, H_kv, Tk, head_dim) -> (B, H, Tq, E), (B, H_kv, Tk, E) with
        E = qk_width * head_dim (PoPE's Cartesian form is 2 * head_dim wide: pass `sdpa_scale`, SDPA's default
        1/sqrt(E) would be wrong). positions: (T,) or (B, T) ints for both q and k (Tq == Tk), default arange;
        q_positions / k_positions give them apart (e.g. a decode step against a longer cache).
        Only encodings that act on q and k serve this (kind "qk"; "none" returns q and k unchanged); bias and
        contextual encodings (ALiBi, relative, CoPE) change the logits themselves and absolute ones the
        embeddings: those raise TypeError pointing to `poskit.attention` or `embed`.
        """
        if self.kind not in ("qk", "none"):
            use = ("add enc.embed(positions) to the token embeddings" if self.kind == "absolute" else
                   "use poskit.attention(q, k, v, enc, ...), which applies it inside the softmax")
            raise TypeError(f"the {self.kind} encoding {self.name or type(self).__name__!r} cannot be applied to q and "
                            f"k alone: {use}")
        if positions is not None and (q_positions is not None or k_positions is not None):
            raise ValueError("give either positions (shared by q and k) or q_positions/k_positions, not both")
        for name, x in (("q", q), ("k", k)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[-1] != self.head_dim:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be a (B, heads, T, {self.head_dim}) tensor, got {shape}")
        B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
        if positions is not None:
            if Tq != Tk:
                raise ValueError(f"positions is shared by q and k, which have {Tq} and {Tk} tokens: give q_positions "
                                 "and k_positions instead")
            q_positions = k_positions = positions
        coords = self.position_coords
        qp = as_position_tensor(q_positions, Tq, B, q.device, "q_positions" if positions is None else "positions",
                                coords=coords)
        kp = as_position_tensor(k_positions, Tk, B, k.device, "k_positions" if positions is None else "positions",
                                coords=coords)
        if self.kind == "none":
            return q, k
        return self.transform_qk(q, k, qp, kp)

    def sdpa_scale(self, head_dim: int | None = None) -> float:
        """The `scale` to give `F.scaled_dot_product_attention` with the outputs of `enc(q, k)`: 1/sqrt(head_dim)
        of the raw q and k, which is poskit.attention's default. SDPA's own default, 1/sqrt of the last dim of
        its inputs, differs for encodings that widen q and k (PoPE: 2 * head_dim). head_dim: the raw head dim,
        default (and checked against) the encoding's."""
        if head_dim is None:
            head_dim = self.head_dim
        check_int(head_dim, "head_dim", minimum=1)
        if head_dim != self.head_dim:
            raise ValueError(f"head_dim must be this encoding's head_dim={self.head_dim} (q and k before encoding), "
                             f"got {head_dim}")
        return head_dim ** -0.5

    # -- hooks (one per kind); the engine calls only the hook of `kind` --------------------
    def embed(self, positions: torch.Tensor) -> torch.Tensor:  # kind == "absolute"
        raise NotImplementedError

    def transform_qk(self, q, k, q_positions, k_positions):  # kind == "qk"
        """Return (q', k') such that logits = scale * q' @ k'^T. Positions are (1|B, T) int64.

        Default: (encode_q(q, q_positions), encode_k(k, k_positions)), for encodings that treat each token
        on its own; override when the encoding of one token depends on the others (rope-dynamic)."""
        return self.encode_q(q, q_positions), self.encode_k(k, k_positions)

    def encode_q(self, q, q_positions, scale: float = 1.0):  # kind == "qk", separable encodings
        """(B, H, T, head_dim) -> (B, H, T, qk_width * head_dim): `scale` times the encoded query (the fast
        paths fold the attention scale in here). Needed for qk_width > 1 and cache_form "encoded"."""
        raise NotImplementedError(f"{type(self).__name__} does not implement encode_q (needed by qk_width > 1 "
                                  "and cache_form 'encoded')")

    def encode_k(self, k, k_positions):  # kind == "qk", separable encodings
        """(B, Hkv, T, head_dim) -> (B, Hkv, T, qk_width * head_dim): the encoded key."""
        raise NotImplementedError(f"{type(self).__name__} does not implement encode_k (needed by qk_width > 1 "
                                  "and cache_form 'encoded')")

    def bias(self, q, q_positions, k_positions, scale):  # kind == "bias"
        """Additive logit bias broadcastable to (B, H, Tq, Tk), for the visible pairs."""
        raise NotImplementedError

    def gate_source(self, k, v, gate_keys):  # kind == "contextual"
        """The tensor the gates dot q with, (B, Hkv, Tk, head_dim); also validates gate_keys.
        Default: the keys, and gate_keys refused."""
        if gate_keys is not None:
            raise ValueError(f"gate_keys is only accepted by encodings that need them (cope, cope-alibi with "
                             f"gates='separate'), not by {self.name or type(self).__name__!r}")
        return k

    def contextual_bias(self, q, gate_logits, visible):  # kind == "contextual"
        """Additive logit bias (B, H, Tq, Tk) computed from the gate logits scale * q . gate_source."""
        raise NotImplementedError

    def check_positions(self, q_positions, k_positions, visible) -> None:
        """Raise ValueError for positions the encoding cannot represent (default: none)."""

    # -- frequency components (read by `poskit analyze frequency` and `analyze decay`) ------------------------
    def component_frequencies(self) -> torch.Tensor | None:
        """The angular frequency (radians per position) of each of the encoding's frequency components, a
        float64 (C,) tensor, or None when the encoding has none (the default: bias, contextual, absolute and
        "none" encodings). An encoding that returns frequencies also implements `component_magnitudes`, so
        that analyses of trained models read these two declarations instead of an encoding's name."""
        return None

    def component_magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """(..., head_dim) raw queries or keys (before encoding) -> (..., C): the magnitude each frequency
        component of `component_frequencies` gets from the content (RoPE: the 2-norm of a rotated pair; PoPE:
        the modulus of a complex feature). Position never changes it, which is why it is read before encoding."""
        raise NotImplementedError(f"{self.name or type(self).__name__!r} declares no frequency components")

    def project_parameters_(self) -> None:
        """Put the encoding's parameters back into their allowed set, in place, after an optimizer step
        (PoPE with delta_projection: delta into [-2 pi, 0]). Default: nothing to do. An encoding that defines it
        is projected after the step of any torch optimizer that holds its parameters, whichever loop trains it
        (encodings/projection.py), while `projects_parameters` is True."""

    def statistics(self) -> dict[str, float]:
        """Numbers about the encoding's learned parameters that the trainer records beside each evaluation
        (metrics.jsonl, {"step", "encoding": {module: statistics}}), so that how they move over training can be
        followed (PoPE: where its phase bias sits). Default: none."""
        return {}

    @property
    def projects_parameters(self) -> bool:
        """Whether the optimizer-step hook calls `project_parameters_` now (default: the class defines one)."""
        return type(self).project_parameters_ is not PositionalEncoding.project_parameters_

    @property
    def test_time_scalings(self) -> tuple[str, ...]:
        """The context-extension variants (encodings/rope_scaling.py) this encoding can be swapped for at test
        time by `with_scaling`, in a model trained without one (`poskit extrapolate --rope-scaling`). Default:
        none; plain RoPE declares every scaling."""
        return ()

    def with_scaling(self, scaling: str, **options) -> "PositionalEncoding":
        """This encoding with the test-time variant `scaling` (one of `test_time_scalings`) and that variant's
        `options`, its own options kept. Default: a ValueError, as the encoding declares none."""
        raise ValueError(f"encoding {self.name or type(self).__name__!r} takes no test-time scaling, got {scaling!r}")

    @classmethod
    def required_options(cls, options: dict) -> tuple[str, ...]:
        """Options without a default (no paper gives one, e.g. the scale factor of a context extension), given
        the registration's fixed options and the user's `options`: build_encoding lists every one that is
        missing in one error. Default: none (absolute encodings also need `dim`, added by build_encoding)."""
        return ()

    @classmethod
    def options_context(cls, options: dict) -> str:
        """Where the required options apply, for the missing-option error (e.g. " for rope scaling 'yarn'")."""
        return ""

    def extra_repr(self) -> str:
        return f"name={self.name!r}, head_dim={self.head_dim}, num_heads={self.num_heads}"


# Options shared by several encodings, validated once here so every encoding (present or future) rejects
# bad values with the same message; encodings check only what is specific to them (e.g. rotary_dim <= head_dim).
# None means "not given" (e.g. `factor` of plain rope), which the encoding itself handles.
OPTION_CHECKS: dict[str, Callable] = {
    "dim": lambda v: check_int(v, "dim", minimum=1),
    "base": lambda v: check_real(v, "base", minimum=1, strict=True),
    "factor": lambda v: check_real(v, "factor", minimum=1),
    "original_max_positions": lambda v: check_int(v, "original_max_positions", minimum=1),
    "max_positions": lambda v: check_int(v, "max_positions", minimum=1),
    "max_distance": lambda v: check_int(v, "max_distance", minimum=0),
    "p_max": lambda v: check_int(v, "p_max", minimum=1),
    "cache_rows": lambda v: check_int(v, "cache_rows", minimum=1),
    "init_std": lambda v: check_real(v, "init_std", minimum=0),
}


# What a required option means and a typical value, for the error that lists the missing ones (build_encoding).
# A required option: what it must be, what it means, and an example value (Python source), for the one error
# that lists every missing option (build_encoding).
OPTION_HELP: dict[str, tuple[str, str, str]] = {
    "dim": ("(the model width) must be an int >= 1", "absolute encodings add vectors this wide to the embeddings",
            "512"),
    "factor": ("must be a number >= 1", "the context extension s = L'/L, target over training length (paper 001)",
               "4.0"),
    "original_max_positions": ("(the training context) must be an int >= 1", "the length L the model was trained at",
                               "2048"),
    "low_freq_factor": ("must be a finite number > 0", "wavelengths above L / low_freq_factor are interpolated "
                        "(Llama 3.1: 1)", "1.0"),
    "high_freq_factor": ("must be a finite number > 0", "wavelengths below L / high_freq_factor are kept, > "
                         "low_freq_factor (Llama 3.1: 4)", "4.0"),
    "attention_factor": ("must be a finite number > 0", "multiplies cos and sin", "1.2"),
    "short_factor": ("must be a list of rotary_dim // 2 positive finite numbers",
                     "the divisors of the frequencies within the original context", "[1.0] * 32"),
    "long_factor": ("must be a list of rotary_dim // 2 positive finite numbers",
                    "the divisors of the frequencies past the original context", "[4.0] * 32"),
}


def _missing_line(option: str, context: str) -> str:
    if "|" in option:  # one of several: the first is the example
        choices = " or ".join(f"{a} ({OPTION_HELP[a][0]})" if a in OPTION_HELP else a for a in option.split("|"))
        return f"  needs {choices}{context}, got neither"
    if option in OPTION_HELP:
        return f"  {option} {OPTION_HELP[option][0]}{context}, got None: {OPTION_HELP[option][1]}"
    return f"  {option} must be given{context}"


def _missing_options_error(name: str, context: str, missing: list[str], given: dict) -> ValueError:
    lines = [_missing_line(o, context) for o in missing]
    firsts = [o.split("|")[0] for o in missing]
    example = {k: repr(v) for k, v in given.items()}
    example.update({o: OPTION_HELP[o][2] if o in OPTION_HELP else "..." for o in firsts})
    call = ", ".join(f"{k}={v}" for k, v in example.items())
    return ValueError(f"encoding {name!r} has no default for {len(missing)} option(s) {missing}:\n" + "\n".join(lines)
                      + f"\nfor example: poskit.build_encoding({name!r}, head_dim=64, num_heads=8, {call})")


_REGISTRY: dict[str, tuple[type[PositionalEncoding], dict]] = {}


def _check_declarations(cls: type) -> None:
    # a wrong declaration would send the engine down a path the encoding cannot serve: refuse it at registration
    if not (isinstance(cls, type) and issubclass(cls, PositionalEncoding)):
        raise TypeError(f"only PositionalEncoding subclasses can be registered, got {cls!r}")
    if cls.kind not in KINDS:
        raise ValueError(f"{cls.__name__}.kind must be one of {list(KINDS)}, got {cls.kind!r}")
    linear = cls.__dict__.get("linear_form", None)
    if isinstance(linear, str) and linear not in LINEAR_FORMS:
        raise ValueError(f"{cls.__name__}.linear_form must be one of {list(LINEAR_FORMS)} or None, got {linear!r}")
    if isinstance(cls.qk_width, bool) or not isinstance(cls.qk_width, int) or cls.qk_width < 1:
        raise ValueError(f"{cls.__name__}.qk_width must be an int >= 1, got {cls.qk_width!r}")
    form = cls.cache_form
    if isinstance(form, str) and (form not in CACHE_FORMS or (form != "raw" and cls.kind != "qk")):
        raise ValueError(f"{cls.__name__}.cache_form must be one of {list(CACHE_FORMS)} ('encoded' and "
                         f"'magnitude' for kind 'qk' only), got {form!r} for kind {cls.kind!r}")


def register(name: str, **fixed_options) -> Callable[[type], type]:
    """Register `cls` under `name`; `fixed_options` are passed to its constructor (variants)."""

    def deco(cls: type) -> type:
        if name in _REGISTRY:
            raise RuntimeError(f"encoding {name!r} registered twice")
        _check_declarations(cls)
        _REGISTRY[name] = (cls, fixed_options)
        return cls

    return deco


def unregister(name: str) -> None:
    """Remove `name` from the registry (encodings defined by tests or experiments, once done)."""
    if name not in _REGISTRY:
        raise ValueError(f"name must be one of {available_encodings()}, got {name!r}")
    del _REGISTRY[name]


def available_encodings() -> list[str]:
    """Names accepted by `build_encoding`."""
    return sorted(_REGISTRY)


def encoding_class(name: str) -> type[PositionalEncoding]:
    """The class registered as `name` (its declarations can be read without building an instance)."""
    if name not in _REGISTRY:
        raise ValueError(f"name must be one of {available_encodings()}, got {name!r}")
    return _REGISTRY[name][0]


def registered_names() -> list[str]:
    """Registered names in registration order (available_encodings() sorts them)."""
    return list(_REGISTRY)


# the parameters every encoding takes from the model, never as options (build_encoding's own arguments)
MODEL_ARGUMENTS = frozenset({"head_dim", "num_heads", "dim"})


def _allowed_options(cls: type) -> list[str]:
    params = inspect.signature(cls.__init__).parameters
    return [p for p, v in params.items() if p != "self" and v.kind == v.KEYWORD_ONLY]


def allowed_options(name: str) -> list[str]:
    """The options `build_encoding(name, ...)` (and an EncodingSpec of `name`) may set: the keyword-only
    arguments of its class, less those its registration fixes and those the model passes (MODEL_ARGUMENTS)."""
    encoding_class(name)  # an unknown name: ValueError listing the known ones
    cls, fixed = _REGISTRY[name]
    return sorted(set(_allowed_options(cls)) - set(fixed) - MODEL_ARGUMENTS)


@functools.lru_cache(maxsize=None)
def _option_types(cls: type) -> dict:
    """Each keyword-only option of `cls` and its annotation, resolved where it can be (under postponed
    annotations it is a string such as "bool | None")."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve: the raw one below
        hints = {}
    params = inspect.signature(cls.__init__).parameters
    return {p: hints.get(p, v.annotation) for p, v in params.items() if v.kind == v.KEYWORD_ONLY}


def _is_optional(annotation, tp: type) -> bool:
    """Whether `annotation` is `tp | None` (or Optional[tp]; for dict, also dict[...] | None)."""
    if isinstance(annotation, str):  # unresolved
        return annotation.replace(" ", "") in (f"{tp.__name__}|None", f"None|{tp.__name__}", f"Optional[{tp.__name__}]")
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False
    args = typing.get_args(annotation)
    rest = [a for a in args if a is not type(None)]
    return len(rest) == 1 < len(args) and (rest[0] is tp or typing.get_origin(rest[0]) is tp)


def _bool_options(cls: type) -> set[str]:
    """The options `cls` declares as booleans: annotated `bool` (a string under postponed annotations) or
    defaulting to True/False. Found from the signature so that a new encoding's flags are checked too."""
    params = inspect.signature(cls.__init__).parameters
    return {p for p, v in params.items()
            if v.kind == v.KEYWORD_ONLY and (v.annotation in (bool, "bool") or isinstance(v.default, bool))}


def _optional_bool_options(cls: type) -> set[str]:
    """The options annotated `bool | None`: true, false, or None for the encoding's own default (RoPE's
    truncate and rope_interleave)."""
    return {p for p, tp in _option_types(cls).items() if _is_optional(tp, bool)}


def _dict_options(cls: type) -> set[str]:
    """The options annotated `dict` or `dict | None` (RoPE's HF dicts rope_scaling and rope_parameters)."""
    return {p for p, tp in _option_types(cls).items()
            if tp in (dict, "dict") or typing.get_origin(tp) is dict or _is_optional(tp, dict)}


def build_encoding(name: str, *, head_dim: int, num_heads: int, dim: int | None = None, **options) -> PositionalEncoding:
    """Build the encoding registered as `name` (see `available_encodings()`).

    `dim` (the model width) is required by absolute encodings and ignored by the others.
    Unknown options raise ValueError listing the allowed ones; options without a default (`required_options`,
    e.g. rope-yarn's factor and original_max_positions) raise one ValueError listing every missing one.
    """
    if name not in _REGISTRY:
        raise ValueError(f"name must be one of {available_encodings()}, got {name!r}")
    cls, fixed = _REGISTRY[name]
    allowed = allowed_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for encoding {name!r}; allowed options: {allowed}")
    kwargs = dict(fixed, **options)
    # every option without a default that is missing, in one error with an example call (not one at a time)
    required = (("dim",) if cls.kind == "absolute" else ()) + tuple(cls.required_options(dict(kwargs)))
    # an entry "a|b" is satisfied by either option
    missing = [o for o in required if all((dim if a == "dim" else kwargs.get(a)) is None for a in o.split("|"))]
    if missing:
        raise _missing_options_error(name, cls.options_context(dict(kwargs)), missing,
                                     {k: v for k, v in options.items() if v is not None})
    if cls.kind == "absolute":
        kwargs["dim"] = dim
    flags, optional_flags = _bool_options(cls), _optional_bool_options(cls)
    for option, value in kwargs.items():
        if option in flags or (option in optional_flags and value is not None):
            check_bool(value, option)
        elif value is not None and option in OPTION_CHECKS:
            OPTION_CHECKS[option](value)
    enc = cls(head_dim=head_dim, num_heads=num_heads, **kwargs)
    enc.name = name
    return enc


def as_position_tensor(positions, length: int, batch: int, device, argname: str, coords: int = 0) -> torch.Tensor:
    """Normalise positions to an int64 tensor of shape (1, T) or (B, T); default arange(T).

    coords > 0 (an encoding with axial positions, `position_coords`): positions carry a trailing coordinate
    axis, (T, coords) or (B, T, coords) -> (1|B, T, coords); there is no default (no natural order of the
    coordinates), and scalar positions are refused."""
    if coords:
        return _axial_position_tensor(positions, length, batch, device, argname, coords)
    if positions is None:
        return torch.arange(length, device=device).unsqueeze(0)
    positions = _integer_tensor(positions, device, argname)
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    if positions.dim() != 2 or positions.shape[-1] != length or positions.shape[0] not in (1, batch):
        axial = (" (positions with a trailing coordinate axis need an encoding built with axial_dims)"
                 if positions.dim() == 3 else "")
        raise ValueError(
            f"{argname} must have shape ({length},) or ({batch}, {length}) to match the sequence, got "
            f"{tuple(positions.shape)}{axial}"
        )
    return positions


def _integer_tensor(positions, device, argname: str) -> torch.Tensor:
    """`positions` as an int64 tensor on `device`; floats, bools and complex numbers are refused, not rounded."""
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
        raise ValueError(f"{argname} must be an integer tensor, got dtype {positions.dtype}")
    return positions.long()


def _axial_position_tensor(positions, length: int, batch: int, device, argname: str, coords: int) -> torch.Tensor:
    shapes = f"({length}, {coords}) or ({batch}, {length}, {coords})"
    if positions is None:
        raise ValueError(f"{argname} must be given for an encoding with axial_dims ({coords} coordinates per "
                         f"position): an int tensor of shape {shapes}, e.g. the (row, column) of each patch")
    positions = _integer_tensor(positions, device, argname)
    if positions.dim() == 2:
        positions = positions.unsqueeze(0)
    if (positions.dim() != 3 or positions.shape[1] != length or positions.shape[0] not in (1, batch)
            or positions.shape[2] != coords):
        raise ValueError(f"{argname} must have shape {shapes}: the encoding's axial_dims has {coords} entries, one "
                         f"per coordinate; got {tuple(positions.shape)}")
    return positions
