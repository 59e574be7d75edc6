"""Evaluation of trained models beyond the task's own metrics: zero-shot length extrapolation."""
from .extrapolation import (
    ROPE_SCALINGS,
    evaluate_lengths,
    parse_lengths,
    with_rope_scaling,
)

__all__ = ["ROPE_SCALINGS", "evaluate_lengths", "parse_lengths", "with_rope_scaling"]
