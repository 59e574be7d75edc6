"""poskit.validate: the package's one set of argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from poskit.util.validate import check_bool, check_choice, check_int, check_real


def test_check_int_accepts_and_returns_plain_ints():
    assert check_int(3, "n", minimum=1) == 3
    out = check_int(np.int64(7), "n", minimum=0, maximum=7)
    assert out == 7 and type(out) is int
    assert check_int(-5, "n") == -5


@pytest.mark.parametrize(
    "value, bounds, message",
    [
        (True, dict(minimum=1), "n must be an int >= 1, got True"),
        (8.0, dict(minimum=1), "n must be an int >= 1, got 8.0"),
        (0, dict(minimum=1), "n must be an int >= 1, got 0"),
        (9, dict(maximum=8), "n must be an int <= 8, got 9"),
        (53, dict(minimum=2, maximum=52), r"n must be an integer in \[2, 52\], got 53"),
        ("4", dict(), "n must be an integer, got '4'"),
    ],
)
def test_check_int_refuses(value, bounds, message):
    with pytest.raises(ValueError, match=message):
        check_int(value, "n", **bounds)


def test_check_real():
    assert check_real(1, "x", minimum=1) == 1.0 and type(check_real(1, "x", minimum=1)) is float
    assert check_real(np.float32(0.5), "p", minimum=0, maximum=1, strict_maximum=True) == 0.5
    for value, kwargs, message in [
        (1.0, dict(minimum=1, strict=True), "x must be a finite number > 1, got 1.0"),
        (0.5, dict(minimum=1), "x must be a finite number >= 1, got 0.5"),
        (1.0, dict(minimum=0, maximum=1, strict_maximum=True), r"x must be a finite number in \[0, 1\), got 1.0"),
        (0.0, dict(minimum=0, maximum=1, strict=True), r"x must be a finite number in \(0, 1\], got 0.0"),
        (2.0, dict(maximum=1), "x must be a finite number <= 1, got 2.0"),
        (float("nan"), dict(), "x must be a finite number, got nan"),
        (float("inf"), dict(minimum=0), "x must be a finite number >= 0, got inf"),
        (False, dict(), "x must be a finite number, got False"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_real(value, "x", **kwargs)


def test_check_choice_and_bool():
    assert check_choice("all", "mode", ("reads", "all")) == "all"
    with pytest.raises(ValueError, match=r"mode must be one of \['reads', 'all'\], got 'bits'"):
        check_choice("bits", "mode", ("reads", "all"))
    assert check_bool(False, "flag") is False
    for bad in (1, "no", None):
        with pytest.raises(ValueError, match=r"flag must be true or false \(a bool\), got "):
            check_bool(bad, "flag")
