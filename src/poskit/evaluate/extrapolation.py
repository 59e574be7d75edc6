"""Perplexity of a trained language model on windows longer than its training context.

The model is evaluated as trained ("as-is"), or, for RoPE models, with a context-extension variant swapped
in at test time (every scaling of encodings/rope_scaling.py: position interpolation, NTK-aware, dynamic NTK,
YaRN, Llama 3's and LongRoPE's) with factor = window / training context.
"""
from __future__ import annotations

import copy
import math
import re

import torch
import torch.nn.functional as F

from poskit.encodings import rope_scaling
from poskit.encodings.rope_hf import encoding_name
from poskit.models import Transformer
from poskit.tasks import IGNORE_INDEX

#: test-time RoPE variants: CLI name -> registered encoding name (every scaling rope_scaling.py has)
ROPE_SCALINGS = {name: encoding_name(name) for name in rope_scaling.ROPE_INIT_FUNCTIONS if name != "none"}

# rope-llama3's band as Llama 3.1 publishes it
LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 1.0, 4.0


def parse_lengths(spec: str | list, context: int | None = None) -> list[int]:
    """"1x,2x,512" -> window lengths; "Nx" means N times `context`. Sorted, duplicates removed."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        s = str(item).strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)x", s)
        if m:
            if context is None:
                raise ValueError(f"lengths: {s!r} is relative to the training context, which is unknown here")
            out.append(int(round(float(m.group(1)) * context)))
        elif s.isdigit():
            out.append(int(s))
        else:
            raise ValueError(f"lengths must be a comma-separated list of integers or multiples like 2x, got {s!r}")
    if not out or min(out) < 1:
        raise ValueError(f"lengths must be positive, got {spec!r}")
    return sorted(set(out))


def scaling_options(scaling: str, factor: float, original_max_positions: int, rotary_dim: int,
                      base: float) -> dict:
    """The options of the test-time variant `scaling` at scale `factor` for a model trained at
    `original_max_positions` (the variant's own options beside factor and the length):

    - llama3: Llama 3.1's band, low_freq_factor 1 and high_freq_factor 4.
    - longrope: a trained run has no searched per-frequency factors; short_factor is 1 for every frequency
      (nothing changes within the training context) and long_factor is YaRN's per-frequency divisor
      theta_i / theta'_i at the same factor (kept high frequencies, interpolated low ones: the kind of profile
      LongRoPE's search starts from), with LongRoPE's attention factor from `factor`."""
    variant = rope_scaling.ROPE_INIT_FUNCTIONS[scaling]
    options = {"factor": factor}
    if "original_max_positions" in variant.requires:
        options["original_max_positions"] = original_max_positions
    if scaling == "llama3":
        options.update(low_freq_factor=LLAMA3_LOW_FREQ_FACTOR, high_freq_factor=LLAMA3_HIGH_FREQ_FACTOR)
    elif scaling == "longrope":
        params = rope_scaling.RopeParameters(rotary_dim, base, factor, original_max_positions)
        divisors = rope_scaling.default_inv_freq(rotary_dim, base) / rope_scaling.yarn_scaling(params)[0]
        options.update(short_factor=[1.0] * (rotary_dim // 2), long_factor=divisors.tolist())
    return options


def with_rope_scaling(model: Transformer, scaling: str, factor: float, original_max_positions: int) -> Transformer:
    """A copy of a RoPE model whose attention layers use the test-time variant `scaling` (see ROPE_SCALINGS and
    scaling_options) at max(1, factor). Which models take it is what their encodings declare
    (`test_time_scalings`: plain RoPE, whatever name it is registered under)."""
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"scaling must be one of {list(ROPE_SCALINGS)}, got {scaling!r}")
    for block in model.blocks:
        if scaling not in block.attn.encoding.test_time_scalings:
            raise ValueError(f"test-time rope scaling {scaling!r} needs a model whose encoding takes it (plain rope); "
                             f"encoding {block.attn.encoding.name or model.config.encoding!r} takes none")
    model = copy.deepcopy(model)
    for block in model.blocks:
        old = block.attn.encoding
        options = scaling_options(scaling, max(1.0, float(factor)), original_max_positions, old.rotary_dim, old.base)
        block.attn.encoding = old.with_scaling(scaling, **options).to(next(model.parameters()).device)
    return model


@torch.no_grad()
def evaluate_lengths(model: Transformer, task, lengths: list[int], *, context: int, split: str = "test",
                     n_chars: int | None = None, last_fraction: float = 0.25, scaling: str | None = None) -> list[dict]:
    """Perplexity per character at each window length: one row per length with
    {"length", "multiple", "perplexity", "loss", "last_perplexity"} (last_* over the final `last_fraction`
    of each window, where the positions never seen in training are)."""
    if not hasattr(task, "eval_windows"):
        raise ValueError(f"task must be a language-modelling task with eval_windows (shakespeare), got {task.name!r}")
    rows = []
    for length in lengths:
        m = model if scaling is None else with_rope_scaling(model, scaling, length / context, context)
        m.eval()
        first_last = int(round(length * (1.0 - last_fraction)))  # first position counted in the last part
        total = torch.zeros(2, dtype=torch.float64)  # loss sums: all positions, last part
        count = torch.zeros(2, dtype=torch.float64)
        for batch in task.eval_windows(length, split, n_chars):
            logits = m(batch.inputs).float()  # (B, L, V)
            nll = F.cross_entropy(logits.transpose(1, 2), batch.targets, ignore_index=IGNORE_INDEX, reduction="none")
            mask = (batch.targets != IGNORE_INDEX).double()  # (B, L)
            total += torch.stack((nll.double().mul(mask).sum(), nll.double()[:, first_last:].mul(mask[:, first_last:]).sum()))
            count += torch.stack((mask.sum(), mask[:, first_last:].sum()))
        loss = (total / count.clamp(min=1)).tolist()
        rows.append({"length": length, "multiple": round(length / context, 3), "loss": loss[0],
                     "perplexity": math.exp(loss[0]), "last_perplexity": math.exp(loss[1]), "n_tokens": int(count[0])})
    return rows
