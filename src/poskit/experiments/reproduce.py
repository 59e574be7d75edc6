"""`poskit reproduce NAME`: CPU-scale versions of the papers' diagnostic tasks.

Each reproduction is a `compare` with fixed settings: the paper's task scaled down until one model trains on
one CPU core in minutes to hours. Run times in the summaries are wall-clock on a 2-core CPU with two
single-thread workers, measured while the machine was shared; the outcomes are in docs/reproductions.md.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from poskit.train import TrainConfig

from .compare import run_compare
from .specs import apply_overrides, parse_encodings


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
    split: str = "test"
    notes: str = ""
    extra: dict = field(default_factory=dict)


_COMMON = {"beta1": 0.9, "weight_decay": 0.01, "grad_clip": 1.0, "log_every": 50}

REPRODUCTIONS: dict[str, Reproduction] = {
    "indirect-indexing": Reproduction(
        paper="PoPE paper, Table 1 (App. B: 8 layers, d 512, lr 2e-4 -> 2e-5, warmup 4k, 100k steps, batch 64)",
        summary="rope vs pope, 2 layers d 64, 100k steps: about 2 h per model on an idle core",
        config={"task": "indirect-indexing", "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "encoding": "rope"},
                "batch_size": 64, "max_steps": 100_000, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 4000,
                "beta2": 0.99, "eval_every": 2000, "checkpoint_every": 2000, **_COMMON},
        encodings="rope,pope:delta_init=uniform",
    ),
    "flip-flop": Reproduction(
        paper="CoPE paper, Table 2 left (4 layers, d 256, 10k steps, lr 3e-4; length 512)",
        summary="none, rope, pope, alibi, cope at length 64, 2 layers d 64, 1000 steps, 3 seeds: 16 min",
        config={"task": "flip-flop", "task_options": {"length": 64, "eval_size": 1000},
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "encoding": "rope"},
                "batch_size": 32, "max_steps": 1000, "lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.05,
                "beta2": 0.98, "eval_every": 100, "checkpoint_every": 500, **_COMMON},
        encodings="none,rope,pope,alibi,cope",
        seeds=(0, 1, 2),
    ),
    "selective-copy": Reproduction(
        paper="CoPE paper, Table 2 right (2 layers, d 64, 2 heads, 100k steps; 256 tokens, 256 blanks)",
        summary="rope, pope, relative, cope; 16 tokens, 16 blanks (OOD 8 / 32), 2 layers d 64, 1000 steps, "
                "3 seeds: 13 min",
        config={"task": "selective-copy", "task_options": {"n_tokens": 16, "n_blanks": 16, "ood_dense_blanks": 8,
                                                           "ood_sparse_blanks": 32},
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "encoding": "rope"},
                "batch_size": 32, "max_steps": 1000, "lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.05,
                "beta2": 0.98, "eval_every": 100, "checkpoint_every": 500, **_COMMON},
        encodings="rope,pope,relative,cope",
        seeds=(0, 1, 2),
    ),
    "counting": Reproduction(
        paper="CoPE paper, Tables 3-4 (relative PE vs CoPE; 512 operations, 1/3/5 variables)",
        summary="relative, rope, pope, cope; up to 64 operations, 3 variables, 2 layers d 64, 1000 steps, "
                "3 seeds: 23 min",
        config={"task": "counting", "task_options": {"max_steps": 64, "n_vars": 3},
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "encoding": "rope"},
                "batch_size": 32, "max_steps": 1000, "lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.05,
                "beta2": 0.98, "eval_every": 250, "checkpoint_every": 500, **_COMMON},
        encodings="relative,rope,pope,cope",
        seeds=(0, 1, 2),
    ),
}


def run_reproduction(name: str, *, out_dir=None, seeds=None, encodings=None, steps: int | None = None,
                     workers: int | None = None, resume: bool = False, quiet: bool = False,
                     overrides: list[str] | None = None) -> dict:
    """Run reproduction `name` (see REPRODUCTIONS) as a compare; returns the compare results."""
    if name not in REPRODUCTIONS:
        raise ValueError(f"name must be one of {sorted(REPRODUCTIONS)}, got {name!r}")
    r = REPRODUCTIONS[name]
    cfg = copy.deepcopy(r.config)
    if steps is not None:
        cfg["max_steps"] = steps
    apply_overrides(cfg, overrides or [])
    base = TrainConfig.from_dict(cfg)
    specs = encodings if encodings is not None else parse_encodings(r.encodings)
    out = Path(out_dir or f"runs/reproduce-{name}")
    return run_compare(base, specs, list(seeds or r.seeds), out, workers=workers, resume=resume, quiet=quiet,
                       split=r.split, title=f"reproduce {name}: {r.paper}")
