"""The blocked learned-bias path (attention/blocked_bias.py) against the float64 reference, forward and backward
into q, k, v and the bias table."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_blocked_cope import _LargestOutput

import poskit
from poskit.attention import blocked
from poskit.attention.blocked_bias import blocked_bias_attention
from poskit.attention.engine import route
from poskit.attention.inputs import prepare
from poskit.encodings import base
from grad_helpers import call_with_params
from cpu_kernel_helpers import kernel_off, set_kernel



def attend(q, k, v, enc, *, causal=True, key_padding_mask=None, **kw):
    """poskit.attention with this file's spelling: causal by default, GQA allowed, and a (B, Tk) key padding
    mask (True = real key) passed as SDPA's bool attn_mask (True = attend)."""
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    return poskit.attention(q, k, v, enc, is_causal=causal, attn_mask=mask, enable_gqa=True, **kw)

def run_blocked(enc, q, k, v, block, causal=True, q_positions=None, k_positions=None, key_padding_mask=None):
    inp = prepare(q, k, v, enc, scale=None, causal=causal, q_positions=q_positions, k_positions=k_positions,
                  key_padding_mask=key_padding_mask)
    return blocked_bias_attention(q, k, v, enc, scale=inp.scale, q_positions=inp.q_positions,
                                  k_positions=inp.k_positions, causal=inp.causal,
                                  key_padding_mask=inp.key_padding_mask, block=block)


def assert_same(got, want, inputs, seed, nonzero=True):
    torch.testing.assert_close(got, want, atol=1e-11, rtol=0)
    w = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed))
    for n, (g, r) in enumerate(zip(torch.autograd.grad(got, inputs, w), torch.autograd.grad(want, inputs, w))):
        assert not nonzero or r.abs().max() > 0, f"input {n} gets no gradient: the comparison would be empty"
        torch.testing.assert_close(g, r, atol=1e-10, rtol=0, msg=lambda m: f"gradient of input {n}: {m}")


@settings(max_examples=50, deadline=None)
@given(
    name=st.sampled_from(["relative", "relative-capped"]),
    B=st.integers(1, 2), Hkv=st.integers(1, 2), groups=st.sampled_from([1, 2]),
    Tk=st.integers(1, 40), n_new=st.integers(1, 40), block=st.integers(1, 12), max_distance=st.integers(0, 12),
    causal=st.booleans(), padding=st.booleans(), offset=st.integers(0, 50), seed=st.integers(0, 2**16),
)
def test_blocked_bias_equals_reference(name, B, Hkv, groups, Tk, n_new, block, max_distance, causal, padding,
                                       offset, seed):
    Tq = min(n_new, Tk)
    H, D = Hkv * groups, 8
    if name == "relative":  # uncapped: the table must hold every offset that occurs
        max_distance = Tk
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, max_distance=max_distance, init_std=1.0).double()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64).requires_grad_()
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    kw = dict(causal=causal, q_positions=torch.arange(Tk - Tq, Tk) + offset, k_positions=torch.arange(Tk) + offset)
    if padding:
        kw["key_padding_mask"] = torch.rand(B, Tk, generator=g) > 0.3
    got = run_blocked(enc, q, k, v, block, **kw)
    want = attend(q, k, v, enc, backend="reference", **kw)
    # (a single key, or every key padded, leaves some inputs without gradient: compared as zeros)
    assert_same(got, want, [q, k, v, enc.embeddings], seed, nonzero=False)


def test_gradient_reaches_parameters_swapped_in_by_functional_call():
    # the backward regenerates the bias with the tensors the call was made with, not the module's own
    enc = poskit.build_encoding("relative-capped", head_dim=4, num_heads=2, max_distance=3, init_std=1.0).double()
    q, k, v = (torch.randn(1, 2, 10, 4, dtype=torch.float64) for _ in range(3))
    table = torch.randn_like(enc.embeddings, requires_grad=True)
    got = call_with_params(enc, {"embeddings": table}, lambda: run_blocked(enc, q, k, v, block=3))
    with torch.no_grad():
        enc.embeddings.copy_(table)
    want = attend(q, k, v, enc, backend="reference")
    w = torch.randn_like(want)
    (grad,) = torch.autograd.grad(got, table, w)
    (want_grad,) = torch.autograd.grad(want, enc.embeddings, w)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, want_grad, atol=1e-12, rtol=0)


class ToyLearnedSlopes(base.PositionalEncoding):
    """A learned bias that does not read q: -m_h |t - s| with trainable m (any encoding of kind "bias")."""

    kind = "bias"

    def __init__(self, *, head_dim, num_heads):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        self.slopes = torch.nn.Parameter(torch.linspace(0.1, 1.0, num_heads))

    def bias(self, q, q_positions, k_positions, scale):
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().to(q.dtype)[:, None]
        return -self.slopes.to(q.dtype)[:, None, None] * dist


def test_any_learned_bias_encoding_routes_to_the_blocked_path_with_its_gradient(monkeypatch):
    base.register("test-blocked-bias-toy")(ToyLearnedSlopes)
    try:
        enc = poskit.build_encoding("test-blocked-bias-toy", head_dim=8, num_heads=4).double()
    finally:
        base.unregister("test-blocked-bias-toy")
    monkeypatch.setattr(blocked, "DEFAULT_BLOCK", 4)  # several query blocks
    q = torch.randn(2, 4, 11, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 11, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert route(enc, q, k, enable_gqa=True) == "blocked-bias"
    assert_same(attend(q, k, v, enc), attend(q, k, v, enc, backend="reference"),
                [q, k, v, enc.slopes], seed=1)


@pytest.mark.parametrize("name", ["relative", "relative-capped"])
@pytest.mark.parametrize("kernel", [False, True], ids=["blocked", "cpu-kernel"])
def test_no_tensor_of_size_t_by_t_forward_and_backward(name, kernel, monkeypatch):
    B, H, T, D = 1, 2, 512, 8
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, max_distance=T if name == "relative" else 64)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    path = set_kernel(monkeypatch, kernel) or "blocked-bias"
    assert route(enc, q, k) == path
    with _LargestOutput() as mode:
        attend(q, k, v, enc).sum().backward()
    assert enc.embeddings.grad is not None and enc.embeddings.grad.abs().sum() > 0
    # per block of queries: the logits (block x keys per head) and q . e for the offsets that occur in the block
    # (at most keys + block - 1 of them): never the (T, T) logits
    block = blocked.DEFAULT_BLOCK
    assert mode.largest <= B * H * block * (T + block) < B * H * T * T, mode.largest


def test_frozen_relative_embeddings_on_cpu_equal_the_reference(monkeypatch):
    # frozen embeddings do not make relative's bias static: it reads q (declared: bias_reads_q), so it takes the
    # blocked-bias path, where each query block gets its own queries' bias (the constant-bias path once gave
    # every block the first block's)
    monkeypatch.setattr(blocked, "DEFAULT_BLOCK", 4)
    enc = poskit.build_encoding("relative", head_dim=8, num_heads=2, max_distance=20, init_std=1.0).double()
    enc.requires_grad_(False)
    q, k, v = (torch.randn(2, 2, 12, 8, dtype=torch.float64) for _ in range(3))
    assert route(enc, q, k) == "blocked-bias"
    torch.testing.assert_close(attend(q, k, v, enc), attend(q, k, v, enc, backend="reference"),
                               atol=1e-12, rtol=0)


def test_a_bias_that_reads_q_is_never_reused_from_the_static_bias_cache():
    # a general float attn_mask sends a bias encoding through SDPA with the bias merged (on CUDA every bias goes
    # there); the per-shape bias cache is for biases of positions alone, so a frozen relative bias computed for
    # one q must not be handed to the next call with other queries at the same positions
    enc = poskit.build_encoding("relative", head_dim=8, num_heads=2, max_distance=20, init_std=1.0).double()
    enc.requires_grad_(False)
    assert enc.bias_reads_q and not poskit.build_encoding("alibi", head_dim=8, num_heads=2).bias_reads_q
    mask = torch.randn(1, 1, 12, 12, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 12, 8, dtype=torch.float64) for _ in range(2))
    for seed in (0, 1):
        q = torch.randn(2, 2, 12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        got = poskit.attention(q, k, v, enc, attn_mask=mask, is_causal=True)
        want = poskit.attention(q, k, v, enc, attn_mask=mask, is_causal=True, backend="reference")
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
