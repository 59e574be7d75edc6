"""Encoding parameters kept in their allowed set after every optimizer step, in any training loop.

Some encodings bound a parameter (PoPE's phase bias delta to [-2 pi, 0]). The bound always applies in the
forward pass (a clamp). An encoding may also ask for its parameter to be *projected* back into the set after
each optimizer step (PoPE's `delta_projection=True`); which reading is right is a modelling choice that
docs/reproductions.md measures, so both are kept.

The projection is the encoding's own behaviour, not a trainer's: an encoding that asks for it is recorded here
when it is built, and one hook registered on every torch optimizer (`register_optimizer_step_post_hook`) clamps
the recorded parameters that the stepping optimizer holds. So poskit's trainer, a user's own loop and the
Hugging Face `Trainer` train the same model the same way, with nothing to call.

`project_parameters_(model)` does the same projection by hand (idempotent; kept for code that calls it).
"""
from __future__ import annotations

import weakref

from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

# encodings with a projection (weak: a dropped model is forgotten)
_PROJECTED: weakref.WeakSet = weakref.WeakSet()
_HOOK = None


def project_after_each_step(enc) -> None:
    """Call `enc.project_parameters_()` after every step of any torch optimizer that holds one of its own
    parameters, whenever `enc.projects_parameters` says so (PoPE: its delta_projection option). Called by
    PositionalEncoding for every encoding that defines a projection, when it is built and when it is copied
    or unpickled (copies are new objects)."""
    global _HOOK
    _PROJECTED.add(enc)
    if _HOOK is None:
        _HOOK = register_optimizer_step_post_hook(_after_step)


def _after_step(optimizer, args, kwargs) -> None:
    if not any(enc.projects_parameters for enc in _PROJECTED):
        return  # nothing asks for projection: skip collecting the optimizer's parameters
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for enc in list(_PROJECTED):
        # parameters are looked up now, not when the encoding was built: FSDP and load_state_dict(assign=True)
        # replace Parameter objects
        if enc.projects_parameters and any(id(p) in held for p in enc.parameters(recurse=False)):
            enc.project_parameters_()


def project_parameters_(model: nn.Module) -> int:
    """Call `project_parameters_()` on every PositionalEncoding inside `model` (or on `model` itself when it
    is one); returns how many encodings were visited. Cheap (an in-place clamp of small tensors). Optimizer
    steps already do this for encodings that ask for projection; calling it again changes nothing."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    # every PositionalEncoding has the method (base: a no-op); read by name so that this module needs no base
    encodings = [m for m in model.modules() if callable(getattr(m, "project_parameters_", None))]
    for enc in encodings:
        enc.project_parameters_()
    return len(encodings)
