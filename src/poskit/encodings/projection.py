"""`project_parameters_(model)`: the one call that keeps every encoding's parameters in their allowed set.

Some encodings constrain a parameter to a set (PoPE's phase bias delta to [-2 pi, 0]) by clamping it in the
forward pass. A clamp passes no gradient to an entry outside the set, so an entry that one optimizer step
pushes out never comes back. Projecting the parameters back after every step keeps them all trainable:

    loss.backward(); optimizer.step(); poskit.encodings.project_parameters_(model)
"""
from __future__ import annotations

from torch import nn

from .base import PositionalEncoding


def project_parameters_(model: nn.Module) -> int:
    """Call `project_parameters_()` on every PositionalEncoding inside `model` (or on `model` itself when it
    is one); returns how many encodings were visited. Cheap (an in-place clamp of small tensors)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    encodings = [m for m in model.modules() if isinstance(m, PositionalEncoding)]
    for enc in encodings:
        enc.project_parameters_()
    return len(encodings)
