"""Every fast path equals the reference (forward and backward), whatever the masks, offsets and head groups."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.attention.engine import choose_backend
from conftest import build, make_qkv

ALL = poskit.available_encodings()


def _grads(out, inputs, seed=0):
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out, inputs, g, allow_unused=True)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=10, deadline=None)
@given(
    T=st.integers(1, 80),
    n_new=st.integers(1, 80),
    causal=st.booleans(),
    groups=st.sampled_from([1, 2, 4]),
    padding=st.booleans(),
    offset=st.integers(0, 1000),
    seed=st.integers(0, 2**16),
)
def test_auto_backend_equals_reference(name, T, n_new, causal, groups, padding, offset, seed):
    n_new = min(n_new, T)
    enc = build(name, **({"max_distance": 2000} if name == "relative" else {}), **({"max_positions": 2000} if name == "learned" else {}))
    q, k, v = make_qkv(B=2, H=4, Hkv=4 // groups, Tq=n_new, Tk=T, requires_grad=True, gen_seed=seed)
    kw = dict(causal=causal, q_positions=torch.arange(T - n_new, T) + offset, k_positions=torch.arange(T) + offset)
    if padding:
        kw["key_padding_mask"] = torch.rand(2, T, generator=torch.Generator().manual_seed(seed)) > 0.3
    if getattr(enc, "gates", None) == "separate":
        kw["gate_keys"] = k.flip(-1)
    params = [p for p in enc.parameters() if p.requires_grad]
    fast = poskit.attention(q, k, v, enc, **kw)
    ref = poskit.attention(q, k, v, enc, backend="reference", **kw)
    assert torch.allclose(fast, ref, atol=1e-10), (fast - ref).abs().max()
    for a, b in zip(_grads(fast, [q, k, v, *params], seed), _grads(ref, [q, k, v, *params], seed)):
        if a is None or b is None:
            assert a is None and b is None or (a if a is not None else b).abs().max() == 0
            continue
        assert torch.allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("name", ["rope", "pope", "alibi", "none", "relative"])
def test_fp32_fast_path_matches_float64_reference(name):
    enc = build(name, dtype=torch.float32, head_dim=32, num_heads=4, **({"max_distance": 256} if name == "relative" else {}))
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=150, Tk=150, D=32, dtype=torch.float32)
    out = poskit.attention(q, k, v, enc)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference")
    assert torch.allclose(out.double(), ref, atol=2e-5)


def test_rows_without_visible_keys_output_zero_on_every_path():
    for name in ("rope", "pope", "alibi", "relative"):
        enc = build(name)
        q, k, v = make_qkv(Tq=3, Tk=3)
        kw = dict(q_positions=torch.tensor([0, 1, 2]), k_positions=torch.tensor([1, 2, 3]))
        out = poskit.attention(q, k, v, enc, **kw)
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        assert torch.allclose(out, poskit.attention(q, k, v, enc, backend="reference", **kw))


def test_auto_never_picks_triton_on_cpu():
    q = torch.randn(1, 4, 2, 16)
    assert choose_backend(build("pope"), q, "auto") == "sdpa"
    assert choose_backend(build("cope"), q, "auto") == "reference"
    assert choose_backend(build("rope"), q, "auto") == "sdpa"


@pytest.mark.parametrize("name", ["pope", "cope", "cope-alibi"])
def test_triton_backend_through_engine_matches_reference(name):
    pytest.importorskip("triton")
    from poskit.attention import triton_pope

    if name == "pope" and hasattr(triton_pope, "kernels_interpreted") and not triton_pope.kernels_interpreted():
        pytest.skip("triton kernels were imported without TRITON_INTERPRET=1 and no GPU is present")
    enc = build(name, dtype=torch.float32)
    q, k, v = make_qkv(B=1, H=4, Hkv=2, Tq=40, Tk=40, dtype=torch.float32, requires_grad=True)
    out = poskit.attention(q, k, v, enc, backend="triton")
    ref = poskit.attention(q, k, v, enc, backend="reference")
    assert torch.allclose(out, ref, atol=2e-4)
    for a, b in zip(_grads(out, [q, k, v]), _grads(ref, [q, k, v])):
        assert torch.allclose(a, b, atol=5e-4)


@pytest.mark.parametrize("name", ["pope", "alibi"])
def test_bf16_blocked_path_close_to_float64(name):
    enc = build(name, dtype=torch.bfloat16, head_dim=32, num_heads=4)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=100, Tk=100, D=32, dtype=torch.float32, requires_grad=True)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_(True) for t in (q, k, v))
    out = poskit.attention(qb, kb, vb, enc)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference")
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() < 3e-2
    out.float().sum().backward()
    ref.sum().backward()
    assert (qb.grad.double() - q.grad).abs().max() < 5e-2 * q.grad.abs().max()
