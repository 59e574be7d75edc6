"""Argument checks shared by the whole package: one place that decides what counts as an int, a real number or
a choice, and words the error so that it names the argument, what is allowed and what was given.

    check_int(value, name, minimum=1)                    -> "num_heads must be an int >= 1, got True"
    check_int(value, name, minimum=2, maximum=52)        -> "min_len must be an integer in [2, 52], got 2.5"
    check_real(value, name, minimum=1, strict=True)      -> "base must be a finite number > 1, got 'x'"
    check_real(value, name, minimum=0, maximum=1, strict_maximum=True)
                                                         -> "p_ignore must be a finite number in [0, 1), got 1.0"
    check_choice(value, name, ("reads", "all"))          -> "train_loss_on must be one of ['reads', 'all'], got 'bits'"
    check_bool(value, name)                              -> "strip_markdown must be true or false (a bool), got 'no'"

bool is refused wherever a number is asked for although Python counts it as one: ``num_heads=True`` is a mistake,
never a size.  numpy integers count as ints and numpy floats as reals (they come out of generators and arrays);
the checks return the value as a plain ``int`` / ``float``.  Nothing is clipped or coerced: a value outside the
allowed range is an error, never moved into it.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

__all__ = ["is_int", "is_finite_real", "check_int", "check_real", "check_choice", "check_bool"]


def is_int(value) -> bool:
    """An integer (Python or numpy), bool excluded."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_finite_real(value) -> bool:
    """A finite real number (int, float or numpy scalar), bool excluded."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``int(value)``; ValueError unless ``value`` is an integer in [minimum, maximum] (None: unbounded)."""
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {_describe_int(minimum, maximum)}, got {value!r}")
    return int(value)


def _describe_int(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"an int >= {minimum}"
    if maximum is not None:
        return f"an int <= {maximum}"
    return "an integer"


def check_real(value, name: str, *, minimum: float | None = None, maximum: float | None = None,
               strict: bool = False, strict_maximum: bool = False) -> float:
    """``float(value)``; ValueError unless ``value`` is a finite real number between minimum and maximum (None:
    unbounded).  ``strict`` excludes the minimum itself, ``strict_maximum`` the maximum itself."""
    ok = is_finite_real(value)
    if ok and minimum is not None:
        ok = value > minimum if strict else value >= minimum
    if ok and maximum is not None:
        ok = value < maximum if strict_maximum else value <= maximum
    if not ok:
        raise ValueError(f"{name} must be {_describe_real(minimum, maximum, strict, strict_maximum)}, got {value!r}")
    return float(value)


def _describe_real(minimum: float | None, maximum: float | None, strict: bool, strict_maximum: bool) -> str:
    if minimum is not None and maximum is not None:
        return f"a finite number in {'(' if strict else '['}{minimum}, {maximum}{')' if strict_maximum else ']'}"
    if minimum is not None:
        return f"a finite number {'>' if strict else '>='} {minimum}"
    if maximum is not None:
        return f"a finite number {'<' if strict_maximum else '<='} {maximum}"
    return "a finite number"


def check_choice(value, name: str, allowed: Sequence):
    """``value``; ValueError unless it is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def check_bool(value, name: str) -> bool:
    """``value``; ValueError unless it is a real bool. bool("false") is True, so strings, 0/1 and None are refused
    rather than guessed at (the CLI parses its own true/false words before calling here)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false (a bool), got {value!r}")
    return value
