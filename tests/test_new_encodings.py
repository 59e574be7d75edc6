"""Invariants of xPos, T5, FIRE, KERPLE and the dynamic position bias: shift invariance (FIRE's up to its threshold),
finite biases far from position 0, the blocked learned-bias path without a T x T tensor, decoding through the KV
cache, half precision, and a decoder model that trains with gradients reaching every encoding parameter.

Their formulas are checked against the papers in tests/test_{xpos,t5_bias,fire,kerple,dynamic_bias}.py; GQA,
padding and decoding properties that hold for every registered encoding run over these too
(tests/test_properties.py, test_kv_cache.py, test_padded_decoding.py, test_engine.py)."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import poskit
from poskit.attention import KVCache, blocked, cached_attention
from poskit.attention.engine import route
from poskit.models import ModelConfig, Transformer
from conftest import make_qkv
from cpu_kernel_helpers import set_kernel

NEW = ["xpos", "t5", "fire", "kerple-log", "kerple-power", "dynamic"]
BIASES = [n for n in NEW if n != "xpos"]
FIRE_THRESHOLD = 512  # FIRE's default L: queries up to L share one normaliser


def build(name, dtype=torch.float64, seed=0, **options):
    torch.manual_seed(seed)
    return poskit.build_encoding(name, head_dim=16, num_heads=4, **options).to(dtype)


@pytest.mark.parametrize("name", NEW)
@settings(max_examples=15, deadline=None)
@given(offset=st.integers(0, 10**9), T=st.integers(1, 9), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_logits_depend_only_on_relative_position(name, offset, T, causal, seed):
    if name == "xpos":
        offset %= 10**6 + 1  # float64 RoPE angles of positions near 1e9 are exact to ~1e-7 rad only
    if name == "fire":
        offset %= FIRE_THRESHOLD - T + 2  # every query position stays <= L (past it FIRE reads the position itself)
    enc = build(name, seed=seed)
    q, k, _ = make_qkv(Tq=T, Tk=T, gen_seed=seed)
    pos = torch.arange(T)
    a = poskit.attention_scores(q, k, enc, is_causal=causal, q_positions=pos, k_positions=pos, enable_gqa=True)
    b = poskit.attention_scores(q, k, enc, is_causal=causal, q_positions=pos + offset, k_positions=pos + offset,
                                enable_gqa=True)
    assert torch.equal(torch.isinf(a), torch.isinf(b))
    fin = torch.isfinite(a)
    torch.testing.assert_close(a[fin], b[fin], atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_biases_are_finite_a_billion_positions_out(name, dtype):
    # queries near 1e9 against keys from 0 on: distances from 0 to ~1e9, all representable
    enc = build(name, dtype=dtype)
    q = torch.randn(1, 4, 3, 16, dtype=dtype)
    qp = torch.tensor([10**9, 10**9 + 1, 2 * 10**9])
    kp = torch.tensor([0, 1, 10**9 - 5, 10**9, 10**9 + 1, 2 * 10**9])
    for causal in (True, False):
        bias = enc.bias(q, qp[None], kp[None], 0.25)
        assert bias.shape == (1, 4, 3, 6) and torch.isfinite(bias).all()
        out = poskit.attention(q, q.new_ones(1, 4, 6, 16), q.new_ones(1, 4, 6, 16), enc, q_positions=qp,
                               k_positions=kp, is_causal=causal)
        assert torch.isfinite(out).all()


class _Shapes(TorchDispatchMode):
    """The shape of every tensor any aten op produces while active."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("kernel", [False, True], ids=["blocked", "cpu-kernel"])
def test_trained_biases_take_the_blocked_path_without_a_t_by_t_tensor(name, kernel, monkeypatch):
    # memory itself is measured in benchmarks; here: no op, forward or backward, makes a (T, T) tensor of pairs,
    # on the blocked path and on the compiled kernel (which computes the bias per tile)
    B, H, T, D = 1, 2, 512, 8
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    path = set_kernel(monkeypatch, kernel) or "blocked-bias"
    assert route(enc, q, k) == path
    with _Shapes() as mode:
        poskit.attention(q, k, v, enc, is_causal=True).sum().backward()
    pairs = [s for s in mode.shapes if sum(n >= T for n in s) >= 2]
    assert not pairs, pairs[:3]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


@pytest.mark.parametrize("name", BIASES)
def test_frozen_biases_take_the_generated_block_path_and_equal_the_reference(name, monkeypatch):
    # a bias of positions alone without trainable parameters is static: built block by block and reused
    monkeypatch.setattr(blocked, "DEFAULT_BLOCK", 4)
    enc = build(name).requires_grad_(False)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=11, Tk=11)
    assert route(enc, q, k, enable_gqa=True) == "blocked"
    for causal in (True, False):
        got = poskit.attention(q, k, v, enc, is_causal=causal, enable_gqa=True)
        want = poskit.attention(q, k, v, enc, backend="reference", is_causal=causal, enable_gqa=True)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", NEW)
def test_decoding_far_along_with_key_padding_equals_the_full_forward(name):
    enc = build(name)
    B, H, Hkv, T = 2, 4, 2, 9
    q, k, v = make_qkv(B=B, H=H, Hkv=Hkv, Tq=T, Tk=T, gen_seed=4)
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, :3] = False  # row 0 left-padded
    pos = (torch.arange(T) + 10**6).expand(B, T)
    full = poskit.attention(q, k, v, enc, q_positions=pos, k_positions=pos, is_causal=True, enable_gqa=True,
                            attn_mask=real[:, None, None, :])
    cache = KVCache(1)
    steps = [cached_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache, 0, pos[:, :4],
                              attention_mask=real[:, :4])]
    for t in range(4, T):
        sl = slice(t, t + 1)
        steps.append(cached_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], enc, cache, 0, pos[:, sl],
                                      attention_mask=real[:, sl]))
    got = torch.cat(steps, 2)
    torch.testing.assert_close(got[1], full[1], atol=1e-10, rtol=0)
    torch.testing.assert_close(got[0, :, 3:], full[0, :, 3:], atol=1e-10, rtol=0)  # (pad queries see no key early)
    assert enc.cache_form == "raw" and not cache.layer(0).encoded


@pytest.mark.parametrize("name", NEW)
def test_fp32_default_path_matches_the_float64_reference(name):
    enc = build(name, dtype=torch.float32, seed=1)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=150, Tk=150, dtype=torch.float32, gen_seed=5)
    out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference", is_causal=True,
                           enable_gqa=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_stay_close_to_float64(name, dtype):
    enc = build(name, dtype=torch.float32, seed=2)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=40, Tk=40, dtype=torch.float32, gen_seed=6)
    out = poskit.attention(q.to(dtype), k.to(dtype), v.to(dtype), enc, is_causal=True)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference", is_causal=True)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=5e-2, rtol=0)


@pytest.mark.usefixtures("one_thread")  # tiny matrices: one thread is faster on a busy machine
@pytest.mark.parametrize("name", NEW)
def test_decoder_model_trains_and_every_encoding_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=23, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, encoding=name))
    encodings = model.encoding_modules()
    assert all(e.name == name for e in encodings)
    before = [p.detach().clone() for e in encodings for p in e.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, 23, (4, 17), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(6):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        if step == 0:
            for e in encodings:
                for n, p in e.named_parameters():
                    assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient reaches {n}"
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    after = [p.detach() for e in encodings for p in e.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))  # (xpos has none: nothing to compare)


@pytest.mark.parametrize("name", ["t5", "kerple-log", "dynamic"])
def test_a_frozen_bias_changed_in_place_is_not_served_stale(name):
    """A learned bias frozen with requires_grad_(False) is cached per positions; weights changed in place (an
    optimizer step elsewhere, load_state_dict) must give the new bias, as the reference does."""
    torch.manual_seed(0)
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2).requires_grad_(False)
    q, k, v = (torch.randn(1, 2, 12, 8) for _ in range(3))
    mask = torch.rand(1, 1, 12, 12, generator=torch.Generator().manual_seed(1)) > 0.3  # a general mask: SDPA + bias
    before = poskit.attention(q, k, v, enc, attn_mask=mask)
    with torch.no_grad():
        for p in enc.parameters():
            p.mul_(3.0).add_(0.5)
    after = poskit.attention(q, k, v, enc, attn_mask=mask)
    expected = poskit.attention(q, k, v, enc, attn_mask=mask, backend="reference")
    assert not torch.allclose(before, expected, atol=1e-4)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)
