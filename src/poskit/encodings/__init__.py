"""Every positional encoding, one module per family; importing this package registers them all."""
from . import absolute_registry  # noqa: F401  (registers sinusoidal, learned, legendre)
from . import alibi, cope, none, pope, relative, rotary  # noqa: F401
from .base import KINDS, PositionalEncoding, available_encodings, build_encoding, register

__all__ = ["KINDS", "PositionalEncoding", "available_encodings", "build_encoding", "register"]
