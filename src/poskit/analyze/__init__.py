"""Analyses behind `poskit analyze`: one module per analysis, each a function returning a JSON-able dict and
a writer of that dict plus its PNG.

- frequency: mean query and key magnitude per frequency component, per layer and head, of trained runs
  (PoPE paper Figs. 3-6); reads the encodings' declared `component_frequencies`/`component_magnitudes`.
- decay: RoFormer's relative upper bound of the long-term decay (App. C) beside the same curve measured on
  poskit's logits.
- correlation: position-correlation matrices of absolute encodings (Legendre PE paper Figs. 1 and 3).
- phase_bias: where PoPE's phase bias sits over training, beside the validation metric (the phase-bias rules).
- cope_gates: what CoPE's gates count in trained runs, by kind of key token, and the attention from position
  alone on one window (CoPE paper Figs. 4 and 6).
"""
from .cope_gates import cope_gate_counts, write_cope_gates
from .correlation import position_correlation, write_correlation
from .decay import decay_curves, write_decay
from .frequency import frequency_usage, write_frequency
from .phase_bias import phase_bias_curves, write_phase_bias

__all__ = ["cope_gate_counts", "decay_curves", "frequency_usage", "phase_bias_curves", "position_correlation", "write_cope_gates", "write_correlation", "write_decay",
           "write_frequency", "write_phase_bias"]
