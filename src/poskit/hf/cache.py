"""`PoskitCache`: poskit's KV cache (`poskit.KVCache`) behind transformers' `Cache` interface.

transformers' `generate` creates, measures, reorders (beam search), expands and crops the cache through the
`Cache` methods; the model itself appends to the poskit cache inside `poskit.attention`, which stores what each
encoding declares (`cache_form`: raw keys, rotated keys, or PoPE's magnitudes and angles), per-key padding
and positions. So `update` (transformers' way for a model to append raw key/value states) is not used and
refuses to run rather than store something the engine would not read.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from poskit.attention.kv_cache import KVCache, LayerCache


class PoskitCacheLayer(CacheLayerMixin):
    """One layer of a `PoskitCache`: a view of the poskit `LayerCache` at `index` of the shared KVCache."""

    is_sliding = False
    is_croppable = True
    is_compileable = False
    supports_early_init = False

    def __init__(self, kv: KVCache, index: int):
        super().__init__()
        self._kv, self._index = kv, index

    @property
    def poskit_layer(self) -> LayerCache:
        return self._kv.layer(self._index)

    # transformers reads keys/values/is_initialized as attributes: the poskit layer's views (what the encoding
    # cached: raw, rotated or PoPE magnitude keys)
    @property
    def keys(self):
        return self.poskit_layer.keys

    @keys.setter
    def keys(self, value):
        if value is not None:  # CacheLayerMixin.__init__ sets None; nothing else may write here
            raise AttributeError("PoskitCacheLayer.keys is read-only: poskit.attention appends to the cache")

    @property
    def values(self):
        return self.poskit_layer.values

    @values.setter
    def values(self, value):
        if value is not None:
            raise AttributeError("PoskitCacheLayer.values is read-only: poskit.attention appends to the cache")

    @property
    def is_initialized(self) -> bool:
        return self.poskit_layer.length > 0

    @is_initialized.setter
    def is_initialized(self, value):
        pass  # derived from the poskit layer; CacheLayerMixin.__init__ assigns False

    def lazy_initialization(self, key_states, value_states) -> None:
        pass  # the poskit layer allocates at its first append

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("a PoskitCache is filled by poskit.attention inside PoskitForCausalLM; it cannot "
                                  "store key/value states of another model")

    def get_seq_length(self) -> int:
        return self.poskit_layer.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1  # grows without a limit

    def reset(self) -> None:
        self.poskit_layer.crop(0)

    def crop(self, tokens_to_remove: int) -> None:
        # transformers' convention: a negative count removes that many tokens from the end
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int) or tokens_to_remove > 0:
            raise ValueError(f"tokens_to_remove must be an int <= 0 (the number of last tokens to remove, negated), "
                             f"got {tokens_to_remove!r}")
        layer = self.poskit_layer
        layer.crop(max(0, layer.length + tokens_to_remove))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.poskit_layer.select_batch(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.poskit_layer.select_batch(torch.as_tensor(indices).long().flatten())

    def batch_repeat_interleave(self, repeats: int) -> None:
        layer = self.poskit_layer
        if layer.length:
            rows = torch.arange(layer.keys.shape[0], device=layer.keys.device)
            layer.select_batch(rows.repeat_interleave(repeats))


class PoskitCache(Cache):
    """A transformers `Cache` holding a poskit `KVCache` (`.kv`) for a model of `num_layers` layers.

    max_length: tokens to allocate for at the first append (the cache grows past it by doubling)."""

    def __init__(self, num_layers: int, max_length: int | None = None):
        self.kv = KVCache(num_layers, max_length=max_length)
        super().__init__(layers=[PoskitCacheLayer(self.kv, i) for i in range(num_layers)])

    def reset(self) -> None:
        self.kv.reset()

    @property
    def batch_size(self) -> int:
        keys = self.kv.layer(0).keys
        return -1 if keys is None else keys.shape[0]
