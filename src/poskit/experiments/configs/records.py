"""The typed records the experiment configs are written in, and `derive` for a config made from another."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PaperNumbers:
    """Numbers a paper reports for the table or figure an experiment scales down, in the paper's own metric,
    kept beside poskit's numbers in the experiment's results file and tables (copied from the paper's text)."""

    source: str
    """Which table of which paper, e.g. "CoPE paper, Table 2 left"."""
    metric: str
    """What the numbers are, with their unit and split, e.g. "test error (%)"."""
    columns: tuple
    """The paper's column of each number, e.g. ("in-distribution", "OOD")."""
    rows: dict
    """poskit encoding name (or spec label) -> the paper's numbers, one per column (None where it has none)."""
    note: str = ""
    """How the paper's set-up differs from poskit's, where that matters for reading the numbers side by side."""

    def __post_init__(self):
        for key, values in self.rows.items():
            if len(values) != len(self.columns):
                raise ValueError(f"paper numbers of {key!r} must give one value per column {list(self.columns)}, "
                                 f"got {list(values)}")


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
    paper_preset: dict = field(default_factory=dict)
    """`--preset paper`: {dotted config key: value} changes to `config` that give the paper's model size and
    schedule (the task's own paper preset, e.g. its sequence length, is applied as well); empty: the
    reproduction has no paper preset beyond the task's."""
    no_paper_preset: str = ""
    """Why `--preset paper` is refused for this reproduction (e.g. the paper's runs differ in more than one
    field per variant); empty: it is not."""
    extrapolation: dict | None = None
    """After training, a `poskit extrapolate` sweep of the trained runs: {"lengths": "1x,2x,...", "scalings":
    (test-time rope variants), "n_chars": tokens per length or None}; None: no sweep."""
    training_loss_plot: bool = False
    """Also plot every run's training loss against step (training_loss.png), as papers plotting loss curves do."""
    paper_numbers: tuple = ()
    """The paper's numbers for this table (PaperNumbers records); empty where the paper has none (a figure)."""

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
    """The defaults of `poskit demo` (each one a flag of the command), and the two training configs it derives
    its runs from."""

    summary: str
    """One line for `poskit list` and the command's help."""
    out_dir: str
    """Output directory."""
    encodings: tuple
    """Encoding specs of the language models and of the diagnostic."""
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
    language_model: dict
    """TrainConfig fields of the language models (the encoding, context, time budget and seed are set per run)."""
    diagnostic: Diagnostic
    """The short compare run after the language models."""
    paper: str | None = None
    """Which figure of which paper the demo shows at CPU scale."""
    paper_numbers: tuple = ()
    """The paper's numbers (PaperNumbers); empty: the paper gives a figure, not numbers."""


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


@dataclass(frozen=True)
class StopRule:
    """When a run has shown what it will show; `metric` is the validation metric (higher is better)."""

    learned_at: float = 0.9
    """Stop once the validation metric reaches this (the run has learned the task)."""
    patience: int = 10
    """Evaluations without a gain of min_gain in the best validation value before the run counts as plateaued."""
    min_gain: float = 0.02
    """The smallest rise of the best validation value that counts as progress."""
    min_steps: int = 0
    """No plateau stop before this many steps (a slow start is not a plateau)."""

    def __post_init__(self):
        if not 0 < self.learned_at <= 1:
            raise ValueError(f"learned_at must be in (0, 1], got {self.learned_at!r}")
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError(f"patience must be a positive int, got {self.patience!r}")
        if not self.min_gain >= 0:
            raise ValueError(f"min_gain must be >= 0, got {self.min_gain!r}")
        if isinstance(self.min_steps, bool) or not isinstance(self.min_steps, int) or self.min_steps < 0:
            raise ValueError(f"min_steps must be a non-negative int, got {self.min_steps!r}")

    def verdict(self, curve: list[tuple[int, float]]) -> str | None:
        """"learned", "plateaued" or None (keep going) for a validation curve [(step, value), ...]."""
        if not curve:
            return None
        if curve[-1][1] >= self.learned_at:
            return "learned"
        if curve[-1][0] < self.min_steps or len(curve) <= self.patience:
            return None
        best_before = max(v for _, v in curve[: -self.patience])
        recent_best = max(v for _, v in curve[-self.patience:])
        return "plateaued" if recent_best < best_before + self.min_gain else None


@dataclass(frozen=True)
class StudyRun:
    name: str
    """Directory name of the run (letters, digits, '-', '_', '.')."""
    config: dict
    """The run's TrainConfig fields."""
    group: str = ""
    """Row label in the study's table: runs that differ only in encoding and seed share a group."""

    def train_config(self):
        """The run's checked TrainConfig."""
        from poskit.training import TrainConfig  # configs stay importable without the trainer
        return TrainConfig.from_dict(self.config)


@dataclass(frozen=True)
class Study:
    question: str
    """What the study is meant to find out (printed by `poskit list` and in the report)."""
    runs: tuple
    """StudyRun records, in the order they start."""
    rule: StopRule = StopRule()
    metric_split: str = "test"
    """The split of the reported accuracy."""
    paper: str | None = None
    """Which table of which paper the study is about."""
    paper_numbers: tuple = ()
    """The paper's numbers (PaperNumbers); empty where it has none."""

    @property
    def summary(self) -> str:
        """One line for `poskit list`."""
        return f"{len(self.runs)} runs: {self.question}"

    def __post_init__(self):
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError(f"study runs must have distinct names, got duplicates in {names}")
        for r in self.runs:
            if not r.name or not all(c.isalnum() or c in "-_." for c in r.name):
                raise ValueError(f"study run name must be letters, digits, '-', '_' or '.', got {r.name!r}")

    def run(self, name: str) -> StudyRun:
        for r in self.runs:
            if r.name == name:
                return r
        raise ValueError(f"run must name a run of this study: one of {[r.name for r in self.runs]}, got {name!r}")
