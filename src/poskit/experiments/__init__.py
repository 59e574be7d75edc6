"""The experiment drivers behind the CLI: compare, extrapolate, demo and the CPU-scale reproductions."""
from .compare import run_compare
from .demo import run_demo
from .extrapolate import run_extrapolate
from .reproduce import REPRODUCTIONS, run_reproduction

__all__ = ["REPRODUCTIONS", "run_compare", "run_demo", "run_extrapolate", "run_reproduction"]
