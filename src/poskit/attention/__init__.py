"""Attention over any poskit encoding: the materialised reference and the fast paths.

``poskit.attention`` (the attribute of the ``poskit`` package) is the function `attention` of engine.py, a
plain function, so that torch.compile traces a call of it. This package is still imported by its dotted
name: ``from poskit.attention import KVCache, cached_attention``, ``import poskit.attention.engine``,
``from poskit.attention.kv_cache import KVCache``. An attribute path through the function does not exist:
write ``from poskit.attention import linear_attention``, not ``poskit.attention.linear_attention``.
"""
from __future__ import annotations

from .engine import BACKENDS, Plan, attention, cached_attention, plan, route
from .inputs import repeat_kv
from .kv_cache import KVCache
from .linear import LinearAttentionState, linear_attention, linear_attention_step
from .reference import attention_scores, reference_attention

__all__ = ["BACKENDS", "KVCache", "LinearAttentionState", "Plan", "attention", "attention_scores", "cached_attention",
           "linear_attention", "linear_attention_step", "plan", "reference_attention", "repeat_kv", "route"]
