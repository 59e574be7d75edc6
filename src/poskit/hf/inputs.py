"""Checks of the inputs transformers users hand to `PoskitForCausalLM.forward`: exactly one of input_ids and
inputs_embeds, and explicit position_ids, each refused naming the argument before anything runs."""
from __future__ import annotations

import torch


def check_token_inputs(input_ids, inputs_embeds, hidden_size: int, vocab_size: int | None = None) -> None:
    """input_ids (B, T) integers (in [0, vocab_size) when given) or inputs_embeds (B, T, hidden_size) floats:
    exactly one of the two."""
    if (input_ids is None) == (inputs_embeds is None):
        given = "both" if input_ids is not None else "neither"
        raise ValueError(f"pass exactly one of input_ids ((B, T) token ids) and inputs_embeds ((B, T, {hidden_size}) "
                         f"vectors), got {given}")
    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point() \
                or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be a (B, T) integer tensor of token ids, got {_describe(input_ids)}")
        if vocab_size is not None and input_ids.numel():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= vocab_size:
                raise ValueError(f"input_ids must be token ids in [0, {vocab_size - 1}] (vocab_size {vocab_size}), "
                                 f"got ids in [{low}, {high}]")
        return
    if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() != 3 \
            or inputs_embeds.shape[-1] != hidden_size or not inputs_embeds.is_floating_point():
        raise ValueError(f"inputs_embeds must be a floating (B, T, {hidden_size}) tensor (hidden_size {hidden_size}), "
                         f"got {_describe(inputs_embeds)}")


def check_position_ids(position_ids, batch: int, length: int) -> None:
    """position_ids None, or a (batch, length) or (1, length) integer tensor with no negative entry."""
    if position_ids is None:
        return
    shapes = f"({batch}, {length})" + (f" or (1, {length})" if batch != 1 else "")
    if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or position_ids.is_complex() \
            or position_ids.dtype == torch.bool:
        raise ValueError(f"position_ids must be an integer tensor of shape {shapes}, got {_describe(position_ids)}")
    if position_ids.dim() != 2 or position_ids.shape[1] != length or position_ids.shape[0] not in (1, batch):
        raise ValueError(f"position_ids must have shape {shapes} (one position per new token), got "
                         f"{tuple(position_ids.shape)}")
    if position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got a minimum of {int(position_ids.min())}")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
