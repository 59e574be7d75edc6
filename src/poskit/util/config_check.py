"""Checking config dataclasses field by field against their type annotations.

Configs arrive from JSON files and from command-line `key=value` overrides (parsed as JSON where possible,
else kept as strings), so any field may hold any JSON value. `check_field_types` runs first in a config's
`__post_init__`, so a wrong type stops with one line naming the field and what it accepts
("dropout must be a number, got 'abc'") instead of a TypeError, or a silently truthy "no", further down.
"""
from __future__ import annotations

import dataclasses
import types
import typing

from .validate import is_finite_real, is_int

__all__ = ["ConfigError", "check_field_types", "describe_type", "from_known_fields"]


class ConfigError(ValueError):
    """A bad config value. `field` is kept apart from the message so that a caller can say where the field
    came from: a nested config prefixes it ("model.dropout"), the CLI names the flag that set it ("--steps")."""

    def __init__(self, field: str, requirement: str, value):
        self.field, self.requirement, self.value = field, requirement, value
        super().__init__(f"{field} must be {requirement}, got {value!r}")

    def renamed(self, field: str) -> "ConfigError":
        return ConfigError(field, self.requirement, self.value)


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          dict: "a JSON object ({...})", type(None): "null"}


def describe_type(tp) -> str:
    """The allowed values of annotation `tp` in words, as a user writes them in JSON."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (object,)
        return f"a list of {describe_type(item).removeprefix('an ').removeprefix('a ')}s"
    if dataclasses.is_dataclass(tp):
        return f"a JSON object of {tp.__name__} fields"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


_REJECT = object()


def _conform(value, tp):
    """`value` as annotation `tp` wants it (ints widen to float, tuples become lists), or _REJECT."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for member in typing.get_args(tp):
            out = _conform(value, member)
            if out is not _REJECT:
                return out
        return _REJECT
    if tp is type(None):
        return value if value is None else _REJECT
    if tp is bool:
        # only real booleans: "no", "false" or 0 would otherwise be truthy or ambiguous
        return value if isinstance(value, bool) else _REJECT
    if tp is int:
        return int(value) if is_int(value) else _REJECT
    if tp is float:
        return float(value) if is_finite_real(value) else _REJECT
    if tp is str:
        return value if isinstance(value, str) else _REJECT
    if tp is dict or origin is dict:
        return value if isinstance(value, dict) else _REJECT
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return _REJECT
        (item,) = typing.get_args(tp) or (object,)
        items = [_conform(v, item) for v in value]
        return _REJECT if any(v is _REJECT for v in items) else items
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _REJECT
    return value  # an annotation this checker does not know: left to the config's own checks


def check_field_types(obj) -> None:
    """Raise ConfigError for the first field of dataclass `obj` whose value does not fit its annotation;
    widen ints given for float fields to floats (so that `lr=1` and `lr=1.0` make equal configs)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out = _conform(value, hints[f.name])
        if out is _REJECT:
            raise ConfigError(f.name, describe_type(hints[f.name]), value)
        if out is not value:
            setattr(obj, f.name, out)


def from_known_fields(cls, d: dict, what: str):
    """``cls(**d)`` for a config dataclass, refusing keys that are not its fields (a typo in a JSON config must
    not vanish silently); ``what`` names the config in the message ("train config", "model config")."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; allowed: {sorted(names)}")
    return cls(**d)
