"""Every positional encoding, one module per family; importing this package registers them all."""
from . import absolute_registry  # noqa: F401  (registers sinusoidal, learned, legendre)
from . import alibi, cope, none, pope, relative, rotary  # noqa: F401
from . import dynamic, fire, kerple, t5, xpos  # noqa: F401  (the field's other encodings)
from .base import KINDS, PositionalEncoding, available_encodings, build_encoding, register
from .projection import project_parameters_

DEFAULT_ENCODING = "rope"  # what a model uses unless its config names another

__all__ = ["DEFAULT_ENCODING", "KINDS", "PositionalEncoding", "available_encodings", "build_encoding", "project_parameters_",
           "register"]
