"""The compiled CPU attention kernel in tests: whether it is available here, and the switch that turns it off.

The kernel is the default CPU path for what it serves; tests of the exact paths it replaces (the blocked ones,
still taken without a compiler or with POSKIT_CPU_KERNEL=0) turn it off with `kernel_off`, and tests of the
kernel skip with the reason where it cannot be built (`require_kernel`). It is compiled once per machine (a
disk cache), so only the first test session on a machine pays the build.
"""
import warnings

import pytest

from poskit.attention import cpu_flash, kernel_build


def kernel_available() -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its one warning is tested in test_cpu_flash.py
        return cpu_flash.available()


def require_kernel() -> None:
    if not kernel_available():
        try:
            kernel_build.load()
            why = "it does not load"
        except kernel_build.KernelUnavailable as err:
            why = str(err)
        pytest.skip(f"the compiled CPU attention kernel cannot be had here: {why}")


def kernel_off(monkeypatch) -> None:
    """The exact paths the kernel replaces by default (as without a compiler)."""
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "0")


def set_kernel(monkeypatch, on: bool) -> str:
    """Switch the kernel on (skipping where it cannot be built) or off; returns the path a bias encoding that
    declares a kernel bias takes, "cpu-flash" or its blocked one (the caller's)."""
    if on:
        require_kernel()
        monkeypatch.setenv(cpu_flash.ENV_SWITCH, "1")
    else:
        kernel_off(monkeypatch)
    return "cpu-flash" if on else None


def documented_cpu_path_holds(documented: str, chosen: str) -> bool:
    """Whether `chosen` (route()'s answer here) is the CPU path a document gives: where it says "cpu-flash" and
    the kernel cannot be built here, the exact blocked path that serves instead; where it says "P; cpu-flash where
    measured faster", P (the suite reads no machine calibration, tests/conftest.py)."""
    default, _, measured = documented.partition(";")
    if measured.strip() == "cpu-flash where measured faster":
        return chosen == default.strip()
    if documented == "cpu-flash" and not kernel_available():
        return chosen in ("blocked", "blocked-bias", "blocked-contextual")
    return chosen == documented
