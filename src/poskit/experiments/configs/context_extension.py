"""`poskit reproduce context-extension`: the claim of Position Interpolation (Chen et al. 2023) and YaRN (Peng et
al. 2023), as paper 001 tells it, at CPU scale: a RoPE model extended to s = 4-16x its training context with a
scaling plus a few hundred fine-tuning steps, against zero-shot use, direct fine-tuning and PoPE.

Base models are trained by the command itself: the demo's character-level Shakespeare LM (2 layers, d_model 128,
4 heads of 32 channels, context 64), with half of the training windows replaced by passkey prompts and 3000
steps, so that retrieval can exist at 1x (tasks/passkey.py), and a RoPE control without them. Each is extended
to 64 s with every method of its setup, and every checkpoint in the grid's steps is evaluated: held-out
perplexity at 1x-16x (all positions and the last quarter of each window), passkey accuracy per length and depth.

Why half and 3000 steps: the best of the settings measured (after seeing results; docs/results/passkey-pretraining/
holds every run). With a quarter of the windows, RoPE seed 0 retrieved no key exactly after 2000 steps; with half,
38 % after 2000 and 93 % after 3000. It does not hold on a fresh seed: RoPE seed 1 learned nothing (chance, 0 %)
in 3000 steps and PoPE seed 0 retrieved 32 %. Retrieval appears abruptly, at a seed-dependent step, so at this
budget the grid's passkey columns test extension only where the base model retrieves at 1x (its "none" row says).

YaRN's bands at this scale (measured: experiments/context_extension.py `yarn_bands`, written into results.json).
Rotations of pair i inside the training context: r_i = 64 theta_i / (2 pi); pair 0 turns 10.2 times at any base
(theta_0 = 1), so no pair reaches YaRN's beta_fast = 32, the band it keeps unchanged:
- head_dim 32, base 10000, betas 32/1 (the "rope" setup): by YaRN's definition 0 pairs kept (r > 32), 5 on the
  ramp (1 <= r <= 32: r = 10.2, 5.7, 3.2, 1.8, 1.02), 11 interpolated (r < 1). As computed (the ramp's start is
  clamped at dim 0, which keeps pair 0 whole): 1 kept, 4 on the ramp (weights 0.8 0.6 0.4 0.2), 11 interpolated
  like PI. So YaRN is PI on 11 of 16 pairs plus its attention temperature 0.1 ln s + 1 here; it departs from PI
  only on the 5 fastest pairs.
- base 500, betas 4/1 (the "rope-b500" setup, where the bands are populated): 3 pairs kept (r = 10.2, 6.9, 4.7),
  3 on the ramp (3.2, 2.2, 1.5), 10 interpolated, by definition and as computed. A smaller base alone does not
  fill the kept band (r_0 does not depend on the base); beta_fast must fall below r_0, so this setup scales the
  betas to the context: beta_fast 4 rotations in 64 tokens is a wavelength of 16 tokens (YaRN's 32 in 4096 is 128).

Grids (`default`, `quick`): the default is the grid of the PI/YaRN comparison (s = 4, 8, 16; 0-400 steps; four
setups), the quick one its rope and pope setups at s = 4 and 16 to 100 steps. Measured on the 2-core machine
with two workers (docs/extend.md): the default 49 min 22 s, 16 min of it shared with the test suite (about 43 min
idle, derived), the quick one 11 min 19 s (results.json's "timings" records each run's own).
"""
from __future__ import annotations

from dataclasses import dataclass

from .demo import LM_TRAIN


@dataclass(frozen=True)
class Method:
    """One way to reach the longer context."""

    name: str
    """Its row in the tables."""
    encoding: str | None
    """The encoding spec of the extension (scaling options default to the extension: factor = s,
    original_max_positions = 64; experiments/extend.py); None: the base model as trained (zero-shot)."""
    fine_tune: bool = True
    """Fine-tuned at the grid's steps; False: evaluated zero-shot (step 0) only."""
    unchanged: bool = False
    """The extension keeps the base's own encoding (direct fine-tuning, PoPE): its step 0 is the base itself."""


NONE = Method("none", None, fine_tune=False)
DIRECT = Method("direct", "rope", unchanged=True)  # PI's "direct fine-tuning" without interpolation
PI = Method("pi", "rope-linear")
NTK = Method("ntk", "rope-ntk")
YARN = Method("yarn", "rope-yarn")  # YaRN's betas 32 / 1
YARN_CONTEXT_BETAS = Method("yarn", "rope-yarn:beta_fast=4:beta_slow=1")  # betas scaled to a 64-token context
DYNAMIC = Method("dynamic", "rope-dynamic", fine_tune=False)  # dynamic NTK is used at inference only
POPE = Method("pope", "pope", unchanged=True)  # PoPE fine-tuned at the longer context without any scaling


@dataclass(frozen=True)
class Setup:
    """A base model and the methods that extend it."""

    name: str
    encoding: str
    """The base model's encoding spec."""
    passkey_fraction: float
    """Fraction of its training windows that are passkey prompts."""
    methods: tuple


@dataclass(frozen=True)
class Grid:
    """How much of the experiment runs."""

    name: str
    setups: tuple
    """Names of the setups that run."""
    scales: tuple
    """Extension factors s (the new context is 64 s)."""
    steps: tuple
    """Fine-tuning steps at which a checkpoint is evaluated (0 included); the last is the fine-tuning length."""
    pretrain_steps: int
    """Steps of each base model."""
    lengths: tuple
    """Evaluation lengths, multiples of the base context."""
    n_chars: int
    """Held-out tokens per perplexity length."""
    depths: tuple
    """Passkey depths."""
    trials: int
    """Passkey prompts per (length, depth)."""
    methods: tuple | None = None
    """Names of the methods that run (None: every method of each setup; "none", the base itself, always runs)."""


@dataclass(frozen=True)
class ContextExtension:
    paper: str
    summary: str
    encodings: str
    """The base models' encodings (the registry lists them)."""
    pretrain: dict
    """TrainConfig fields of the base models (the encoding, passkey fraction, steps and seed are set per setup)."""
    context: int
    """The base models' training context."""
    setups: tuple
    default: Grid
    quick: Grid
    passkey_threshold: float
    """"Passkey context" (YaRN) is the longest length whose accuracy (mean over depths) is at least this; PI's
    effective window the longest length up to which every length reaches it."""
    split: str = "test"
    """Held-out split of every evaluation."""
    checkpoint_every: int = 50
    """Checkpoints of the extension runs (each evaluated step is one too)."""
    workers: int = 2

    def grid(self, quick: bool = False) -> Grid:
        return self.quick if quick else self.default

    def setup(self, name: str) -> Setup:
        return next(s for s in self.setups if s.name == name)


PRETRAIN = {**LM_TRAIN, "task_options": {"context": 64}, "model": {**LM_TRAIN["model"]},
            "eval_every": 10**9, "checkpoint_every": 500, "final_eval_batches": 4, "log_every": 50}

SETUPS = (
    Setup("rope", "rope", 0.5, (NONE, DIRECT, PI, NTK, YARN, DYNAMIC)),
    Setup("pope", "pope", 0.5, (NONE, POPE)),
    Setup("rope-control", "rope", 0.0, (NONE,)),  # no passkey windows in pre-training: retrieval's control
    Setup("rope-b500", "rope:base=500", 0.5, (NONE, PI, NTK, YARN_CONTEXT_BETAS, DYNAMIC)),  # populated bands
)

CONTEXT_EXTENSION = ContextExtension(
    paper="PI (Chen et al. 2023, Tables 3-4) and YaRN (Peng et al. 2023): RoPE extended 4-16x by scaling + fine-tuning",
    summary="RoPE/PoPE Shakespeare LMs (context 64) extended 4-16x by PI, NTK, YaRN, direct fine-tuning, dynamic NTK "
            "and PoPE, perplexity and passkey at 0-400 steps: 49 min measured on 2 cores (about 43 idle); "
            "--quick: a smaller grid, 11 min (docs/extend.md)",
    encodings="rope,pope",
    pretrain=PRETRAIN,
    context=64,
    setups=SETUPS,
    default=Grid("default", setups=("rope", "pope", "rope-control", "rope-b500"), scales=(4, 8, 16),
                 steps=(0, 25, 50, 100, 200, 400), pretrain_steps=3000, lengths=(1, 2, 4, 8, 16), n_chars=16384,
                 depths=(0.0, 0.5, 1.0), trials=10),
    quick=Grid("quick", setups=("rope", "pope"), scales=(4, 16), steps=(0, 25, 100), pretrain_steps=3000,
               lengths=(1, 4, 16), n_chars=4096, depths=(0.0, 1.0), trials=6),
    passkey_threshold=0.8,
)
