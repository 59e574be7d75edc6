"""Detects an encoding whose trainable parameters no model trains: one never registered in any nn.Module.

An encoding is an nn.Module with parameters (PoPE's phase bias, CoPE's position embeddings, relative and
learned tables). Built at module level and handed to `poskit.attention()`, it is in no model, so
`model.parameters()` leaves it out, the optimizer never updates it, and it stays at its initial values (CoPE's
embeddings at zero) without any error. torch's global module-registration hook marks every encoding assigned
as a submodule of any nn.Module; attention() warns once per encoding that was never so assigned when it runs
with gradients on and the encoding has parameters that require grad.
"""
from __future__ import annotations

import warnings

import torch
from torch.nn.modules.module import register_module_module_registration_hook

from .base import PositionalEncoding

_IN_A_MODULE = "_poskit_in_a_module"  # set on an encoding once some nn.Module registers it as a submodule
_WARNED = "_poskit_warned_untrained"


class UntrainedEncodingWarning(UserWarning):
    """An encoding with trainable parameters is used with gradients on but belongs to no nn.Module."""


def _mark(module, name, submodule):
    if isinstance(submodule, PositionalEncoding):
        submodule.__dict__[_IN_A_MODULE] = True
    return None  # keep the submodule as given


_HOOK = register_module_module_registration_hook(_mark)


def in_a_module(enc: PositionalEncoding) -> bool:
    """Whether `enc` has been registered as a submodule of some nn.Module (so a model's parameters() may hold it)."""
    return enc.__dict__.get(_IN_A_MODULE, False)


def warn_if_untrained(enc: PositionalEncoding) -> None:
    """Warn (once per encoding) when attention runs with gradients on an encoding whose trainable parameters
    belong to no nn.Module: no optimizer built from a model's parameters() would ever update them."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return
    state = enc.__dict__
    if state.get(_IN_A_MODULE, False) or state.get(_WARNED, False):
        return
    if any(p.requires_grad for p in enc.parameters()):
        state[_WARNED] = True
        name = enc.name or type(enc).__name__
        warnings.warn(f"the encoding {name!r} has trainable parameters but is not part of any nn.Module, so no "
                      "model.parameters() includes them and they never train: assign it as an attribute of your "
                      "nn.Module (e.g. self.enc = enc)", UntrainedEncodingWarning, stacklevel=3)
