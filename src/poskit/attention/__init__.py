"""Attention over any poskit encoding: the materialised reference and the fast paths.

``poskit.attention(q, k, v, enc, ...)`` is ``poskit.attention.attention`` (engine.py): the attribute
``attention`` of the ``poskit`` package is a `PackageFunction` that calls it and reads every other attribute
from this package, so ``poskit.attention.KVCache`` and ``poskit.attention.kv_cache`` keep working, while
``import poskit.attention.kv_cache`` and ``from poskit.attention import KVCache`` find this package in
``sys.modules`` as usual. (A callable module object would do the same in eager mode, but torch.compile's
Dynamo cannot trace a call to a module object; it traces a call to an object with ``__call__``.)
"""
from __future__ import annotations

import functools

from .engine import BACKENDS, attention, cached_attention
from .inputs import repeat_kv
from .kv_cache import KVCache
from .linear import LinearAttentionState, linear_attention, linear_attention_step
from .reference import attention_scores, reference_attention

__all__ = ["BACKENDS", "KVCache", "LinearAttentionState", "PackageFunction", "linear_attention",
           "linear_attention_step", "attention", "cached_attention", "attention_scores",
           "reference_attention", "repeat_kv"]


class PackageFunction:
    """A package's API function that also reads (and sets) the package's attributes.

    Calling it calls `function`; any other attribute is the package's. Its `__doc__`, `__name__` and
    signature are the function's (functools.update_wrapper), so help() and inspect.signature() show them.
    """

    def __init__(self, function, package):
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_package", package)
        for name in functools.WRAPPER_ASSIGNMENTS:  # __module__, __name__, __qualname__, __doc__, ...
            if hasattr(function, name):
                object.__setattr__(self, name, getattr(function, name))
        object.__setattr__(self, "__wrapped__", function)

    def __call__(self, *args, **kwargs):
        return self._function(*args, **kwargs)

    def __getattr__(self, name):  # only for names not found on the object itself: the package's
        if name in ("_function", "_package"):  # not set yet (copy, unpickling): no package to read from
            raise AttributeError(name)
        return getattr(self._package, name)

    def __setattr__(self, name, value):  # e.g. monkeypatch.setattr(poskit.attention, ...) reaches the package
        setattr(self._package, name, value)

    def __copy__(self):  # copied as a function is: itself (its package is a module, which cannot be copied)
        return self

    def __deepcopy__(self, memo):
        return self

    def __dir__(self):
        return sorted(set(dir(self._package)) | {"__call__"})

    def __repr__(self) -> str:
        return f"<function {self._package.__name__} (package {self._package.__name__!r}, callable)>"
