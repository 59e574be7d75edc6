"""Key/value cache for incremental decoding, for every encoding kind.

The cache stores, per layer, the keys and values appended so far with their positions. Keys are stored
raw (before the encoding) by default: that is what CoPE needs (its gates are recomputed per query from
raw keys), what dynamic NTK needs (its frequencies change with the length), and what keeps ALiBi /
relative / none exact. For static rotary encodings (rope and pope) the engine may store the encoded key
instead (`store_encoded_keys`), which saves re-encoding the whole cache at every step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LayerCache:
    keys: torch.Tensor | None = None  # (B, Hkv, T, D) raw keys, or encoded keys when `encoded` is True
    values: torch.Tensor | None = None  # (B, Hkv, T, Dv)
    positions: torch.Tensor | None = None  # (1|B, T) int64
    gate_keys: torch.Tensor | None = None  # (B, Hkv, T, D), CoPE separate gates only
    encoded: bool = False

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


def _cat(old, new, dim):
    return new if old is None else torch.cat((old, new), dim=dim)


@dataclass
class KVCache:
    """Per-layer caches, created empty; `append` grows one layer and returns the full tensors."""

    num_layers: int
    layers: list[LayerCache] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {self.num_layers!r}")
        self.layers = [LayerCache() for _ in range(self.num_layers)]

    def layer(self, idx: int) -> LayerCache:
        if not 0 <= idx < self.num_layers:
            raise ValueError(f"layer index must be in [0, {self.num_layers - 1}], got {idx}")
        return self.layers[idx]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def next_position(self) -> int:
        """The position after the last cached one (0 for an empty cache)."""
        pos = self.layers[0].positions
        return 0 if pos is None else int(pos.max()) + 1

    def append(self, idx: int, keys, values, positions, gate_keys=None, encoded: bool = False) -> LayerCache:
        c = self.layer(idx)
        if c.keys is not None:
            if c.encoded != encoded:
                raise ValueError("a layer cache cannot mix raw and encoded keys")
            if keys.shape[:2] != c.keys.shape[:2] or keys.shape[-1] != c.keys.shape[-1]:
                raise ValueError(f"keys must have shape {tuple(c.keys.shape[:2])} + (T, {c.keys.shape[-1]}) to extend the cache, got {tuple(keys.shape)}")
        positions = positions if positions.dim() == 2 else positions.unsqueeze(0)
        if c.positions is not None and positions.shape[0] != c.positions.shape[0]:
            # mixing shared (1, T) and per-batch (B, T) positions: broadcast both to (B, T)
            b = max(positions.shape[0], c.positions.shape[0])
            c.positions = c.positions.expand(b, -1)
            positions = positions.expand(b, -1)
        c.keys, c.values = _cat(c.keys, keys, 2), _cat(c.values, values, 2)
        c.positions = _cat(c.positions, positions, 1)
        if gate_keys is not None:
            c.gate_keys = _cat(c.gate_keys, gate_keys, 2)
        c.encoded = encoded
        return c

    def reset(self) -> None:
        self.layers = [LayerCache() for _ in range(self.num_layers)]
