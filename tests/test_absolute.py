"""Absolute encodings against their formulas computed the slow obvious way in float64."""
import math

import numpy as np
import pytest
import torch
from scipy.special import eval_legendre

import poskit
from conftest import build
from grad_helpers import call_with_params


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


@pytest.mark.parametrize("cache_rows", [8192, 16])  # table lookup, and the on-demand recurrence past the table
def test_legendre_matches_scipy_to_1e10(cache_rows):
    dim = 16
    enc = poskit.build_encoding("legendre", head_dim=4, num_heads=1, dim=dim, cache_rows=cache_rows)
    x = np.linspace(-1, 1, dim)
    positions = torch.tensor(sorted(set(range(0, 1001, 37)) | {1, 2, 3, 999, 1000}))  # every 37th up to 1000
    pe = enc.embed_float64(positions).numpy()
    expected = np.stack([eval_legendre(int(n), x) for n in positions])
    assert np.max(np.abs(pe - expected)) < 1e-10


def test_legendre_bounded_up_to_1e5():
    dim = 16
    enc = poskit.build_encoding("legendre", head_dim=4, num_heads=1, dim=dim)
    positions = torch.tensor([1001, 4096, 8191, 8192, 12345, 33333, 50_000, 77_777, 99_999, 100_000])
    pe = enc.embed_float64(positions)
    assert torch.isfinite(pe).all() and pe.abs().max() <= 1.0 + 1e-12
    # |P_n(x)| <= 1 on [-1, 1] with equality only at the ends: interior values stay well inside
    assert pe[:, 1:-1].abs().max() < 0.5
    # endpoints are exact: P_n(1) = 1, P_n(-1) = (-1)^n
    assert torch.allclose(pe[:, -1], torch.ones(len(positions), dtype=torch.float64), atol=1e-9)
    assert torch.allclose(pe[:, 0], (-1.0) ** positions.double(), atol=1e-9)
    # and scipy agrees there too (its own recurrence), to rounding accumulated over 1e5 steps
    expected = np.stack([eval_legendre(int(n), np.linspace(-1, 1, dim)) for n in positions])
    assert np.max(np.abs(pe.numpy() - expected)) < 1e-8


def plain_attention(q, k, v, causal):
    """Scaled dot-product softmax attention with no position information, loops, float64:
    (logits with -inf where masked, output). Query head h reads kv head h // (H // H_kv)."""
    B, H, Tq, D = q.shape
    groups = H // k.shape[1]
    logits = torch.full((B, H, Tq, k.shape[2]), float("-inf"), dtype=torch.float64)
    out = torch.zeros(B, H, Tq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(Tq):
                keys = [s for s in range(k.shape[2]) if not causal or s <= t]
                scores = torch.stack([q[b, h, t] @ k[b, h // groups, s] / math.sqrt(D) for s in keys])
                weights = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
                logits[b, h, t, keys] = scores
                out[b, h, t] = sum(w * v[b, h // groups, s] for w, s in zip(weights, keys))
    return logits, out


@pytest.mark.parametrize("causal", [True, False])
def test_no_position_inside_attention_equals_plain_attention(causal):
    # none contributes nothing: attention is plain softmax(q k^T / sqrt(d)) v
    enc = build("none", dim=32)
    q = torch.randn(2, 4, 5, 16, dtype=torch.float64)
    k, v = torch.randn(2, 2, 5, 16, dtype=torch.float64), torch.randn(2, 2, 5, 8, dtype=torch.float64)
    want_logits, want = plain_attention(q, k, v, causal)
    got_logits = poskit.attention_scores(q, k, enc, is_causal=causal, enable_gqa=True)
    assert torch.equal(torch.isinf(got_logits), torch.isinf(want_logits))
    fin = torch.isfinite(want_logits)
    assert torch.allclose(got_logits[fin], want_logits[fin], atol=1e-12)
    for backend in ("reference", "auto"):
        assert torch.allclose(poskit.attention(q, k, v, enc, is_causal=causal, backend=backend, enable_gqa=True), want, atol=1e-12)


ABSOLUTE = ["sinusoidal", "learned", "legendre"]
ABSOLUTE_REFUSED = (r"^enc: the absolute encoding '{}' is added to the token embeddings \(x \+ enc.embed\(positions\)\), "
                    r"not inside attention; use the encoding 'none' inside attention")


@pytest.mark.parametrize("name", ABSOLUTE)
@pytest.mark.parametrize("call", ["attention", "attention_scores", "reference", "cached", "linear"])
def test_attention_refuses_an_absolute_encoding_saying_where_it_goes(name, call):
    # inside attention an absolute encoding would add nothing, silently: every entry point refuses it the same way
    from poskit.attention import KVCache, cached_attention, linear_attention, reference_attention

    enc = build(name, dim=32)
    q, k, v = (torch.randn(1, 4, 5, 16, dtype=torch.float64) for _ in range(3))
    cache = KVCache(num_layers=1)
    calls = {
        "attention": lambda: poskit.attention(q, k, v, enc, is_causal=True),
        "attention_scores": lambda: poskit.attention_scores(q, k, enc),
        "reference": lambda: reference_attention(q, k, v, enc),
        "cached": lambda: cached_attention(q, k, v, enc, cache, 0, torch.arange(5)),
        "linear": lambda: linear_attention(q, k, v, enc),
    }
    with pytest.raises(ValueError, match=ABSOLUTE_REFUSED.format(name)):
        calls[call]()
    assert cache.layer(0).length == 0  # refused before the cache is touched


@pytest.mark.parametrize("name", ABSOLUTE)
def test_a_model_with_an_absolute_encoding_adds_it_at_the_embeddings_and_uses_none_inside(name):
    from poskit.models import ModelConfig, Transformer

    opts = {"max_positions": 64} if name == "learned" else {}
    model = Transformer(ModelConfig(vocab_size=11, d_model=32, n_layers=1, n_heads=2, encoding=name,
                                    encoding_options=opts))
    assert model.abs_encoding.kind == "absolute"
    assert all(block.attn.encoding.kind == "none" for block in model.blocks)
    assert model(torch.randint(0, 11, (2, 6))).shape == (2, 6, 11)


def test_learned_table_gradcheck():
    enc = build("learned", dim=6, max_positions=8)
    pos = torch.tensor([[0, 5, 5], [7, 1, 0]])  # repeated positions: their gradients must accumulate
    table = enc.table.detach().clone().requires_grad_(True)
    w = torch.randn(2, 3, 6, dtype=torch.float64)

    def f(t):
        # the embeddings enter a nonlinear function so that the table's Jacobian is not trivially the identity
        return (call_with_params(enc, {"table": t}, enc.embed, pos) * w).tanh()

    assert torch.autograd.gradcheck(f, (table,))


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
