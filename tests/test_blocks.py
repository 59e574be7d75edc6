"""Block ranges under a causal mask by position (poskit.attention.blocks) against brute force over every
(query, key) pair."""
import pytest
import torch

from poskit.attention.blocks import block_extrema, key_block_bounds, query_block_bounds, sorted_key_ends


def _visible(qpos, kpos):
    # (Bp, Tq, Tk): key s visible to query t iff k_positions[s] <= q_positions[t]
    return kpos[:, None, :] <= qpos[:, :, None]


def _positions(kind, g, B=2, Tq=45, Tk=70):
    if kind == "sorted":  # the cache layout: queries are the last Tq positions
        kpos = torch.arange(Tk).repeat(B, 1) + torch.tensor([[0], [9]])
        return kpos[:, Tk - Tq:], kpos
    if kind == "repeated":
        kpos = (torch.arange(Tk) // 3).repeat(B, 1)
        return kpos[:, Tk - Tq:], kpos
    return torch.stack([torch.randperm(Tk, generator=g)[:Tq] for _ in range(B)]), \
        torch.stack([torch.randperm(Tk, generator=g) for _ in range(B)])


@pytest.mark.parametrize("block", [1, 7, 32, 64])
def test_block_extrema(block):
    g = torch.Generator().manual_seed(block)
    pos = torch.randint(-50, 50, (3, 45), generator=g)
    lo, hi = block_extrema(pos, block)
    starts = range(0, 45, block)
    assert lo.shape == hi.shape == (3, len(starts))
    for n, i in enumerate(starts):
        assert torch.equal(lo[:, n], pos[:, i:i + block].amin(-1))
        assert torch.equal(hi[:, n], pos[:, i:i + block].amax(-1))


@pytest.mark.parametrize("kind", ["sorted", "repeated"])
@pytest.mark.parametrize("block", [16, 32, 64])
def test_sorted_key_ends(kind, block):
    qpos, kpos = _positions(kind, None)
    vis = _visible(qpos, kpos)
    some = sorted_key_ends(qpos, kpos, block)
    every = sorted_key_ends(qpos, kpos, block, whole_block=True)
    for n, i in enumerate(range(0, qpos.shape[1], block)):
        rows = vis[:, i:i + block]
        # keys are sorted, so the visible keys of a query are a prefix: count them
        assert torch.equal(some[:, n], rows.any(1).sum(-1))
        assert torch.equal(every[:, n], rows.all(1).sum(-1))


@pytest.mark.parametrize("kind", ["sorted", "repeated", "shuffled"])
@pytest.mark.parametrize("block_m, block_n", [(32, 32), (16, 64), (64, 16)])
def test_key_block_bounds(kind, block_m, block_n):
    qpos, kpos = _positions(kind, torch.Generator().manual_seed(block_m + block_n))
    Tq, Tk = qpos.shape[1], kpos.shape[1]
    vis = _visible(qpos, kpos)
    bounds = key_block_bounds(qpos, kpos, Tk, block_m, block_n)
    assert bounds.dtype == torch.int32 and bounds.shape == (2, -(-Tq // block_m), 3)
    for b in range(2):
        for m, i in enumerate(range(0, Tq, block_m)):
            n_full, n_lo, n_hi = bounds[b, m].tolist()
            assert 0 <= n_full <= n_lo <= n_hi <= -(-Tk // block_n)
            for n, j in enumerate(range(0, Tk, block_n)):
                tile = vis[b, i:i + block_m, j:j + block_n]
                if n < n_full:  # walked without a mask: every entry visible, never the ragged tail
                    assert tile.all() and j + block_n <= Tk
                elif tile.any():  # anything visible must be walked (with the mask)
                    assert n_lo <= n < n_hi


@pytest.mark.parametrize("kind", ["sorted", "repeated", "shuffled"])
@pytest.mark.parametrize("block_m, block_n", [(32, 32), (16, 64), (64, 16)])
def test_query_block_bounds(kind, block_m, block_n):
    qpos, kpos = _positions(kind, torch.Generator().manual_seed(block_m * block_n))
    Tq, Tk = qpos.shape[1], kpos.shape[1]
    vis = _visible(qpos, kpos)
    bounds = query_block_bounds(qpos, kpos, block_m, block_n)
    assert bounds.dtype == torch.int32 and bounds.shape == (2, -(-Tk // block_n), 3)
    for b in range(2):
        for n, j in enumerate(range(0, Tk, block_n)):
            m_lo, m_mid, m_hi = bounds[b, n].tolist()
            assert 0 <= m_lo <= m_mid <= m_hi <= -(-Tq // block_m)
            for m, i in enumerate(range(0, Tq, block_m)):
                tile = vis[b, i:i + block_m, j:j + block_n]
                if m_mid <= m < m_hi:  # walked without the causal mask: every entry visible
                    assert tile.all()
                elif tile.any():
                    assert m_lo <= m < m_mid
