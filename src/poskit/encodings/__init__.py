"""Every positional encoding, one module per family; importing this package registers them all."""
from . import alibi, cope, learned, legendre, none, pope, relative, rotary, sinusoidal  # noqa: F401  (they register)
from . import dynamic, fire, irope, kerple, mrope, t5, xpos  # noqa: F401  (the field's other encodings)
from . import registration  # noqa: F401  (marks encodings registered in a module: registration.py says why)
from .base import KINDS, PositionalEncoding, available_encodings, build_encoding, register
from .projection import project_parameters_
from .spec import EncodingSpec

DEFAULT_ENCODING = "rope"  # what a model uses unless its config names another

__all__ = ["DEFAULT_ENCODING", "EncodingSpec", "KINDS", "PositionalEncoding", "available_encodings", "build_encoding", "project_parameters_",
           "register"]
