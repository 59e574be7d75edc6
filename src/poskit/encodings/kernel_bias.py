"""What the compiled CPU attention kernel needs from a bias encoding: the `kernel_bias` declaration.

An encoding of kind "bias" whose bias the kernel can compute from positions (never a Tq x Tk tensor) defines

    def kernel_bias(self, q_positions, k_positions) -> KernelBias | None

for the (1|B, Tq) and (1|B, Tk) int64 positions of a call, returning one of the forms below, or None when the
kernel cannot give its exact bias for these positions (the call then keeps its blocked path). Without the
method (the default: `declared` reads it with getattr) an encoding is never routed to the kernel. The bias the
form describes must equal the encoding's `bias(q, q_positions, k_positions, scale)` on every pair, and the
values must be built with autograd from the encoding's parameters: the kernel returns their gradient.

- KernelBias("slopes", slopes (H,)): bias = -slopes[h] * |t - s| (ALiBi); no gradient.
- KernelBias("distance_table", table (H, R), lo): bias = table[h, (t - s) - lo] for every distance t - s of the
  call (`distance_span` gives [lo, lo + R - 1]), for a bias that is a per-head function of the distance alone
  (T5 buckets, KERPLE, dynamic, FIRE below its threshold); the kernel accumulates the table's gradient.
- KernelBias("offset_embeddings", embeddings (2M + 1, head_dim), M): bias = scale * q_t . embeddings[clamp(t - s,
  -M, M) + M] (learned relative positions; scale is the attention scale); gradients for q and the embeddings.

Here t and s are the query's and the key's positions.
"""
from __future__ import annotations

import inspect
from typing import NamedTuple

import torch

FORMS = ("slopes", "distance_table", "offset_embeddings")


class KernelBias(NamedTuple):
    form: str  # one of FORMS
    values: torch.Tensor
    offset: int = 0  # distance_table: the distance of column 0 (lo); offset_embeddings: M


def _defining_class(cls: type, attribute: str) -> type | None:
    return next((c for c in cls.__mro__ if attribute in vars(c)), None)


def declared(enc, q_positions: torch.Tensor, k_positions: torch.Tensor) -> KernelBias | None:
    """The encoding's KernelBias for these positions, or None: no declaration (the default), a declaration that
    declines these positions, or a subclass that redefines `bias` below the class that declared it (its
    declaration would describe another bias)."""
    method = getattr(enc, "kernel_bias", None)
    if method is None:
        return None
    cls = type(enc)
    bias_owner, declared_by = _defining_class(cls, "bias"), _defining_class(cls, "kernel_bias")
    if bias_owner is not None and declared_by is not None and not issubclass(declared_by, bias_owner):
        return None
    found = method(q_positions, k_positions)
    if found is not None and found.form not in FORMS:
        raise ValueError(f"{cls.__name__}.kernel_bias returned the form {found.form!r}; allowed: {list(FORMS)}")
    return found


# A distance table covers every distance between a query and a key of the call, which positions with large gaps
# make long: beyond this many distances per head (or 4 per query and key, if more) the blocked path serves.
MAX_TABLE_DISTANCES = 1 << 16


def distance_span(q_positions: torch.Tensor, k_positions: torch.Tensor) -> tuple[int, int] | None:
    """(lo, hi): the smallest and largest distance t - s over every query/key pair (all batch rows), or None
    when there is no pair or the span is longer than a table should be."""
    if not q_positions.numel() or not k_positions.numel():
        return None
    qmin, qmax = (int(x) for x in q_positions.aminmax())
    kmin, kmax = (int(x) for x in k_positions.aminmax())
    lo, hi = qmin - kmax, qmax - kmin
    limit = max(MAX_TABLE_DISTANCES, 4 * (q_positions.shape[-1] + k_positions.shape[-1]))
    return (lo, hi) if hi - lo + 1 <= limit else None


def distances(lo: int, hi: int, device) -> torch.Tensor:
    """The distances lo..hi as an int64 (R,) tensor."""
    return torch.arange(lo, hi + 1, device=device)


def is_declared(enc) -> bool:
    """Whether the encoding declares a kernel bias at all (for reports: it may still decline some positions)."""
    method = getattr(enc, "kernel_bias", None)
    return method is not None and inspect.ismethod(method)
