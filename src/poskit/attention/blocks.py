"""Which keys a block of queries can see under a causal mask by position.

A key s is visible to a query t iff k_positions[s] <= q_positions[t]. The blocked CPU path and the host side
of the Triton kernels split the queries (and the kernels also the keys) into blocks and skip, per block, what
no query of it can see. The arithmetic lives here once: plain torch on the (batch, T) position tensors, a few
tiny ops and no device sync.
"""
from __future__ import annotations

import torch


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _blocked(pos: torch.Tensor, block: int) -> torch.Tensor:
    # (Bp, T) -> (Bp, nblocks, block); the ragged last block is padded with copies of the row's last entry,
    # which changes neither its minimum nor its maximum
    bp, t = pos.shape
    n = cdiv(t, block)
    pad = n * block - t
    if pad:
        pos = torch.cat([pos, pos[:, -1:].expand(bp, pad)], 1)
    return pos.reshape(bp, n, block)


def block_extrema(pos: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of each block of `block` consecutive positions of pos (Bp, T), each (Bp, cdiv(T, block))."""
    blocks = _blocked(pos, block)
    return blocks.amin(-1), blocks.amax(-1)


def sorted_key_ends(q_positions: torch.Tensor, k_positions: torch.Tensor, block: int, *,
                    whole_block: bool = False) -> torch.Tensor:
    """For keys sorted ascending along the last axis: per block of `block` queries, one past the last key that
    some query of the block sees, or with whole_block=True that every query of it sees.

    q_positions (Bp, Tq), k_positions (Bp, Tk) -> (Bp, cdiv(Tq, block)) int64 key counts.
    """
    blocks = _blocked(q_positions, block)
    limit = blocks.amin(-1) if whole_block else blocks.amax(-1)
    return torch.searchsorted(k_positions, limit, right=True)


def key_block_bounds(q_positions: torch.Tensor, k_positions: torch.Tensor, tk: int, block_m: int,
                     block_n: int) -> torch.Tensor:
    """For each (batch, query block): [n_full, n_lo, n_hi] in key blocks, for keys in any order.

    Key blocks [0, n_full) are visible to every query of the block (no mask needed); blocks [n_lo, n_hi) need
    element-wise masking; the rest are skipped. Returns (Bp, nblocks_m, 3) int32."""
    qmin, qmax = block_extrema(q_positions, block_m)
    kmin, kmax = block_extrema(k_positions, block_n)
    n_n = kmin.shape[1]
    vis = kmin[:, None, :] <= qmax[:, :, None]  # (Bp, nM, nN)
    full = kmax[:, None, :] <= qmin[:, :, None]
    if tk % block_n:
        full[..., -1] = False  # ragged tail always goes through the masked path
    ar = torch.arange(n_n, device=vis.device)
    hi = torch.where(vis, ar + 1, 0).amax(-1)
    lo = torch.minimum(torch.where(vis, ar, n_n).amin(-1), hi)
    n_full = full.to(torch.int32).cumprod(-1).sum(-1)
    lo = torch.maximum(lo, n_full)
    return torch.stack([n_full, lo, hi], -1).to(torch.int32).contiguous()


def query_block_bounds(q_positions: torch.Tensor, k_positions: torch.Tensor, block_m: int,
                       block_n: int) -> torch.Tensor:
    """For each (batch, key block): [m_lo, m_mid, m_hi] in query blocks, for positions in any order.

    Query blocks [m_lo, m_mid) see part of the key block (masked path), [m_mid, m_hi) see all of it; the rest
    are skipped. Returns (Bp, nblocks_n, 3) int32."""
    qmin, qmax = block_extrema(q_positions, block_m)
    kmin, kmax = block_extrema(k_positions, block_n)
    n_m = qmin.shape[1]
    rel = qmax[:, None, :] >= kmin[:, :, None]  # (Bp, nN, nM)
    fullq = qmin[:, None, :] >= kmax[:, :, None]
    ar = torch.arange(n_m, device=rel.device)
    hi = torch.where(rel, ar + 1, 0).amax(-1)
    lo = torch.minimum(torch.where(rel, ar, n_m).amin(-1), hi)
    suffix = fullq.flip(-1).to(torch.int32).cumprod(-1).sum(-1)
    mid = torch.maximum(torch.minimum(n_m - suffix, hi), lo)
    return torch.stack([lo, mid, hi], -1).to(torch.int32).contiguous()
