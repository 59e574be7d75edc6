"""Absolute encodings against their formulas computed the slow obvious way in float64."""
import math

import numpy as np
import pytest
import torch
from scipy.special import eval_legendre

import poskit
from conftest import build


def test_sinusoidal_matches_formula():
    d, base = 12, 10000.0
    enc = poskit.build_encoding("sinusoidal", head_dim=4, num_heads=1, dim=d)
    positions = [0, 1, 5, 17, 999, 123456]
    pe = enc.embed(torch.tensor(positions)).double()
    for r, pos in enumerate(positions):
        for i in range(d // 2):
            angle = pos / base ** (2 * i / d)
            assert abs(pe[r, 2 * i].item() - math.sin(angle)) < 1e-6
            assert abs(pe[r, 2 * i + 1].item() - math.cos(angle)) < 1e-6


def test_sinusoidal_batched_positions_and_base():
    enc = poskit.build_encoding("sinusoidal", head_dim=4, num_heads=1, dim=8, base=100.0)
    pos = torch.tensor([[0, 3], [7, 2]])
    pe = enc.embed(pos)
    assert pe.shape == (2, 2, 8)
    assert torch.allclose(pe[1, 0], enc.embed(torch.tensor([7]))[0])
    assert abs(pe[0, 1, 2].item() - math.sin(3 / 100 ** (2 / 8))) < 1e-6


def test_learned_table_lookup_and_grad():
    enc = build("learned", dim=8, dtype=torch.float32)
    pos = torch.tensor([0, 5, 63])
    out = enc.embed(pos)
    assert torch.equal(out, enc.table[pos])
    out.sum().backward()
    assert enc.table.grad[pos].abs().sum() > 0 and enc.table.grad[1].abs().sum() == 0


def test_learned_rejects_positions_beyond_table():
    enc = build("learned", dim=8)
    with pytest.raises(ValueError, match="max_positions=64"):
        enc.embed(torch.tensor([64]))


def test_legendre_matches_scipy_to_1e10():
    dim = 16
    enc = poskit.build_encoding("legendre", head_dim=4, num_heads=1, dim=dim)
    x = np.linspace(-1, 1, dim)
    positions = torch.tensor([0, 1, 2, 3, 10, 57, 256, 999, 1000])
    pe = enc.embed_float64(positions).numpy()
    expected = np.stack([eval_legendre(int(n), x) for n in positions])
    assert np.max(np.abs(pe - expected)) < 1e-10


def test_legendre_beyond_cache_equals_recurrence_and_stays_bounded():
    dim = 9
    small = poskit.build_encoding("legendre", head_dim=4, num_heads=1, dim=dim, cache_rows=16)
    big = poskit.build_encoding("legendre", head_dim=4, num_heads=1, dim=dim, cache_rows=2048)
    pos = torch.tensor([3, 20, 500, 2047])
    assert torch.allclose(small.embed_float64(pos), big.embed_float64(pos), atol=1e-12, rtol=0)
    far = small.embed_float64(torch.tensor([50_000, 100_000]))
    assert torch.isfinite(far).all() and far.abs().max() <= 1.0 + 1e-12
    # endpoints are exact: P_n(1) = 1, P_n(-1) = (-1)^n
    assert far[1, -1].item() == pytest.approx(1.0, abs=1e-9) and far[1, 0].item() == pytest.approx(1.0, abs=1e-9)
    assert far[0, 4].item() == pytest.approx(eval_legendre(50_000, 0.0), abs=1e-8)


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "legendre"])
def test_absolute_is_identity_inside_attention(name):
    enc = build(name, dim=32)
    none = build("none")
    q = torch.randn(1, 4, 5, 16, dtype=torch.float64)
    k = torch.randn(1, 4, 5, 16, dtype=torch.float64)
    assert torch.equal(poskit.attention_scores(q, k, enc), poskit.attention_scores(q, k, none))


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "legendre"])
def test_absolute_requires_dim(name):
    with pytest.raises(ValueError, match="dim"):
        poskit.build_encoding(name, head_dim=8, num_heads=2)


def test_absolute_rejects_float_and_negative_positions():
    enc = build("sinusoidal", dim=8)
    with pytest.raises(ValueError, match="integer"):
        enc.embed(torch.tensor([0.5]))
    with pytest.raises(ValueError, match=">= 0"):
        enc.embed(torch.tensor([-1]))
