"""Detects an encoding whose trainable parameters no model trains: one never registered in any nn.Module.

An encoding is an nn.Module with parameters (PoPE's phase bias, CoPE's position embeddings, relative and
learned tables). Built at module level and handed to `poskit.attention()`, it is in no model, so
`model.parameters()` leaves it out, the optimizer never updates it, and it stays at its initial values (CoPE's
embeddings at zero) without any error. torch's global module-registration hook marks every encoding assigned
as a submodule of any nn.Module. When attention() runs with gradients on an encoding that was never so
assigned, its trainable parameters get a gradient hook, and the first gradient that reaches one of them while
the encoding is still in no module warns, once per encoding: a forward pass alone (inference) says nothing,
a backward pass means someone is training.
"""
from __future__ import annotations

import warnings
import weakref

import torch
from torch.nn.modules.module import register_module_module_registration_hook

from .base import PositionalEncoding

_IN_A_MODULE = "_poskit_in_a_module"  # set on an encoding once some nn.Module registers it as a submodule
_WATCHED = "_poskit_watched_untrained"  # its parameters carry the gradient hook
_WARNED = "_poskit_warned_untrained"


class UntrainedEncodingWarning(UserWarning):
    """An encoding with trainable parameters is used with gradients on but belongs to no nn.Module."""


def _mark(module, name, submodule):
    # poskit's own short-lived wrappers (a class attribute `wraps_temporarily`) hold an encoding for one call:
    # that makes it no model's
    if isinstance(submodule, PositionalEncoding) and not getattr(module, "wraps_temporarily", False):
        submodule.__dict__[_IN_A_MODULE] = True
    return None  # keep the submodule as given


_HOOK = register_module_module_registration_hook(_mark)


def in_a_module(enc: PositionalEncoding) -> bool:
    """Whether `enc` has been registered as a submodule of some nn.Module (so a model's parameters() may hold it)."""
    return enc.__dict__.get(_IN_A_MODULE, False)


def warn_if_untrained(enc: PositionalEncoding) -> None:
    """Called by attention: when gradients are on and `enc`, in no nn.Module, has parameters that require grad,
    hook them so that the first gradient reaching one while `enc` is still in no module warns (once per
    encoding): no optimizer built from a model's parameters() would ever update them."""
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return
    state = enc.__dict__
    if state.get(_IN_A_MODULE, False) or state.get(_WATCHED, False):
        return
    params = [p for p in enc.parameters() if p.requires_grad]
    if not params:
        return
    state[_WATCHED] = True
    encoding = weakref.ref(enc)  # the hooks must not keep a dropped encoding alive

    def on_gradient(grad):
        e = encoding()
        if e is not None and not e.__dict__.get(_IN_A_MODULE, False) and not e.__dict__.get(_WARNED, False):
            e.__dict__[_WARNED] = True
            name = e.name or type(e).__name__
            warnings.warn(f"the encoding {name!r} has trainable parameters but is not part of any nn.Module, so "
                          "no model.parameters() includes them and they never train: assign it as an attribute "
                          "of your nn.Module (e.g. self.enc = enc)", UntrainedEncodingWarning, stacklevel=2)
        return None

    for p in params:
        p.register_hook(on_gradient)
