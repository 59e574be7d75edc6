"""Calling a torch.autograd.Function without autograd's bookkeeping where no backward can follow."""
from __future__ import annotations

import torch


class _ForwardOnly:
    """The ctx a Function's forward gets when no backward will run: what it saves is dropped, attributes it sets are
    kept and never read, and no input needs a gradient."""

    def __init__(self, inputs: int):
        self.needs_input_grad = (False,) * inputs

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value: bool):
        pass


def call(function: type[torch.autograd.Function], *args):
    """function.apply(*args), or its forward run directly where nothing needs a gradient (grad mode off, or no
    tensor argument requiring one): Function.apply costs tens of microseconds of Python per call (wrapping,
    unwrapping, the graph node), which a decode step or a small call pays several times over. The forward runs
    with grad mode off, as under apply, so that what it computes records no graph either way. Under
    torch.compile the Function is applied as usual, so that what is traced does not change."""
    # inside a forward-AD level a tangent may ride on any argument: apply, which refuses what it cannot carry
    if torch.compiler.is_compiling() or torch.autograd.forward_ad._current_level >= 0 or (
            torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
        return function.apply(*args)
    with torch.no_grad():
        return function.forward(_ForwardOnly(len(args)), *args)
