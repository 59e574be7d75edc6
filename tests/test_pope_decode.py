"""PoPE decoding against the magnitude KV cache: the fused CPU kernel, its fallbacks and the Triton path
all equal the float64 reference."""
import itertools
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import poskit
from poskit.attention import KVCache, cached_attention, pope_decode
from conftest import build, make_qkv
from extras import need


def _decode(enc, q, k, v, positions, prefill, backend="auto", cache=None):
    """Prefill `prefill` tokens, then one token at a time; returns the concatenated outputs."""
    cache = cache or KVCache(num_layers=1)
    outs = [cached_attention(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill], enc, cache, 0,
                             positions[..., :prefill], backend=backend)]
    for t in range(prefill, q.shape[2]):
        outs.append(cached_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0,
                                     positions[..., t:t + 1], backend=backend))
    return torch.cat(outs, 2)


def _reference(enc, q, k, v, positions):
    enc64 = build("pope", head_dim=enc.head_dim, num_heads=enc.num_heads)
    enc64.load_state_dict(enc.state_dict())
    return poskit.attention(q.double(), k.double(), v.double(), enc64, backend="reference",
                            q_positions=positions, k_positions=positions, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("per_batch", [False, True])
def test_fused_cpu_decode_equals_reference_and_is_used(per_batch):
    enc = build("pope", num_heads=8, dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=8, Hkv=2, Tq=21, Tk=21, dtype=torch.float32)
    positions = torch.arange(10**6, 10**6 + 21)
    if per_batch:  # each sequence at its own offset
        positions = torch.stack((positions, positions + 1234))
    before = pope_decode._compiled.cache_info().hits + pope_decode._compiled.cache_info().misses
    with torch.no_grad():
        out = _decode(enc, q, k, v, positions, prefill=5)
    calls = pope_decode._compiled.cache_info().hits + pope_decode._compiled.cache_info().misses
    assert calls - before == 16  # every single-token step took the fused kernel, the prefill did not
    torch.testing.assert_close(out.double(), _reference(enc, q, k, v, positions), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(softplus=False), dict(phase_bias=False)])
def test_fused_cpu_decode_of_the_ablations(options):
    enc = build("pope", dtype=torch.float32, **options)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=9, Tk=9, dtype=torch.float32)
    positions = torch.arange(9)
    enc64 = build("pope", **options)
    enc64.load_state_dict(enc.state_dict())
    ref = poskit.attention(q.double(), k.double(), v.double(), enc64, backend="reference", is_causal=True, enable_gqa=True)
    with torch.no_grad():
        out = _decode(enc, q, k, v, positions, prefill=3)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)


def test_fused_cpu_decode_in_bfloat16_stays_close():
    enc = build("pope", dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=4, Tq=12, Tk=12, dtype=torch.float32)
    positions = torch.arange(12)
    ref = _reference(enc, q, k, v, positions)
    with torch.no_grad():
        out = _decode(enc.to(torch.bfloat16), *(t.bfloat16() for t in (q, k, v)), positions, prefill=4)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_many_models_in_one_process_keep_the_fused_kernel(monkeypatch):
    # a process that decodes at batch 1 and 2 with three head layouts, both softplus settings (12 variants for
    # torch.compile's size and guard specialisations): each must stay on the fused kernel, not exhaust the
    # recompile limit and fall back for good
    monkeypatch.setattr(pope_decode, "_fused_failed", False)
    positions = torch.arange(6)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for dtype, B, (H, Hkv), per_batch, softplus in itertools.product(
                (torch.float32,), (1, 2), ((1, 1), (2, 1), (4, 2)), (False,), (True, False)):
            head_dim = 8 + 4 * H  # a scale of its own per head layout
            enc = build("pope", head_dim=head_dim, num_heads=H, dtype=torch.float32, softplus=softplus)
            q, k, v = make_qkv(B=B, H=H, Hkv=Hkv, Tq=6, Tk=6, D=head_dim, dtype=torch.float32)
            pos = torch.stack([positions + 7 * b for b in range(B)]) if per_batch else positions
            out = _decode(enc.to(dtype), *(t.to(dtype) for t in (q, k, v)), pos, prefill=4)
            if dtype == torch.float32:
                enc64 = build("pope", head_dim=head_dim, num_heads=H, softplus=softplus)
                enc64.load_state_dict(enc.state_dict())
                ref = poskit.attention(q.double(), k.double(), v.double(), enc64, backend="reference",
                                       is_causal=True, enable_gqa=True, q_positions=pos, k_positions=pos)
                torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    assert not [str(w.message) for w in caught if "could not be compiled" in str(w.message)]
    assert pope_decode.fused_decode_enabled()


def test_without_the_compiled_kernel_the_fallback_is_exact(monkeypatch):
    enc = build("pope", dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=9, Tk=9, dtype=torch.float32)
    positions = torch.arange(9)
    ref = _reference(enc, q, k, v, positions)

    monkeypatch.setenv("POSKIT_FUSED_DECODE", "0")
    with torch.no_grad():
        torch.testing.assert_close(_decode(enc, q, k, v, positions, 3).double(), ref, atol=2e-6, rtol=1e-5)
    monkeypatch.delenv("POSKIT_FUSED_DECODE")

    def broken():
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(pope_decode, "_compiled", lambda: (broken, broken, broken, broken))
    monkeypatch.setattr(pope_decode, "_fused_failed", False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _decode(enc, q, k, v, positions, 3)
    assert any("could not be compiled" in str(w.message) for w in caught)
    assert not pope_decode.fused_decode_enabled()  # not retried in this process
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("compiled", [True, False])
def test_half_precision_values_with_room_to_grow_equal_the_reference(monkeypatch, dtype, compiled):
    # a KV cache with room keeps its values as a view with gaps between heads: one query row per kv head takes
    # the compiled weighted sum over them, more rows (grouped heads) and a machine that cannot compile one
    # product per head; each equals the float64 formula within the dtype's roundings
    monkeypatch.setattr(pope_decode, "_fused_failed", False)
    calls = []
    run = pope_decode._run_weighted_values
    monkeypatch.setattr(pope_decode, "_run_weighted_values", lambda *a: calls.append(1) or run(*a))
    if not compiled:
        monkeypatch.setenv("POSKIT_FUSED_DECODE", "0")
    enc = build("pope", num_heads=4, dtype=torch.float32)
    positions = torch.arange(40)
    for kv_heads in (4, 2):
        calls.clear()
        q, k, v = make_qkv(B=2, H=4, Hkv=kv_heads, Tq=40, Tk=40, dtype=torch.float32)
        cache = KVCache(num_layers=1, max_length=64)
        with torch.no_grad():
            out = _decode(enc.to(dtype), *(t.to(dtype) for t in (q, k, v)), positions, prefill=30, cache=cache)
        assert not cache.layer(0).values.is_contiguous()
        torch.testing.assert_close(out.double(), _reference(enc, q, k, v, positions), atol=2e-2, rtol=2e-2)
        assert len(calls) == (10 if compiled and kv_heads == 4 else 0)


@settings(max_examples=12, deadline=None)
@given(keys=st.integers(1, 3 * pope_decode.VALUE_CHUNK + 5), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_the_compiled_weighted_sum_over_values_equals_the_product_at_any_length(keys, dtype):
    """The weighted sum over a cache's values, in whole chunks of keys and the rest apart: lengths below, at and
    past the chunk's multiples, values as a view with room after them, against the float64 product."""
    g = torch.Generator().manual_seed(keys)
    buffer = torch.randn(2, 3, keys + 7, 16, generator=g).to(dtype)
    v = buffer[:, :, :keys]
    weights = torch.softmax(torch.randn(2, 3, 1, keys, generator=g), -1)
    # through the guard a decode step uses: each drawn length and dtype may be one more compiled variant, past
    # torch.compile's default limit in a long session
    got = pope_decode._run_guarded(pope_decode._run_weighted_values, weights, v)
    assert got is not None
    torch.testing.assert_close(got.double(), weights.double() @ v.double(), atol=1e-6, rtol=1e-5)


def test_cache_holds_magnitudes_and_angles_of_each_position():
    enc = build("pope")
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=5, Tk=5)
    cache = KVCache(num_layers=1)
    positions = torch.tensor([3, 9, 27, 81, 243])
    cached_attention(q, k, v, enc, cache, 0, positions)
    layer = cache.layer(0)
    torch.testing.assert_close(layer.keys, torch.nn.functional.softplus(k))
    angles = positions[:, None].double() * enc.inv_freq  # theta_c = base^(-c/d), computed here in float64
    torch.testing.assert_close(layer.angles[0], torch.cat((angles.cos(), angles.sin()), -1))


def test_a_triton_decode_step_looks_up_the_new_tokens_angles_only(monkeypatch):
    # the cache keeps its keys' angles; a step computing them again over every cached position did O(cache)
    # trigonometry per step (float64, on a GPU) for numbers it already had
    need("triton", "triton", "triton (the fused PoPE kernel)")
    from conftest import HAS_CUDA

    device = "cuda" if HAS_CUDA else "cpu"  # CPU tensors run in the Triton interpreter
    enc = build("pope", num_heads=4, dtype=torch.float32).to(device)
    q, k, v = (t.to(device) for t in make_qkv(B=1, H=4, Hkv=4, Tq=40, Tk=40, dtype=torch.float32))
    positions = torch.arange(40, device=device)
    cache = KVCache(num_layers=1)
    with torch.no_grad():
        cached_attention(q[:, :, :39], k[:, :, :39], v[:, :, :39], enc, cache, 0, positions[:39], backend="triton")
        looked_up = []
        original = type(enc).cos_sin
        def counted(self, p, *args):
            looked_up.append(p.numel())
            return original(self, p, *args)
        monkeypatch.setattr(type(enc), "cos_sin", counted)
        out = cached_attention(q[:, :, 39:], k[:, :, 39:], v[:, :, 39:], enc, cache, 0, positions[39:],
                               backend="triton")
    assert looked_up == [1]
    torch.testing.assert_close(out.double().cpu(), _reference(enc.cpu(), q.cpu(), k.cpu(), v.cpu(),
                                                              positions.cpu())[:, :, 39:], atol=1e-5, rtol=1e-4)


def test_triton_decode_reads_the_magnitude_cache():
    need("triton", "triton", "triton (the fused PoPE kernel)")
    from conftest import HAS_CUDA

    device = "cuda" if HAS_CUDA else "cpu"  # CPU tensors run in the Triton interpreter
    enc = build("pope", num_heads=4, dtype=torch.float32).to(device)
    q, k, v = (t.to(device) for t in make_qkv(B=2, H=4, Hkv=2, Tq=7, Tk=7, dtype=torch.float32))
    positions = torch.arange(7, device=device)
    with torch.no_grad():
        out = _decode(enc, q, k, v, positions, prefill=3, backend="triton")
    torch.testing.assert_close(out.double().cpu(), _reference(enc.cpu(), q.cpu(), k.cpu(), v.cpu(), positions.cpu()),
                               atol=1e-5, rtol=1e-4)
