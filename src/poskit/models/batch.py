"""The one batch type at the model boundary: the inputs, their positions and which tokens are real.

A model's entry point (`Transformer.forward`, `EncoderDecoder.encode` / `decode`, `poskit.nn.Attention`) builds
a `ModelBatch` once from whatever the caller has: a Hugging Face `attention_mask` of 0/1, a bool padding mask,
explicit positions, a KV cache to continue, or nothing. The layers below receive its `positions` and `real`
unchanged (nothing under the boundary converts a mask or derives positions again), and the attention engine
gets the one mask form it takes for padding: `real`, True = a real key.

Positions follow one rule (`positions_for`): explicit positions win; a cached sequence continues after its last
real cached token; a padded sequence counts only its real tokens (it gets the positions it has alone);
otherwise 0, 1, 2, ...
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.kv_cache import KVCache, LayerCache
from ..attention.padding import padded_positions, real_token_mask


@dataclass(frozen=True)
class ModelBatch:
    """inputs: (B, T) token ids, or (B, T, d) vectors in place of their embeddings.
    positions: (1|B, T) int64 positions of the tokens ((1|B, T, n) for an encoding with axial positions), or
    None where the caller gave none and nothing needs them (the engine then uses arange(T)).
    real: (B, T) bool, True = a real token, False = padding (hidden as a key from every query); None when
    every token is real."""

    inputs: torch.Tensor
    positions: torch.Tensor | None
    real: torch.Tensor | None

    @property
    def size(self) -> int:
        return self.inputs.shape[0]

    @property
    def length(self) -> int:
        return self.inputs.shape[1]


def real_tokens(attention_mask, batch: int, length: int, device, *, cache: KVCache | None = None,
                name: str = "attention_mask") -> torch.Tensor | None:
    """(batch, length) bool, True = real token, of the new tokens; None without a mask.

    attention_mask: (batch, length) bools or 0/1 ints (Hugging Face's convention); with a filled cache also
    Hugging Face's (batch, cached + length), whose cached part must equal the padding the cache stores."""
    if attention_mask is None:
        return None
    past = cache.length if cache is not None else 0
    try:
        if past and isinstance(attention_mask, torch.Tensor) and tuple(attention_mask.shape) == (batch, past + length):
            full = real_token_mask(attention_mask, batch, past + length, device)
            stored = cache.layer(0).key_mask
            if stored is None:
                stored = torch.ones(batch, past, dtype=torch.bool, device=device)
            if not torch.equal(full[:, :past], stored.expand(batch, past)):
                raise ValueError("attention_mask's first cache.length columns must equal the padding already stored "
                                 "in the cache (or give only the (B, T) mask of the new tokens)")
            return full[:, past:]
        return real_token_mask(attention_mask, batch, length, device)
    except ValueError as e:
        if name == "attention_mask":
            raise
        raise ValueError(f"{name}: {e}") from None


def continue_positions(layer: LayerCache, real: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """Positions of `length` new tokens continuing a cache `layer`: each row after its last real cached token
    (pads, now or in the cache, are not counted); (T,) when the cached positions are shared by every row."""
    if real is None and layer.key_mask is None:
        if not layer.length:
            return torch.arange(length, device=device)
        start = layer.next_positions()  # (1,) when the cached positions are shared by every row, else (B,)
        if start.shape[0] == 1:
            return torch.arange(int(start), int(start) + length, device=device)
        return start[:, None] + torch.arange(length, device=device)
    start = layer.next_positions() if layer.length else None
    if real is None:
        real = torch.ones(layer.keys.shape[0], length, dtype=torch.bool, device=device)
    return padded_positions(real, start)


def positions_for(length: int, device, *, real: torch.Tensor | None = None, cache: KVCache | None = None,
                  layer_idx: int = 0, arange: bool = True) -> torch.Tensor | None:
    """The default positions of `length` new tokens (see the module docstring); (T,) or (B, T) int64. Without
    a cache or padding: arange(length), or None when `arange` is False (the engine's own default)."""
    if cache is not None:
        return continue_positions(cache.layer(layer_idx), real, length, device)
    if real is not None:
        return padded_positions(real)
    return torch.arange(length, device=device) if arange else None


def as_batch_positions(positions, batch: int, length: int, device, name: str = "positions") -> torch.Tensor:
    """`positions` (T,) or (B, T) as a (1|B, T) int64 tensor on `device`, or a ValueError naming `name`."""
    positions = torch.as_tensor(positions, device=device).long()
    positions = positions.unsqueeze(0) if positions.dim() == 1 else positions
    if positions.dim() != 2 or positions.shape[-1] != length or positions.shape[0] not in (1, batch):
        raise ValueError(f"{name} must have shape ({length},) or ({batch}, {length}), got {tuple(positions.shape)}")
    return positions


def build_batch(inputs: torch.Tensor, *, positions=None, attention_mask=None, cache: KVCache | None = None,
                mask_name: str = "attention_mask", positions_name: str = "positions") -> ModelBatch:
    """The ModelBatch of a model's call: `inputs` (B, T) ids or (B, T, d) vectors (checked by the caller),
    the real tokens from `attention_mask` (and the cache's stored padding), and positions: the given ones as
    (1|B, T), or the default of `positions_for`."""
    B, T = inputs.shape[:2]
    device = inputs.device
    real = real_tokens(attention_mask, B, T, device, cache=cache, name=mask_name)
    if positions is None:
        positions = positions_for(T, device, real=real, cache=cache)
    return ModelBatch(inputs, as_batch_positions(positions, B, T, device, positions_name), real)
