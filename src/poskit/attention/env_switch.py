"""On/off switches read from the environment at every call (POSKIT_CPU_KERNEL, POSKIT_KERNEL_CALIBRATION): on
when unset, and a value that is neither on nor off refused by name, never read as either."""
from __future__ import annotations

import os

ON = ("", "1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def switched_on(name: str, on_means: str, off_means: str) -> bool:
    """Whether the environment variable `name` is on (unset: on); ValueError naming it and its values otherwise."""
    value = os.environ.get(name, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"the environment variable {name} must be one of {[v for v in ON if v]} or unset ({on_means}, "
                     f"the default) or {list(OFF)} ({off_means}), got {os.environ[name]!r}")
