"""The batched products of the blocked CPU paths, with grouped kv heads read where they lie.

Grouped-query attention: H query heads share H_kv = H / g kv heads, query head h reading kv head h // g (Hugging
Face's repeat_kv order). Flattened as the blocked paths hold them, queries are (n * g, r, .) with the g query
heads of kv row m at rows m * g ... m * g + g - 1 (what flattening (B, H, ...) gives), keys and values (n, c, .).
The g query heads of a kv head are stacked along the rows of one product instead of repeating the kv head g
times (repeat_kv): at a decode step that copy is the whole KV cache, g times over, for products that read it
once (measured: ALiBi's decode step at B=4, H=8, 2 kv heads, 4096 cached keys, fp32, without the compiled kernel,
33-38 ms against 5.5-7 ms for 8 kv heads and no grouping; docs/benchmarks.md). Stacking copies the block of query
rows, which is small.

`bmm` also reads a half-precision operand whose matrices lie apart (a KV cache's rows with room to grow, or keys
[0, c) of a longer row) where it lies, for a few query rows: torch's batched bf16 product copies such an operand
whole first (measured at 32 heads x 4096 keys x 64, one query row: 6.4 ms and 16 MB against 3.2 ms one product
per matrix; fp32 reads it in place).
"""
from __future__ import annotations

import torch

_HALF = (torch.bfloat16, torch.float16)
# Up to this many rows of the left operand a half-precision product over spread-out matrices runs one product per
# matrix (see the module docstring); more rows take torch.bmm, whose copy is then small beside the work. Training
# blocks (64 query rows against keys [0, ke) of a longer row) ran slower one product per matrix: bf16 forward +
# backward at B=8, H=8, T=1024 without the kernel, 64 here against 16 (medians of 5 alternated, AMD EPYC,
# 2026-11-27): ALiBi 368 against 273 ms, relative-capped 821 against 623, CoPE 764 against 594.
FEW_ROWS = 16


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm(a, b) (a (n, r, m), b (n, m, D)), reading a half-precision b in place where its matrices lie
    apart and a has at most FEW_ROWS rows."""
    if a.shape[1] > FEW_ROWS:
        return torch.bmm(a, b)
    return bmm_in_place(a, b)


def bmm_in_place(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm(a, b), one product per matrix where b is half precision and its matrices lie apart."""
    if a.dtype not in _HALF or _packed(b) or (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return torch.bmm(a, b)  # (out= records no graph: a backward run with create_graph keeps torch.bmm)
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for i in range(a.shape[0]):
        torch.mm(a[i], b[i], out=out[i])
    return out


def _packed(x: torch.Tensor) -> bool:
    """Whether x's matrices lie one after another, each dense row- or column-major (what torch's batched product
    takes without a copy)."""
    n, rows, cols = x.shape
    dense = (x.stride(2) == 1 and x.stride(1) == cols) or (x.stride(1) == 1 and x.stride(2) == rows)
    return dense and (n <= 1 or x.stride(0) == rows * cols)


def per_head(a: torch.Tensor, b: torch.Tensor, groups: int) -> torch.Tensor:
    """(n * g, r, D): each query head's a (n * g, r, m) times its kv head's b (n, m, D): q k^T (b = k^T),
    P v, dS k, dO v^T."""
    if groups == 1:
        return bmm(a, b)
    rows = a.shape[1]
    out = bmm(stacked(a, groups), b)  # (n, g * r, D)
    return out.view(a.shape[0], rows, b.shape[2])


def to_kv_heads(a: torch.Tensor, x: torch.Tensor, groups: int) -> torch.Tensor:
    """(n, c, D): a^T x summed over the g query heads of each kv head, for a (n * g, r, c) and x (n * g, r, D):
    the gradients that reach keys and values (P^T dO, dS^T q)."""
    if groups == 1:
        return bmm(a.transpose(1, 2), x)
    return bmm(stacked(a, groups).transpose(1, 2), stacked(x, groups))


def stacked(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(n * g, r, D) -> (n, g * r, D): the g query heads of each kv head one after another along the rows."""
    return x.reshape(x.shape[0] // groups, groups * x.shape[1], x.shape[2])


def kv_rows(q_rows: slice, groups: int) -> slice:
    """The rows of the flattened kv heads that the flattened query rows `q_rows` read (whole groups)."""
    return slice(q_rows.start // groups, q_rows.stop // groups)
