"""CoPE, contextual position encoding (Golovneva et al., eq. 3-9 and the Appendix B listing).

g_ts = sigmoid(logit_ts) on visible keys (0 on masked ones), where logit_ts = scale * q_t . gk_s is the
content logit (gk = keys, values, or separately projected gate keys), p_ts = sum of g over keys s..t
(a suffix sum along the key axis), clamped to p_max - 1, and the bias z_t[p_ts] with z_t[j] = q_t . e[j]
interpolated linearly between floor(p) and ceil(p). e has shape (head_dim, p_max) and is shared by the heads.

"cope-alibi" (eq. 10) replaces the interpolated embedding by a head-specific linear term in p_ts. Eq. 10
writes + m p; the slopes here *penalise* contextual distance as ALiBi does (bias = -m_h p_ts), which is what
the paper's fixed slopes {1, 1/2, ...} need to favour the latest counted token; learned slopes start at 0
and may take either sign, so for them the convention is immaterial. The slopes are, by option:

- default: ALiBi's slopes for num_heads (Press et al.), fixed;
- ``slopes=[m_1, ..., m_H]``: any H fixed slopes, e.g. the paper's Flip-Flop sets for 4 heads
  {1, 1/2, 1/2^2, 1/2^3}, {1/2^2, ..., 1/2^5}, {1/2^4, ..., 1/2^7} (§5.1);
- ``learned_slopes=True``: one trainable slope per head, initialised at 0 (not combinable with ``slopes``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .alibi import alibi_slopes, bias_dtype
from .base import PositionalEncoding, register

GATES = ("keys", "values", "separate")


def check_ordered_keys(k_positions: torch.Tensor) -> None:
    """Raise ValueError unless the (1|B, Tk) key positions are non-decreasing along the key axis.

    p_ts is a suffix sum over the key *index* axis, which is "the keys at positions >= s" only for ordered keys
    (and the kernels find a query block's causal key range by searchsorted): unordered keys would give a
    silently wrong result. Under torch.compile the check runs inside the graph (reading its verdict into
    Python would break the graph, which fullgraph=True refuses), as a RuntimeError with the same message."""
    if k_positions.shape[-1] < 2:
        return
    ordered = (k_positions[:, 1:] >= k_positions[:, :-1]).all()
    message = "k_positions must be non-decreasing for cope/cope-alibi (gate sums run over later keys)"
    if torch.compiler.is_compiling():
        torch._assert_async(ordered, message)
    elif not bool(ordered):
        raise ValueError(message)


def contextual_positions(gate_logits: torch.Tensor, visible: torch.Tensor, p_max: int) -> torch.Tensor:
    """p_ts = min(sum_{s' >= s, visible} sigmoid(gate_logit_ts'), p_max - 1): (B, H, Tq, Tk), in fp32 for half
    inputs (float64 kept): an fp16 running sum of gates steps by 2 past 2048 and overflows past 65504."""
    gates = torch.sigmoid(gate_logits.to(bias_dtype(gate_logits.dtype))) * visible
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=p_max - 1)


def interpolate(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """z (..., p_max) sampled at fractional p (..., Tk) by linear interpolation between floor and ceil.

    A NaN position (from a NaN gate logit) must not become an index: NaN.long() is INT64_MIN, an out-of-range
    read. It reads row 0 instead and its weight w = p - 0 stays NaN, which carries the NaN into the result.
    """
    safe = p.nan_to_num(0.0)
    lo, hi = safe.floor(), safe.ceil()
    w = p - lo
    return z.gather(-1, hi.long()) * w + z.gather(-1, lo.long()) * (1 - w)


class CoPEBase(PositionalEncoding):
    kind = "contextual"
    fused_kernel = "triton_cope"  # attention/triton_cope.py: reads p_max, gate_source and fused_operands

    def __init__(self, *, head_dim: int, num_heads: int, p_max: int, gates: str):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        # p_max's range is checked by build_encoding (base.OPTION_CHECKS)
        if gates not in GATES:
            raise ValueError(f"gates must be one of {list(GATES)}, got {gates!r}")
        self.p_max, self.gates = p_max, gates

    def check_positions(self, q_positions, k_positions, visible) -> None:
        check_ordered_keys(k_positions)

    @property
    def needs_gate_keys(self) -> bool:
        return self.gates == "separate"

    def fused_operands(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(position embeddings e (head_dim, p_max) or None, slopes (num_heads,) or None): what the fused
        kernel interpolates (cope) or multiplies by the contextual position (cope-alibi)."""
        raise NotImplementedError

    def gate_source(self, k, v, gate_keys):
        """The tensor the gates dot q with: (B, Hkv, Tk, head_dim)."""
        if self.gates == "keys":
            if gate_keys is not None:
                raise ValueError("gate_keys is only accepted with gates='separate'")
            return k
        if self.gates == "values":
            if v is None:
                raise ValueError("gates='values' needs v (B, H_kv, Tk, head_dim): pass v= to attention_scores")
            if v.shape[-1] != k.shape[-1]:
                raise ValueError(f"gates='values' needs v with head_dim={k.shape[-1]} channels, got {v.shape[-1]}")
            return v
        if gate_keys is None:
            raise ValueError("gates='separate' needs gate_keys (B, H_kv, Tk, head_dim) passed to attention")
        if gate_keys.shape != k.shape:
            raise ValueError(f"gate_keys must have the shape of k {tuple(k.shape)}, got {tuple(gate_keys.shape)}")
        return gate_keys

    def positions(self, gate_logits, visible):
        return contextual_positions(gate_logits, visible, self.p_max)


@register("cope")
class CoPEEncoding(CoPEBase):
    """CoPE: positions counted by gates on the content, then a learned embedding of the count.

    g_ts = sigmoid(scale * q_t . gk_s), p_ts = sum_{j=s..t} g_tj clamped to p_max - 1 (eq. 3-4), and the
    logit gains z_t[p_ts] with z_t[j] = q_t . e[j], interpolated between floor(p) and ceil(p) (eq. 5-7).

    Paper: Golovneva, Wang, Weston, Sukhbaatar, "Contextual Position Encoding: Learning to Count What's
    Important" (eq. 3-9, Appendix B listing).

    Trainable: the position embeddings e train only as part of the model the optimizer trains. Assign the
    encoding as an attribute of your nn.Module (poskit.nn.Attention and poskit's models do), so that
    model.parameters() holds them; built at module level and passed to poskit.attention(), it never trains (its
    embeddings stay at their initial zeros), and attention() warns once (UntrainedEncodingWarning,
    encodings/registration.py).

    Options (defaults):
        p_max=64: number of integer positions (the embedding table's width).
        gates='keys': gate logits from the keys, 'values' (val-gates) or 'separate' (sep-keys: projected gate keys).
        init_std=0.0: the embedding table starts at zero as in the listing; > 0 for a random start.
    """
    def __init__(self, *, head_dim: int, num_heads: int, p_max: int = 64, gates: str = "keys", init_std: float = 0.0):
        super().__init__(head_dim=head_dim, num_heads=num_heads, p_max=p_max, gates=gates)
        # zeros as in the reference listing; init_std > 0 gives a random start
        self.pos_emb = nn.Parameter(torch.randn(head_dim, p_max) * init_std)

    def fused_operands(self):
        return self.pos_emb, None

    def contextual_bias(self, q, gate_logits, visible):
        p = self.positions(gate_logits, visible)
        z = q @ self.pos_emb.to(q.dtype)  # (B, H, Tq, p_max): z_t[j] = q_t . e[j] (not scaled, as in the listing)
        return interpolate(z, p)


def fixed_slopes(slopes, num_heads: int) -> list[float]:
    """The `slopes` option as num_heads finite floats; ALiBi's slopes when it is None."""
    if slopes is None:
        return alibi_slopes(num_heads)
    values = None
    if not isinstance(slopes, str):  # a str iterates as characters: "1248" must not pass as 4 slopes
        try:
            values = [float(m) for m in slopes]
        except (TypeError, ValueError, RuntimeError):  # not iterable, not numbers, or a multi-element tensor row
            pass
    if values is None or len(values) != num_heads or not all(math.isfinite(m) for m in values):
        raise ValueError(f"slopes must be a sequence of num_heads={num_heads} finite numbers (one per head), got {slopes!r}")
    return values


@register("cope-alibi")
class CoPEALiBiEncoding(CoPEBase):
    """CoPE-ALiBi: CoPE's contextual positions p_ts with a per-head linear penalty, bias = -m_h p_ts (eq. 10).

    Paper: Golovneva et al., "Contextual Position Encoding" (eq. 10; Flip-Flop slopes in section 5.1).

    Trainable: learned slopes (learned_slopes=True) train only as part of the model the optimizer trains. Assign
    the encoding as an attribute of your nn.Module (poskit.nn.Attention and poskit's models do), so that
    model.parameters() holds them; built at module level and passed to poskit.attention(), it never trains (its
    slopes stay at 0), and attention() warns once (UntrainedEncodingWarning, encodings/registration.py).

    Options (defaults):
        p_max=64: contextual positions are clamped to p_max - 1.
        gates='keys': as for cope ('keys', 'values' or 'separate').
        learned_slopes=False: one trainable slope per head, starting at 0.
        slopes=None: fixed slopes, one per head; None = ALiBi's slopes for num_heads.
    """
    def __init__(self, *, head_dim: int, num_heads: int, p_max: int = 64, gates: str = "keys", learned_slopes: bool = False,
                 slopes: Sequence[float] | None = None):
        super().__init__(head_dim=head_dim, num_heads=num_heads, p_max=p_max, gates=gates)
        self.learned_slopes = bool(learned_slopes)
        if self.learned_slopes:
            if slopes is not None:
                raise ValueError("slopes (fixed) and learned_slopes=True exclude each other: learned slopes start at 0")
            self.slopes = nn.Parameter(torch.zeros(num_heads))  # per head (and per layer), initialised at 0
        else:
            self.register_buffer("slopes", torch.tensor(fixed_slopes(slopes, num_heads)), persistent=False)

    def fused_operands(self):
        return None, self.slopes

    def contextual_bias(self, q, gate_logits, visible):
        p = self.positions(gate_logits, visible)
        return -self.slopes.to(p.dtype)[:, None, None] * p
