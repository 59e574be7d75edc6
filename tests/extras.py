"""Skips for tests that need an optional extra: the reason gives the exact command that installs it (with the
lock, constraints.txt, as every install of poskit uses)."""
from __future__ import annotations

import pytest


def install_command(extra: str) -> str:
    """The command that installs poskit's `extra` (run from the repository root)."""
    return f'pip install -c constraints.txt -e ".[{extra}]"'


def need(module: str, extra: str, what: str | None = None):
    """The imported `module`, or a skip of the calling test module (or test) naming the extra's install command.
    what: what needs the module, for the reason (default: the module's name)."""
    return pytest.importorskip(module, reason=f"{what or module} is not installed: {install_command(extra)}")


def skip_without(extra: str, why: str):
    """Skip (inside a test) because something of `extra` is missing; `why` says what."""
    pytest.skip(f"{why}: {install_command(extra)}")
