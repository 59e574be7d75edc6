"""The opt-in compiled CPU kernel (attention/cpu_flash.py + .cpp) against the float64 formula, forward and backward,
and its switch: off by default, a clear error for a bad switch value, the usual path when it cannot be built.

Tests that compile the kernel are marked slow and skip (with the reason) where no compiler or ninja exists."""
import math
import shutil
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.attention import cpu_flash
from poskit.attention.engine import route
from poskit.attention.sdpa import BLOCKED_MAX_KEYS


def reference(q, k, v, scale, q_positions, k_positions, causal):
    """softmax(scale q k^T masked by position) v in float64, written out; rows that see no key are zeros."""
    q, k, v = q.double(), k.double(), v.double()
    logits = scale * torch.einsum("bhte,bhse->bhts", q, k)
    visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
    if causal:
        visible = k_positions[0][None, :] <= q_positions[0][:, None]
    logits = logits.masked_fill(~visible, float("-inf"))
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    weights = torch.where(visible.any(-1, keepdim=True), weights, 0.0)
    return weights @ v


# --- the switch (no compiler needed) --------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", False), ("", False), ("off", False)])
def test_switch_values(monkeypatch, value, expected):
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, value)
    assert cpu_flash.enabled() is expected


def test_switch_unset_is_off(monkeypatch):
    monkeypatch.delenv(cpu_flash.ENV_SWITCH, raising=False)
    assert cpu_flash.enabled() is False


def test_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match="POSKIT_CPU_KERNEL.*'maybe'"):
        cpu_flash.enabled()


def test_unbuildable_kernel_keeps_the_usual_path(monkeypatch):
    """No compiler (simulated: the build raises): one warning, and attention runs and agrees with the reference."""
    import torch.utils.cpp_extension as ext

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "1")
    monkeypatch.setattr(ext, "load", no_compiler)
    cpu_flash.kernel.cache_clear()
    try:
        enc = poskit.build_encoding("pope", head_dim=8, num_heads=2)
        q, k, v = (torch.randn(1, 2, 80, 8) for _ in range(3))
        with pytest.warns(RuntimeWarning, match="could not be built.*Ninja is required"):
            assert route(enc, q, k) != "cpu-flash"
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # the build failure is warned once per process, not per call
            got = poskit.attention(q, k, v, enc, is_causal=True)
        want = poskit.attention(q, k, v, enc, is_causal=True, backend="reference")
        torch.testing.assert_close(got, want)
    finally:
        cpu_flash.kernel.cache_clear()  # the next test builds for real (or finds no compiler itself)


def test_off_by_default_routes_as_before(monkeypatch):
    monkeypatch.delenv(cpu_flash.ENV_SWITCH, raising=False)
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2)
    q = torch.randn(1, 2, BLOCKED_MAX_KEYS + 1, 8)
    assert route(enc, q, q) == "sdpa"  # padded SDPA beyond the blocked path's key limit, as before
    assert route(enc, q[:, :, :BLOCKED_MAX_KEYS], q[:, :, :BLOCKED_MAX_KEYS]) == "blocked"  # and the blocked path up to it


# --- the compiled kernel ---------------------------------------------------------------------------------
def _require_kernel():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: the compiled CPU kernel cannot be built (the usual paths are tested elsewhere)")
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        pytest.skip("ninja is not installed: torch.utils.cpp_extension cannot build the compiled CPU kernel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if not cpu_flash.available():
            pytest.skip("the compiled CPU kernel did not build here (e.g. a torch without MKL); see its warning")


def _inputs(B, H, Tq, Tk, E, Dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, E, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, H, Tk, E, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, H, Tk, Dv, generator=g).to(dtype).requires_grad_()
    return q, k, v


def _check(q, k, v, scale, qp, kp, causal, block_q, block_k, seed, atol):
    got = cpu_flash.cpu_flash_attention(q, k, v, scale=scale, q_positions=qp, k_positions=kp, causal=causal,
                                        block_q=block_q, block_k=block_k)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = reference(q64, k64, v64, scale, qp, kp, causal)
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)
    w = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(got, (q, k, v), w.to(got.dtype))
    wants = torch.autograd.grad(want, (q64, k64, v64), w)
    for name, g, r in zip("qkv", grads, wants):
        torch.testing.assert_close(g.double(), r, atol=atol * max(1.0, r.abs().max().item()), rtol=0,
                                   msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 3), Tk=st.integers(1, 150), n_q=st.integers(1, 150),
       E=st.sampled_from([8, 16, 24, 40]), Dv=st.sampled_from([4, 8, 20]), causal=st.booleans(),
       block_q=st.integers(1, 70), block_k=st.integers(1, 70), offset=st.integers(-20, 20),
       scale=st.floats(0.05, 1.0), seed=st.integers(0, 2**16))
def test_fp32_equals_float64_formula(B, H, Tk, n_q, E, Dv, causal, block_q, block_k, offset, scale, seed):
    """Ragged T (not a multiple of either tile), Tq != Tk, q/k wider or narrower than v, queries placed anywhere
    relative to the keys (a negative offset leaves early queries seeing no key: zeros, zero gradients)."""
    _require_kernel()
    q, k, v = _inputs(B, H, n_q, Tk, E, Dv, torch.float32, seed)
    qp, kp = (torch.arange(n_q) + Tk - n_q + offset)[None], torch.arange(Tk)[None]
    _check(q, k, v, scale, qp, kp, causal, block_q, block_k, seed, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_bf16_close_to_float64_formula(causal):
    """bf16 in, fp32 accumulation: within a few bf16 roundings of the exact result, on a long ragged sequence
    (several tiles each way, the default tile sizes)."""
    _require_kernel()
    T = 2 * cpu_flash.BLOCK_K + 37
    q, k, v = _inputs(1, 2, T, T, 32, 16, torch.bfloat16, 0)
    pos = torch.arange(T)[None]
    _check(q, k, v, 1 / math.sqrt(16), pos, pos, causal, cpu_flash.BLOCK_Q, cpu_flash.BLOCK_K, 1, atol=4e-2)


@pytest.mark.slow
def test_engine_routes_pope_through_the_kernel(monkeypatch):
    """poskit.attention with the switch on: PoPE (qk_width 2) takes the kernel beyond the blocked path's key limit,
    grouped kv heads included, and agrees with the reference path in float64 (encoding included), values and
    gradients."""
    _require_kernel()
    dtype = torch.float32
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "1")
    T, H, Hkv, D = BLOCKED_MAX_KEYS + 5, 2, 1, 8
    enc = poskit.build_encoding("pope", head_dim=D, num_heads=H)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, H, T, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(1, Hkv, T, D, generator=g).to(dtype).requires_grad_() for _ in range(2))
    assert route(enc.to(dtype), q, k, enable_gqa=True) == "cpu-flash"
    got = poskit.attention(q, k, v, enc.to(dtype), is_causal=True, enable_gqa=True)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = poskit.attention(*leaves, enc.double(), is_causal=True, enable_gqa=True, backend="reference")
    atol = 2e-5
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)
    w = torch.randn(want.shape, dtype=torch.float64, generator=g)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), w.to(dtype)), torch.autograd.grad(want, leaves, w)):
        assert b.abs().max() > 0
        torch.testing.assert_close(a.double(), b, atol=atol * max(1.0, b.abs().max().item()), rtol=0,
                                   msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.slow
def test_engine_keeps_other_paths_for_what_the_kernel_does_not_serve(monkeypatch):
    """One query (decode), an encoding with qk_width 1, bf16, a padding mask: routed as without the switch."""
    _require_kernel()
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "1")
    pope, rope = (poskit.build_encoding(n, head_dim=8, num_heads=2) for n in ("pope", "rope"))
    long = torch.randn(1, 2, BLOCKED_MAX_KEYS + 1, 8)
    assert route(pope, long, long) == "cpu-flash"
    assert route(pope, long[:, :, :64], long[:, :, :64]) == "cpu-flash"  # training sizes too
    assert route(pope, long[:, :, :1], long) == "blocked"  # one query: the decode path
    assert route(rope, long, long) == "sdpa"
    assert route(pope.to(torch.bfloat16), long.bfloat16(), long.bfloat16()) == "sdpa"  # bf16: padded SDPA there
    q, k, v = (torch.randn(1, 2, 70, 8) for _ in range(3))
    pad = torch.ones(1, 1, 1, 70, dtype=torch.bool)
    pad[..., :3] = False
    got = poskit.attention(q, k, v, pope, is_causal=True, attn_mask=pad)  # a padding mask: the blocked path
    torch.testing.assert_close(got, poskit.attention(q, k, v, pope, is_causal=True, attn_mask=pad, backend="reference"))
    assert route(pope.to(torch.bfloat16), long.bfloat16(), long.bfloat16()) == "sdpa"  # bf16: padded SDPA there
