"""The contract every positional encoding follows, and the registry behind `build_encoding`.

An encoding declares *how* it enters attention through its `kind`; the attention engine
dispatches on that, so adding an encoding touches only its own module:

- ``"none"``       : contributes nothing.
- ``"absolute"``   : vectors added to the token embeddings (`embed(positions)`); identity in attention.
- ``"qk"``         : transforms q and k before the dot product (`transform_qk`), e.g. RoPE, PoPE.
- ``"bias"``       : an additive bias on the logits computed from positions (and possibly q), e.g. ALiBi.
- ``"contextual"`` : a bias computed from the logits themselves (gates), e.g. CoPE.
"""
from __future__ import annotations

import inspect
import math
import numbers
from typing import Callable, ClassVar

import torch
from torch import nn

KINDS = ("none", "absolute", "qk", "bias", "contextual")


class PositionalEncoding(nn.Module):
    """Base class. Subclasses set `kind` and implement the hook of their kind."""

    kind: ClassVar[str] = "none"
    #: registry name this instance was built under (set by build_encoding)
    name: str = ""

    def __init__(self, *, head_dim: int, num_heads: int):
        super().__init__()
        check_int(head_dim, "head_dim", minimum=1)
        check_int(num_heads, "num_heads", minimum=1)
        self.head_dim = head_dim
        self.num_heads = num_heads

    # -- hooks (one per kind); the engine calls only the hook of `kind` --------------------
    def embed(self, positions: torch.Tensor) -> torch.Tensor:  # kind == "absolute"
        raise NotImplementedError

    def transform_qk(self, q, k, q_positions, k_positions):  # kind == "qk"
        """Return (q', k') such that logits = scale * q' @ k'^T. Positions are (1|B, T) int64."""
        raise NotImplementedError

    def bias(self, q, q_positions, k_positions, scale):  # kind == "bias"
        """Additive logit bias broadcastable to (B, H, Tq, Tk), for the visible pairs."""
        raise NotImplementedError

    def check_positions(self, q_positions, k_positions, visible) -> None:
        """Raise ValueError for positions the encoding cannot represent (default: none)."""

    def extra_repr(self) -> str:
        return f"name={self.name!r}, head_dim={self.head_dim}, num_heads={self.num_heads}"


def check_int(value, name: str, *, minimum: int) -> int:
    """Raise ValueError unless `value` is an int >= minimum. bool is refused although Python counts it as an
    int: `num_heads=True` is a mistake, never a size."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_real(value, name: str, *, minimum: float, strict: bool = False) -> float:
    """Raise ValueError unless `value` is a finite real number >= minimum (> minimum when strict); bool refused."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= minimum if strict else value < minimum):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


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


_REGISTRY: dict[str, tuple[type[PositionalEncoding], dict]] = {}


def register(name: str, **fixed_options) -> Callable[[type], type]:
    """Register `cls` under `name`; `fixed_options` are passed to its constructor (variants)."""

    def deco(cls: type) -> type:
        if name in _REGISTRY:
            raise RuntimeError(f"encoding {name!r} registered twice")
        _REGISTRY[name] = (cls, fixed_options)
        return cls

    return deco


def available_encodings() -> list[str]:
    """Names accepted by `build_encoding`."""
    return sorted(_REGISTRY)


def _allowed_options(cls: type) -> list[str]:
    params = inspect.signature(cls.__init__).parameters
    return [p for p, v in params.items() if p != "self" and v.kind == v.KEYWORD_ONLY]


def _bool_options(cls: type) -> set[str]:
    """The options `cls` declares as booleans: annotated `bool` (a string under postponed annotations) or
    defaulting to True/False. Found from the signature so that a new encoding's flags are checked too."""
    params = inspect.signature(cls.__init__).parameters
    return {p for p, v in params.items()
            if v.kind == v.KEYWORD_ONLY and (v.annotation in (bool, "bool") or isinstance(v.default, bool))}


def check_bool(value, name: str) -> bool:
    """Raise ValueError unless `value` is a real bool: bool("false") is True, so strings (and 0/1) are refused
    rather than guessed at; the CLI parses its own true/false words before calling here."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false (a bool), got {value!r}")
    return value


def build_encoding(name: str, *, head_dim: int, num_heads: int, dim: int | None = None, **options) -> PositionalEncoding:
    """Build the encoding registered as `name` (see `available_encodings()`).

    `dim` (the model width) is required by absolute encodings and ignored by the others.
    Unknown options raise ValueError listing the allowed ones.
    """
    if name not in _REGISTRY:
        raise ValueError(f"name must be one of {available_encodings()}, got {name!r}")
    cls, fixed = _REGISTRY[name]
    allowed = set(_allowed_options(cls)) - set(fixed) - {"head_dim", "num_heads", "dim"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for encoding {name!r}; allowed options: {sorted(allowed)}")
    kwargs = dict(fixed, **options)
    if cls.kind == "absolute":
        if dim is None:
            raise ValueError(f"dim (the model width) is required for the absolute encoding {name!r}")
        kwargs["dim"] = dim
    flags = _bool_options(cls)
    for option, value in kwargs.items():
        if option in flags:
            check_bool(value, option)
        elif value is not None and option in OPTION_CHECKS:
            OPTION_CHECKS[option](value)
    enc = cls(head_dim=head_dim, num_heads=num_heads, **kwargs)
    enc.name = name
    return enc


def as_position_tensor(positions, length: int, batch: int, device, argname: str) -> torch.Tensor:
    """Normalise positions to an int64 tensor of shape (1, T) or (B, T); default arange(T)."""
    if positions is None:
        return torch.arange(length, device=device).unsqueeze(0)
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
        raise ValueError(f"{argname} must be an integer tensor, got dtype {positions.dtype}")
    positions = positions.long()
    if positions.dim() == 1:
        positions = positions.unsqueeze(0)
    if positions.dim() != 2 or positions.shape[-1] != length or positions.shape[0] not in (1, batch):
        raise ValueError(
            f"{argname} must have shape ({length},) or ({batch}, {length}) to match the sequence, got {tuple(positions.shape)}"
        )
    return positions
