"""The numeric edges of attention and the encodings: every bad input gets an error of a
known type naming the argument, and every non-finite or empty input gives a defined answer, never a silently
finite or garbage one.

The table at the top lists the refused inputs; the tests below it check what comes out of accepted edge
inputs (NaN, empty sequences, huge positions, half precision) against float64 references.
"""
import math
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import poskit
from conftest import ENCODING_OPTIONS, build, make_qkv
from poskit.attention.engine import cached_attention
from poskit.attention.kv_cache import KVCache
from poskit.encodings.base import _REGISTRY, _bool_options
from poskit.encodings.cope import contextual_positions
from poskit.encodings.legendre import legendre_rows, recurrence_rows
from poskit.models import ModelConfig, Transformer

ATTENTION_ENCODINGS = [n for n in poskit.available_encodings() if _REGISTRY[n][0].kind != "absolute"]


def _meta(x):
    return x.to("meta")


def _call(fn="attention", enc="rope", mutate=None, **kw):
    """A thunk running poskit.<fn> on small valid float64 inputs, after `mutate(q, k, v)`."""
    def run():
        q, k, v = make_qkv()
        if mutate is not None:
            q, k, v = mutate(q, k, v)
        if fn == "scores":
            return poskit.attention_scores(q, k, build(enc), **{"is_causal": True, **kw}, enable_gqa=True)
        return poskit.attention(q, k, v, build(enc), **{"is_causal": True, **kw}, enable_gqa=True)
    return run


BAD_INPUTS = [
    # (id, thunk, error type, message fragment)
    ("q 3-d", _call(mutate=lambda q, k, v: (q[0], k, v)), ValueError, "q must be a 4-d tensor"),
    ("q integer", _call(mutate=lambda q, k, v: (q.long(), k.long(), v.long())), ValueError,
     "q must be a floating-point tensor"),
    ("q complex", _call(mutate=lambda q, k, v: (q.cfloat(), k.cfloat(), v.cfloat())), ValueError,
     "q must be a floating-point tensor"),
    ("k wrong head_dim", _call(mutate=lambda q, k, v: (q, k[..., :8], v)), ValueError, "k must have shape"),
    ("dtypes differ", _call(mutate=lambda q, k, v: (q, k.float(), v)), ValueError, "share a dtype"),
    ("q on meta", _call(mutate=lambda q, k, v: (_meta(q), k, v)), ValueError, "q must be on one of the devices"),
    ("k on meta", _call(mutate=lambda q, k, v: (q, _meta(k), v)), ValueError, "k must be on one of the devices"),
    ("v on meta", _call(mutate=lambda q, k, v: (q, k, _meta(v))), ValueError, "v must be on one of the devices"),
    ("all on meta, alibi", _call(enc="alibi", mutate=lambda q, k, v: (_meta(q), _meta(k), _meta(v))), ValueError,
     "q must be on one of the devices"),
    ("scores on meta", _call("scores", mutate=lambda q, k, v: (_meta(q), _meta(k), v)), ValueError,
     "q must be on one of the devices"),
    ("q_positions on meta", _call(q_positions=torch.arange(7, device="meta")), ValueError,
     "q_positions must be on one of the devices"),
    ("k_positions on meta", _call(k_positions=torch.arange(7, device="meta")), ValueError,
     "k_positions must be on one of the devices"),
    ("mask on meta", _call(attn_mask=torch.ones(2, 1, 1, 7, dtype=torch.bool, device="meta")), ValueError,
     "attn_mask must be on one of the devices"),
    ("float positions", _call(q_positions=torch.arange(7.0)), ValueError, "q_positions must be an integer tensor"),
    ("positions too short", _call(k_positions=torch.arange(6)), ValueError, "k_positions must have shape"),
    ("scale 0", _call(scale=0.0), ValueError, "scale must be a finite number > 0, got 0.0"),
    ("scale negative", _call(scale=-0.25), ValueError, "scale must be a finite number > 0, got -0.25"),
    ("scale NaN", _call(scale=float("nan")), ValueError, "scale must be a finite number > 0, got nan"),
    ("scale inf", _call(scale=float("inf")), ValueError, "scale must be a finite number > 0, got inf"),
    ("scale bool", _call(scale=True), ValueError, "scale must be a finite number > 0, got True"),
    ("scale string", _call(scale="0.5"), ValueError, "scale must be a finite number > 0, got '0.5'"),
    ("scale 0 on scores", _call("scores", scale=0.0), ValueError, "scale must be a finite number > 0"),
    ("scale 0 on sdpa", _call(enc="none", scale=0.0, backend="sdpa"), ValueError, "scale must be a finite number > 0"),
    ("scale 0 on blocked", _call(enc="pope", scale=-1.0), ValueError, "scale must be a finite number > 0"),
    ("bad backend", _call(backend="cuda"), ValueError, "backend must be one of"),
    ("relative past max_distance", _call(enc="relative", k_positions=torch.arange(7) * 10**6, is_causal=False),
     ValueError, "relative offsets must be within max_distance=64"),
    ("cope unsorted keys", _call(enc="cope", k_positions=torch.tensor([0, 2, 1, 3, 4, 5, 6])), ValueError,
     "k_positions must be non-decreasing"),
    ("legendre negative position", lambda: build("legendre").embed(torch.tensor([-1])), ValueError,
     "positions must be >= 0"),
    ("model T=0 float tokens", lambda: Transformer(ModelConfig(vocab_size=5, d_model=8, n_heads=2, n_layers=1))(
        torch.zeros(2)), ValueError, "tokens must be a (B, T) integer tensor"),
]


@pytest.mark.parametrize("thunk, error, fragment", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_table(thunk, error, fragment):
    with pytest.raises(error) as info:
        thunk()
    assert fragment in str(info.value)


# -- boolean options ---------------------------------------------------------------------------------

BOOL_OPTIONS = sorted((name, option) for name, (cls, fixed) in _REGISTRY.items()
                      for option in _bool_options(cls) - set(fixed))


def test_bool_options_are_found_from_signatures():
    # the flags of today's encodings, discovered (not listed in the engine): a new flag is checked as well
    assert {("pope", "softplus"), ("pope", "phase_bias"), ("relative", "cap"), ("cope-alibi", "learned_slopes")} \
        <= set(BOOL_OPTIONS)

    class Toy(poskit.PositionalEncoding):
        def __init__(self, *, head_dim: int, num_heads: int, flag: bool = False, count: int = 3, other=True):
            super().__init__(head_dim=head_dim, num_heads=num_heads)

    assert _bool_options(Toy) == {"flag", "other"}


@pytest.mark.parametrize("name, option", BOOL_OPTIONS)
@pytest.mark.parametrize("value", ["false", "true", "False", 0, 1, 1.0, None, np.float64(0.0), [True]])
def test_bool_option_refuses_non_bool(name, option, value):
    with pytest.raises(ValueError, match=rf"{option} must be true or false \(a bool\), got "):
        poskit.build_encoding(name, head_dim=8, num_heads=2, **{option: value})


@pytest.mark.parametrize("name, option", BOOL_OPTIONS)
@pytest.mark.parametrize("value", [True, False])
def test_bool_option_accepts_bools(name, option, value):
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2, **{option: value})
    assert getattr(enc, option) is value


# -- NaN in, NaN out --------------------------------------------------------------------------------

def _nan_row_case(name, T, dtype, backend, where):
    enc = build(name, dtype=dtype)
    q, k, v = make_qkv(B=1, H=4, Hkv=2, Tq=T, Tk=T, dtype=dtype)
    if where == "q":
        q[0, 1, T // 2, 3] = float("nan")
    else:  # the first key: under the causal mask it is the only key query 0 sees
        k[0, 0, 0, 2] = float("nan")
    return poskit.attention(q, k, v, enc, backend=backend, is_causal=True, enable_gqa=True)


# T=5 has fewer keys than one AVX-512 register of fp32 lanes: CPU SDPA's flash kernel zeroed the NaN row there
@pytest.mark.parametrize("T", [5, 37])
@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_nan_query_gives_nan_row(name, backend, T):
    out = _nan_row_case(name, T, torch.float64, backend, "q")
    assert out[0, 1, T // 2].isnan().all()
    finite = torch.ones_like(out, dtype=torch.bool)
    finite[0, 1, T // 2] = False
    assert torch.isfinite(out[finite]).all()  # only the row of the NaN query


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["none", "rope", "pope", "alibi"])
def test_nan_query_gives_nan_row_in_low_precision(name, dtype):
    assert _nan_row_case(name, 6, dtype, "auto", "q")[0, 1, 3].isnan().all()


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_nan_key_reaches_the_queries_that_see_it(name, backend):
    out = _nan_row_case(name, 6, torch.float64, backend, "k")
    assert out[0, :2].isnan().all()  # kv head 0 serves query heads 0 and 1; every query sees key 0


@pytest.mark.parametrize("name", ["rope", "pope", "alibi", "cope"])
def test_nan_query_in_a_decode_step_gives_nan(name):
    enc = build(name)
    cache = KVCache(1)
    q, k, v = make_qkv(B=1, H=4, Hkv=2, Tq=4, Tk=4)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(4))
    q1, k1, v1 = make_qkv(B=1, H=4, Hkv=2, Tq=1, Tk=1, gen_seed=1)
    q1[0, 2, 0, 0] = float("nan")
    out = cached_attention(q1, k1, v1, enc, cache, 0, torch.tensor([4]))
    assert out[0, 2].isnan().all() and torch.isfinite(out[0, [0, 1, 3]]).all()


@pytest.mark.parametrize("encoding", ["rope", "pope", "alibi", "relative", "cope", "legendre"])
def test_model_with_a_nan_weight_has_a_nan_loss(encoding):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding=encoding))
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
    tokens = torch.randint(0, 11, (2, 6))
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    assert loss.isnan()


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 40), row=st.integers(0, 39), name=st.sampled_from(ATTENTION_ENCODINGS),
       value=st.sampled_from([float("nan"), float("inf"), -float("inf")]))
def test_property_non_finite_query_never_gives_a_finite_row(T, row, name, value):
    row = row % T
    if name == "pope" and value < 0:
        value = float("nan")  # softplus(-inf) = 0 exactly: a zero magnitude, which is a finite input to PoPE
    enc = build(name)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=T, Tk=T)
    q[0, 0, row, 0] = value
    out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    # an infinite query channel gives +-inf logits (NaN where they meet -inf or 0): the row is never finite
    assert not torch.isfinite(out[0, 0, row]).all()
    assert torch.isfinite(out[0, 1:]).all()


# -- empty sequences ------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq, Tk", [(0, 0), (0, 5), (5, 0)])
@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_empty_sequences(name, backend, Tq, Tk):
    enc = build(name)
    q, k, v = make_qkv(Tq=Tq, Tk=Tk, Dv=12, requires_grad=True)
    kw = dict(is_causal=Tk == 0 or Tq == 0, gate_keys=k.detach() if getattr(enc, "gates", "") == "separate" else None)
    out = poskit.attention(q, k, v, enc, backend=backend, **{"is_causal": True, **kw}, enable_gqa=True)
    assert out.shape == (2, 4, Tq, 12) and out.dtype == q.dtype
    assert (out == 0).all()  # a query that sees no key outputs 0 (README), and there is none with Tq = 0
    out.sum().backward()  # still part of the graph: zero gradients, not an error
    assert (q.grad == 0).all() and q.grad.shape == q.shape
    scores = poskit.attention_scores(q, k, enc, v=v, **{"is_causal": True, **kw}, enable_gqa=True)
    assert scores.shape == (2, 4, Tq, Tk)


@pytest.mark.parametrize("name", ["rope", "pope", "cope"])
def test_empty_decode_step_leaves_the_cache_alone(name):
    enc = build(name)
    cache = KVCache(1)
    q, k, v = make_qkv(B=1, H=4, Hkv=2, Tq=3, Tk=3)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(3))
    out = cached_attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], enc, cache, 0, torch.arange(0))
    assert out.shape == (1, 4, 0, 16) and cache.next_position() == 3


@pytest.mark.parametrize("encoding", sorted(set(poskit.available_encodings()) - {"none"}))
def test_model_forward_with_no_tokens(encoding):
    opts = {k: v for k, v in ENCODING_OPTIONS.get(encoding, {}).items() if k != "init_std"}
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding=encoding,
                                    encoding_options=opts))
    cache = KVCache(1)
    for kw in ({}, {"cache": cache}):
        logits = model(torch.zeros(3, 0, dtype=torch.long), **kw)
        assert logits.shape == (3, 0, 11)
    assert cache.next_position() == 0


# -- CoPE's positions from NaN gates -----------------------------------------------------------

@pytest.mark.parametrize("name", ["cope", "cope-alibi"])
def test_cope_nan_gate_is_never_an_index(name):
    enc = build(name)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=6, Tk=6)
    k[0, 2, 3, 0] = float("nan")  # query head 2's gates over key 3 are NaN: the rows that count key 3
    out = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    assert out[0, 2, 3:].isnan().all() and torch.isfinite(out[0, [0, 1, 3]]).all()


@pytest.mark.parametrize("name", ["cope", "cope-alibi"])
def test_cope_nan_is_refused_before_the_triton_launch(name):
    enc = build(name, dtype=torch.float32)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=16, Tk=16, dtype=torch.float32)
    q[0, 0, 5, 1] = float("nan")
    with pytest.raises(ValueError, match="q and the gate keys must be finite for cope on the triton path"):
        poskit.attention(q, k, v, enc, backend="triton", is_causal=True, enable_gqa=True)


def test_cope_gate_sums_in_fp32_for_half_inputs():
    # 5000 gates of sigmoid(0) = 1/2: an fp16 running sum steps by 2 past 2048 and would stall there
    logits = torch.zeros(1, 1, 1, 5000, dtype=torch.float16)
    p = contextual_positions(logits, torch.ones(1, 1, 1, 5000, dtype=torch.bool), p_max=10**5)
    expected = 0.5 * torch.arange(5000, 0, -1, dtype=torch.float64).view(1, 1, 1, 5000)
    assert p.dtype == torch.float32 and torch.equal(p.double(), expected)


# -- Legendre at huge positions -------------------------------------------------------------------

def test_legendre_matches_scipy_at_1e6_and_1e7():
    from scipy.special import eval_legendre

    x = np.linspace(-1, 1, 9)
    for n in (10**6, 10**7):
        got = legendre_rows(np.array([n]), x)[0]
        # scipy runs the recurrence n steps (its P_n(1) drifts to 1 + 3.5e-6 at 1e7): interior points, 1e-12
        assert np.abs(got[1:-1] - eval_legendre(n, x[1:-1])).max() < 1e-12
        assert got[0] == (-1.0) ** n and got[-1] == 1.0


def test_legendre_at_1e9_against_a_high_precision_evaluation():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40

    def p_n(n, x):  # Stieltjes' series in 40-digit arithmetic: checks the float64/long-double evaluation
        n, t = mpmath.mpf(n), mpmath.acos(mpmath.mpf(x))
        total, a = mpmath.mpf(0), mpmath.mpf(1)
        for m in range(40):
            total += a * mpmath.cos((n + m + 0.5) * t - (m + 0.5) * mpmath.pi / 2) / (2 * mpmath.sin(t)) ** (m + 0.5)
            a *= (m + 0.5) ** 2 / ((m + 1) * (n + 1.5 + m))
        return float(4 / mpmath.pi * mpmath.sqrt(mpmath.pi) / 2 * mpmath.gamma(n + 1) / mpmath.gamma(n + 1.5) * total)

    x = np.linspace(-1, 1, 16)[1:-1]
    for n in (10**8 + 7, 10**9):
        expected = np.array([p_n(n, xi) for xi in x])
        # relative to the amplitude sqrt(2 / (pi n sin t)) ~ 1e-5: the long-double phase keeps 1e-9 of it
        assert np.abs(legendre_rows(np.array([n]), x)[0] - expected).max() < 1e-9 * np.abs(expected).max()


def test_legendre_at_1e9_satisfies_bonnets_recurrence():
    # three independent evaluations at n - 1, n, n + 1 tie together as the recurrence says
    x = np.linspace(-1, 1, 33)
    n = 10**9
    p = legendre_rows(np.array([n - 1, n, n + 1]), x)
    residual = (n + 1) * p[2] - (2 * n + 1) * x * p[1] + n * p[0]
    assert np.abs(residual).max() < 1e-6 * n * np.abs(p[1:-1]).max()


def test_legendre_huge_positions_take_constant_time():
    enc = build("legendre", dim=64)
    start = time.perf_counter()
    pe = enc.embed_float64(torch.tensor([[10**6, 10**9, 10**12, 2**62]]))
    assert time.perf_counter() - start < 2.0  # the recurrence took ~2 s at 1e6 alone
    assert torch.isfinite(pe).all() and pe.abs().max() <= 1.0


@settings(max_examples=20, deadline=None)
@given(n=st.integers(32, 12_000), dim=st.sampled_from([2, 3, 16, 64, 1000]))
def test_property_series_equals_the_recurrence(n, dim):
    x = np.linspace(-1, 1, dim)
    degrees = np.array([n, n + 1, 5])
    assert np.abs(legendre_rows(degrees, x) - recurrence_rows(degrees, x)).max() < 2e-13


def test_legendre_cached_table_unchanged():
    enc = build("legendre", dim=16, cache_rows=300)
    positions = torch.arange(0, 600)
    x = np.linspace(-1, 1, 16)
    expected = recurrence_rows(positions.numpy(), x)
    got = enc.embed_float64(positions).numpy()
    assert np.array_equal(got[:300], expected[:300])  # the table: the recurrence, bit for bit
    assert np.abs(got - expected).max() < 1e-14


# -- biases in fp32 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_alibi_far_positions_in_half_precision(dtype, backend):
    enc = build("alibi")
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=4, Tk=6)
    # every visible distance is past 65504 and the keys are 100 apart: fp16 distances overflow to inf (NaN
    # out) and bf16 ones round to multiples of 512 (uniform weights)
    qp = torch.arange(200_000, 200_004)
    kp = torch.tensor([0, 100_000, 100_100, 100_200, 100_300, 100_400])
    ref = poskit.attention(q, k, v, enc, q_positions=qp, k_positions=kp, backend="reference", is_causal=True, enable_gqa=True)
    out = poskit.attention(q.to(dtype), k.to(dtype), v.to(dtype), enc, q_positions=qp, k_positions=kp,
                           backend=backend, is_causal=True, enable_gqa=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert (out.double() - ref).abs().max() < tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_alibi_bias_is_fp32_from_integer_distances(dtype):
    enc = build("alibi")
    qp, kp = torch.tensor([[10**7]]), torch.tensor([[0, 70_000, 10**7 - 3]])
    bias = enc.bias(torch.zeros(1, 4, 1, 16, dtype=dtype), qp, kp, 1.0)
    expected = -torch.tensor(poskit.encodings.alibi.alibi_slopes(4), dtype=torch.float64)[:, None, None] \
        * (qp[0, :, None] - kp[0]).double()
    assert bias.dtype == torch.float32
    assert torch.allclose(bias.double(), expected, rtol=1e-7, atol=0)


@pytest.mark.parametrize("name", ["rope", "pope", "alibi"])
def test_vmap_over_attention_is_refused_by_name(name):
    # torch.func.vmap cannot run poskit's value checks; the refusal names the argument and the way around it
    enc = build(name)
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"^q is batched by torch\.func\.vmap.*fold the mapped dimension into the batch"):
        torch.func.vmap(lambda x: poskit.attention(x, k, v, enc, is_causal=True))(q.unsqueeze(0).expand(3, -1, -1, -1, -1))
    with pytest.raises(ValueError, match=r"^k is batched by torch\.func\.vmap"):
        torch.func.vmap(lambda x: poskit.attention(q, x, v, enc, is_causal=True))(k.unsqueeze(0).expand(2, -1, -1, -1, -1))
