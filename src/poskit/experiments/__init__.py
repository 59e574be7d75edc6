"""The experiment drivers behind the CLI: compare, extrapolate, the demos, the reproductions and studies of the
registry (experiments/registry.py)."""
from .compare import run_compare
from .demo import run_demo
from .extrapolate import run_extrapolate
from .registry import EXPERIMENTS, Experiment, experiment, experiments
from .reproduce import run_reproduction

__all__ = ["EXPERIMENTS", "Experiment", "experiment", "experiments", "run_compare", "run_demo", "run_extrapolate",
           "run_reproduction"]
