"""Attention over any poskit encoding: the materialised reference and the fast paths.

This package is itself callable: ``poskit.attention(q, k, v, enc, ...)`` is ``poskit.attention.attention``
(see engine.py), while ``import poskit.attention.kv_cache`` and friends keep working.
"""
import sys
import types
from .engine import BACKENDS, attention, cached_attention
from .inputs import repeat_kv
from .kv_cache import KVCache
from .reference import attention_scores, reference_attention

__all__ = ["BACKENDS", "KVCache", "attention", "cached_attention", "attention_scores", "reference_attention", "repeat_kv"]


class _CallableModule(types.ModuleType):
    """Lets `poskit.attention(...)` be the function of the API contract and still a package."""

    def __call__(self, *args, **kwargs):
        return attention(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
