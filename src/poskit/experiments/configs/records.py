"""The typed records the experiment configs are written in, and `derive` for a config made from another."""
from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One sub-run of a reproduction with variants."""

    value: object
    """The value of the reproduction's variant_field in this sub-run."""
    seeds: tuple | None = None
    """Seeds of this sub-run (None: the reproduction's seeds)."""


@dataclass(frozen=True)
class Reproduction:
    paper: str
    """Which table of which paper this scales down."""
    summary: str
    """One line for `poskit list`: what runs and how long it takes."""
    config: dict
    """TrainConfig fields (the base config; the encoding is set per run)."""
    encodings: str
    """Comma-separated encoding specs."""
    seeds: tuple = (0,)
    """Seeds of every run (of every variant that does not set its own)."""
    split: str = "test"
    """Split of the headline metric."""
    variant_field: str | None = None
    """Dotted config key that differs between the sub-runs (e.g. "task_options.n_vars"); None: one compare."""
    variants: tuple = ()
    """The sub-runs (Variant), in table order."""
    paper_config: dict | None = None
    """{dotted TrainConfig key: value} applied by `--preset paper` (the paper's own sizes), or None: the
    reproduction's task preset "paper" only."""

    @property
    def variant_name(self) -> str:
        return self.variant_field.rsplit(".", 1)[-1] if self.variant_field else ""


@dataclass(frozen=True)
class Diagnostic:
    """A short compare on a synthetic task, run after the demo's language models."""

    config: dict
    """TrainConfig fields (the encoding is set per run; max_steps is the demo's diagnostic_steps)."""
    what: str
    """What the diagnostic shows, for the tables' titles."""


@dataclass(frozen=True)
class DemoSettings:
    """The defaults of `poskit demo` (each one a flag of the command)."""

    out_dir: str
    """Output directory."""
    encodings: tuple
    """Encodings of the language models and of the diagnostic."""
    train_seconds: float
    """Training time budget of each language model."""
    context: int
    """Training context of the language models (characters)."""
    lengths: str
    """Evaluation windows, Nx = N times the training context."""
    n_chars: int
    """Held-out characters evaluated per window length."""
    diagnostic_steps: int
    """Training steps of each diagnostic model."""
    workers: int
    """Parallel single-thread processes."""


def derive(base: dict, changes: dict) -> dict:
    """A copy of the config `base` with `changes` ({dotted key: value}) applied; a key must already exist in
    `base`, so that a derived config can only change settings, never misspell one into a new one."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        node, *path = [out, *dotted.split(".")]
        for part in path[:-1]:
            node = node[part]
        if path[-1] not in node:
            raise KeyError(f"derive: {dotted!r} is not a setting of the base config")
        node[path[-1]] = value
    return out
