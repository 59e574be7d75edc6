"""Attention over any poskit encoding: the materialised reference and the fast paths."""
from .engine import BACKENDS, attention, cached_attention
from .inputs import repeat_kv
from .kv_cache import KVCache
from .reference import attention_scores, reference_attention

__all__ = ["BACKENDS", "KVCache", "attention", "cached_attention", "attention_scores", "reference_attention", "repeat_kv"]
