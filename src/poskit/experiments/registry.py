"""Every experiment poskit runs by name, in one table: the reproductions (`poskit reproduce NAME`), the
background studies (`poskit study NAME`) and the demos (`poskit demo`, `poskit digits`). `poskit list`,
`poskit reproduce --list`, the commands' NAME choices and help, and the per-task defaults of `poskit train`
all read it, so a new experiment is one config module and one line here.

`Experiment` is the one record type for all of them: a name, a kind, its settings (the record of its config
module in experiments/configs/, the defaults its runner starts from), its runner and the files its command
names. The runner is written "module:function" and imported only when the experiment runs, so that listing
experiments or building the command line's parser loads no trainer. It is called as
`runner(experiment, **arguments)`, and every runner of one kind takes the same arguments (those of the kind's
command), so that a command runs any experiment of its kind without knowing which one it is.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from .configs.ablations import ABLATIONS
from .configs.code import CODE
from .configs.context_extension import CONTEXT_EXTENSION
from .configs.counting import COUNTING
from .configs.demo import DEMO
from .configs.digits import DIGITS
from .configs.flip_flop import FLIP_FLOP
from .configs.genome import GENOME
from .configs.indirect_indexing import INDIRECT_INDEXING
from .configs.indirect_indexing_study import INDIRECT_INDEXING_PAPER_STUDY, INDIRECT_INDEXING_STUDY
from .configs.jsb import JSB
from .configs.maestro import MAESTRO
from .configs.mlm import MLM
from .configs.performer import PERFORMER
from .configs.selective_copy import SELECTIVE_COPY
from .configs.text import TEXT
from .configs.text_cope import TEXT_COPE
from .configs.text_extrapolation import TEXT_EXTRAPOLATION
from .configs.text_size import TEXT_SIZE
from .configs.translation import TRANSLATION
from .outputs import COMPARE_JSON, COMPARE_MD, CONVERGENCE_PLOT

__all__ = ["EXPERIMENTS", "KINDS", "Experiment", "experiment", "experiments"]

KINDS = ("reproduction", "study", "demo")


@dataclass(frozen=True)
class Experiment:
    name: str
    """What the command line calls it (unique within its kind: a study may share a reproduction's name)."""
    kind: str
    """"reproduction" (`poskit reproduce`), "study" (`poskit study`) or "demo" (a command of its own)."""
    settings: object
    """Its config module's record: the defaults the runner starts from (it has a one-line `summary`)."""
    runner: str
    """"module:function", called as function(experiment, **arguments)."""
    outputs: tuple = ()
    """Files in the output directory that the command names when the run is done; it prints the .md one."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, got {self.kind!r}")

    @property
    def summary(self) -> str:
        """One line for `poskit list`: what runs and how long it takes."""
        return self.settings.summary

    @property
    def table(self) -> str | None:
        """The markdown file among the outputs (printed after a run), if any."""
        return next((name for name in self.outputs if name.endswith(".md")), None)

    def run(self, **arguments):
        module, _, function = self.runner.partition(":")
        return getattr(importlib.import_module(module), function)(self, **arguments)


_COMPARE = (COMPARE_JSON, COMPARE_MD)  # a reproduction run as compares (its plots beside the table)
_LM = "poskit.experiments.reproduce:reproduce"

EXPERIMENTS: dict[tuple[str, str], Experiment] = {(e.kind, e.name): e for e in (
    # the reproductions, in the order `poskit list` shows them
    Experiment("indirect-indexing", "reproduction", INDIRECT_INDEXING, _LM, _COMPARE),
    Experiment("flip-flop", "reproduction", FLIP_FLOP, _LM, _COMPARE),
    Experiment("selective-copy", "reproduction", SELECTIVE_COPY, _LM, _COMPARE),
    Experiment("counting", "reproduction", COUNTING, _LM, _COMPARE),
    # real data: the PoPE paper's Tables 2-4, 8 and Fig. 2, the CoPE paper's Table 5
    Experiment("jsb", "reproduction", JSB, _LM, _COMPARE),
    Experiment("maestro", "reproduction", MAESTRO, _LM, _COMPARE),
    Experiment("genome", "reproduction", GENOME, _LM, _COMPARE),
    Experiment("text", "reproduction", TEXT, _LM, _COMPARE),
    Experiment("text-cope", "reproduction", TEXT_COPE, _LM, _COMPARE),
    Experiment("code", "reproduction", CODE, _LM, _COMPARE),
    Experiment("text-extrapolation", "reproduction", TEXT_EXTRAPOLATION, _LM, _COMPARE),
    Experiment("text-size", "reproduction", TEXT_SIZE, _LM, _COMPARE),
    Experiment("ablations", "reproduction", ABLATIONS, _LM, _COMPARE),
    Experiment("context-extension", "reproduction", CONTEXT_EXTENSION, "poskit.experiments.context_extension:reproduce", _COMPARE),
    # encoder-only pre-training: RoFormer sec. 4.2
    Experiment("mlm", "reproduction", MLM, _LM, _COMPARE),
    # linear attention with and without RoPE: RoFormer sec. 4.4
    Experiment("performer", "reproduction", PERFORMER, _LM, _COMPARE),
    # encoder-decoder translation: RoFormer Table 1, the Legendre PE paper's Table 1 and Fig. 4
    Experiment("translation", "reproduction", TRANSLATION, "poskit.experiments.translation:reproduce",
               (*_COMPARE, CONVERGENCE_PLOT)),
    # background studies: queues of long runs with early stops
    Experiment("indirect-indexing", "study", INDIRECT_INDEXING_STUDY, "poskit.experiments.study:run"),
    Experiment("indirect-indexing-paper", "study", INDIRECT_INDEXING_PAPER_STUDY, "poskit.experiments.study:run"),
    # the demos, each with a command of its own
    Experiment("demo", "demo", DEMO, "poskit.experiments.demo:run"),
    Experiment("digits", "demo", DIGITS, "poskit.experiments.digits:run"),
)}


def experiments(kind: str | None = None) -> list[Experiment]:
    """The experiments of `kind` (all of them for None), in the table's order."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    return [e for e in EXPERIMENTS.values() if kind is None or e.kind == kind]


def experiment(name: str, kind: str, *, arg: str = "name") -> Experiment:
    """The experiment `name` of `kind`; an unknown name is refused naming `arg` and the names of that kind."""
    found = EXPERIMENTS.get((kind, name)) if kind in KINDS else None
    if found is None:
        names = sorted(e.name for e in experiments(kind))
        raise ValueError(f"{arg} must be one of {names}, got {name!r}")
    return found
