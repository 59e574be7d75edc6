"""PoPE decoding against the magnitude KV cache: the compiled CPU kernel's fused decode (cpu_flash.cpp), the
torch.compile'd loops that serve where it does not (fp16, POSKIT_CPU_KERNEL=0, no C++ compiler), their fallbacks
and the Triton path all equal the float64 reference."""
import contextlib
import itertools
import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import poskit
from poskit.attention import KVCache, cached_attention, pope_decode
from poskit.attention import cpu_flash
from conftest import build, make_qkv
from cpu_kernel_helpers import kernel_off, require_kernel
from extras import need


@pytest.fixture
def compiled_loops(monkeypatch):
    """The torch.compile'd loops, which serve a decode step where the compiled CPU kernel does not."""
    kernel_off(monkeypatch)


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
def test_fused_cpu_decode_equals_reference_and_is_used(compiled_loops, per_batch):
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
def test_fused_cpu_decode_of_the_ablations(compiled_loops, options):
    enc = build("pope", dtype=torch.float32, **options)
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=9, Tk=9, dtype=torch.float32)
    positions = torch.arange(9)
    enc64 = build("pope", **options)
    enc64.load_state_dict(enc.state_dict())
    ref = poskit.attention(q.double(), k.double(), v.double(), enc64, backend="reference", is_causal=True, enable_gqa=True)
    with torch.no_grad():
        out = _decode(enc, q, k, v, positions, prefill=3)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)


def test_fused_cpu_decode_in_bfloat16_stays_close(compiled_loops):
    enc = build("pope", dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=4, Tq=12, Tk=12, dtype=torch.float32)
    positions = torch.arange(12)
    ref = _reference(enc, q, k, v, positions)
    with torch.no_grad():
        out = _decode(enc.to(torch.bfloat16), *(t.bfloat16() for t in (q, k, v)), positions, prefill=4)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_many_models_in_one_process_keep_the_fused_kernel(compiled_loops, monkeypatch):
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


def test_without_the_compiled_kernel_the_fallback_is_exact(compiled_loops, monkeypatch):
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
def test_half_precision_values_with_room_to_grow_equal_the_reference(compiled_loops, monkeypatch, dtype, compiled):
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


# --- the compiled CPU kernel's fused decode (cpu_flash.magnitude_decode) ---------------------------------------
def _magnitude_formula(rows, mu, v, angles, pad, q_positions=None, k_positions=None):
    """softmax_s(sum_c mu[s, c] (a[r, c] cos_c(s) + b[r, c] sin_c(s))) @ v in float64, written out: [a | b] = rows
    (B, Hkv, R, 2d), angles (1|B, L, 2d) = [cos | sin]; padded keys hidden, and with positions (1|B, Tq), (1|B, L)
    keys later than row r's query (step r % Tq); a row with none visible zero."""
    d = mu.shape[-1]
    a, b = rows.double()[..., :d], rows.double()[..., d:]
    cos, sin = angles.double()[:, None, :, :d], angles.double()[:, None, :, d:]  # (1|B, 1, L, d)
    logits = torch.einsum("bhsc,bhrc->bhrs", mu.double() * cos, a) + torch.einsum("bhsc,bhrc->bhrs",
                                                                                   mu.double() * sin, b)
    return _visible_softmax_times_v(logits, v, pad, q_positions, k_positions)


def _visible_softmax_times_v(logits, v, pad, q_positions, k_positions):
    """softmax over the keys each row sees (padded keys and, with positions, keys later than row r's query, step
    r % Tq, hidden) times v, in float64; a row with none visible zero."""
    if pad is not None:
        logits = logits.masked_fill(~pad[:, None, None, :], float("-inf"))
    if q_positions is not None:
        steps = q_positions.shape[-1]
        for r in range(logits.shape[2]):
            later = k_positions > q_positions[:, r % steps, None]  # (1|B, L)
            logits[:, :, r] = logits[:, :, r].masked_fill(later[:, None, :], float("-inf"))
    weights = torch.softmax(logits, -1).nan_to_num(0.0)  # no visible key: softmax of -inf is NaN, the kernel 0
    return weights @ v.double()


def _bf16_products_formula(rows, mu, v, angles, pad, q_positions=None, k_positions=None):
    """_magnitude_formula with the query rows and the Cartesian keys [mu cos | mu sin] rounded to bf16 first, as
    the products form multiplies them."""
    d = mu.shape[-1]
    cos, sin = angles.float()[:, None, :, :d], angles.float()[:, None, :, d:]
    keys = torch.cat((mu.float() * cos, mu.float() * sin), -1).bfloat16().double()  # (B, Hkv, L, 2d)
    logits = torch.einsum("bhsc,bhrc->bhrs", keys, rows.bfloat16().double())
    return _visible_softmax_times_v(logits, v, pad, q_positions, k_positions)


@pytest.fixture(scope="module")
def kernel():
    require_kernel()


@contextlib.contextmanager
def _threads(count):
    """torch's thread count set to `count` inside the block (the kernel splits keys among threads), restored after."""
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), kv_heads=st.integers(1, 3), rows=st.integers(1, 5),
       keys=st.sampled_from([1, 2, 17, 511, 512, 513, 1100]), d=st.sampled_from([4, 16, 20, 64, 144]),
       dv=st.sampled_from([3, 16, 64, 136]), per_sequence=st.booleans(), padded=st.booleans(),
       room=st.integers(0, 3), dtype=st.sampled_from([torch.float32, torch.bfloat16]), threads=st.sampled_from([1, 2]),
       steps=st.sampled_from([None, 1, 2, 3]), tiled=st.booleans(), seed=st.integers(0, 2**16))
def test_kernel_decode_equals_the_float64_formula(kernel, B, kv_heads, rows, keys, d, dv, per_sequence, padded, room,
                                                   dtype, threads, steps, tiled, seed):
    # across key blocks (512) and thread splits (fewer (batch, kv head) pairs than threads), chunked rows of any
    # width (d, Dv up to 128 in registers, wider through the portable loops), a cache with room to grow (heads
    # apart), per-sequence angle tables, padding (row 0 sees no key at all when padded), and with `steps` new
    # tokens per query head, a mask causal by position (any positions: some rows see few keys or none); `tiled`:
    # enough rows for the products form (the block's Cartesian keys times the rows)
    g = torch.Generator().manual_seed(seed)
    if tiled:
        rows += cpu_flash.kernel().decode_tiled_rows()
    q_positions = k_positions = None
    if steps is not None:
        rows = steps * (1 + rows % 3 + (cpu_flash.kernel().decode_tiled_rows() // steps if tiled else 0))
        k_positions = torch.randint(0, keys + 3, (B if per_sequence else 1, keys), generator=g)
        q_positions = torch.randint(0, keys + 3, (k_positions.shape[0], steps), generator=g)
    q_rows = torch.randn(B, kv_heads, rows, 2 * d, generator=g) / d**0.5
    mu = torch.nn.functional.softplus(torch.randn(B, kv_heads, keys + room, d, generator=g)).to(dtype)[:, :, :keys]
    v = torch.randn(B, kv_heads, keys + room, dv, generator=g).to(dtype)[:, :, :keys]
    angles = torch.rand(B if per_sequence else 1, keys, 2 * d, generator=g) * 2 - 1
    pad = None
    if padded:
        pad = torch.rand(B, keys, generator=g) > 0.3
        pad[0] = False
    with _threads(threads):
        out = cpu_flash.magnitude_decode(q_rows, mu, v, angles, pad, q_positions, k_positions, bf16_products=False)
    assert out.dtype == torch.float32 and out.shape == (B, kv_heads, rows, dv)
    want = _magnitude_formula(q_rows, mu, v, angles, pad, q_positions, k_positions)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    if padded:
        assert not out[0].any()
    if tiled and dtype == torch.bfloat16 and cpu_flash.bf16_products_available():
        # the products form in bf16: the query rows, the block's Cartesian keys and the weights rounded to bf16
        # once each before their products (fp32 sums), so within a few bf16 roundings of the formula on the query
        # and keys so rounded
        with _threads(threads):
            got = cpu_flash.magnitude_decode(q_rows, mu, v, angles, pad, q_positions, k_positions, bf16_products=True)
        want = _bf16_products_formula(q_rows, mu, v, angles, pad, q_positions, k_positions)
        scale = 1 + v.double().abs().max().item()
        torch.testing.assert_close(got.double(), want, atol=2 ** -7 * scale, rtol=2 ** -7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ["fused", "tiled"])
def test_a_hidden_key_s_value_reaches_no_row_even_when_it_is_not_finite(kernel, dtype, rows):
    # a padded key, and a new token later than some rows' queries, hold NaN values: the rows that cannot see them
    # stay finite (a zero weight times NaN would not), the rows that see the token get NaN; for the fused loops and
    # for the products form alike
    steps = 4
    R = steps * (1 if rows == "fused" else -(-cpu_flash.kernel().decode_tiled_rows() // steps))
    g = torch.Generator().manual_seed(0)
    L = 600  # two key blocks: the NaNs in the second
    q_rows = torch.randn(2, 1, R, 16, generator=g) / 4
    mu = torch.rand(2, 1, L, 8, generator=g).to(dtype)
    v = torch.randn(2, 1, L, 8, generator=g).to(dtype)
    angles = torch.rand(1, L, 16, generator=g)
    pad = torch.ones(2, L, dtype=torch.bool)
    pad[0, 550] = False
    v[0, 0, 550] = float("nan")  # padded: hidden from every row
    v[1, 0, L - 1] = float("nan")  # the last new token: seen by the last step's rows only
    k_positions = torch.arange(L)[None]
    q_positions = torch.arange(L - steps, L)[None]
    last_step = torch.arange(R) % steps == steps - 1
    products = [False] + ([True] if dtype == torch.bfloat16 and cpu_flash.bf16_products_available() else [])
    for bf16_products in products:  # the products form multiplying in fp32, and in bf16 where it can
        out = cpu_flash.magnitude_decode(q_rows, mu, v, angles, pad, q_positions, k_positions, bf16_products)
        assert out[0].isfinite().all()
        assert out[1, 0, last_step].isnan().all() and out[1, 0, ~last_step].isfinite().all()
    out = cpu_flash.magnitude_decode(q_rows, mu, v, angles, pad, q_positions, k_positions, bf16_products=False)
    torch.testing.assert_close(out[0].double(), _magnitude_formula(q_rows[:1], mu[:1], v[:1].nan_to_num(0.0), angles,
                                                                   pad[:1], q_positions, k_positions)[0],
                               atol=2e-5, rtol=1e-4)


def test_the_products_form_multiplies_in_bf16_when_asked(kernel):
    # a bf16 cache with enough rows: bf16_products=True rounds the operands (the result moves, within a few bf16
    # roundings), False keeps fp32 products (within fp32 rounding of the formula); True is refused for fp32 caches
    if not cpu_flash.bf16_products_available():
        pytest.skip("bf16 products need a CPU with AVX512_BF16 and an AVX-512 build of the kernel")
    g = torch.Generator().manual_seed(1)
    R = 2 * cpu_flash.kernel().decode_tiled_rows()
    q_rows = torch.randn(2, 2, R, 64, generator=g) / 4
    mu = torch.rand(2, 2, 700, 32, generator=g).bfloat16()
    v = torch.randn(2, 2, 700, 16, generator=g).bfloat16()
    angles = torch.rand(1, 700, 64, generator=g) * 2 - 1
    exact = cpu_flash.magnitude_decode(q_rows, mu, v, angles, bf16_products=False)
    rounded = cpu_flash.magnitude_decode(q_rows, mu, v, angles, bf16_products=True)
    torch.testing.assert_close(exact.double(), _magnitude_formula(q_rows, mu, v, angles, None), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(rounded.double(), _bf16_products_formula(q_rows, mu, v, angles, None),
                               atol=2 ** -7, rtol=2 ** -7)
    assert (rounded - exact).abs().max() > 1e-5
    with pytest.raises(ValueError, match="bf16_products=True needs bf16 inputs"):
        cpu_flash.magnitude_decode(q_rows, mu.float(), v.float(), angles, bf16_products=True)


def test_kernel_decode_propagates_a_nan_key(kernel):
    q_rows = torch.randn(2, 2, 1, 32)
    mu, v = torch.rand(2, 2, 700, 16), torch.randn(2, 2, 700, 8)
    mu[1, 0, 600, 3] = float("nan")
    for threads in (1, 2):
        with _threads(threads):
            out = cpu_flash.magnitude_decode(q_rows[:1, :1], mu[:1, :1], v[:1, :1], torch.rand(1, 700, 32), None)
            assert out.isfinite().all()
            out = cpu_flash.magnitude_decode(q_rows, mu, v, torch.rand(1, 700, 32), None)
        assert out[1, 0].isnan().all() and out[0].isfinite().all() and out[1, 1].isfinite().all()


@pytest.mark.parametrize("bad, why", [
    (dict(q_rows=torch.randn(1, 2, 1, 15)), "query as a contiguous fp32 (B, Hkv, R, 2d)"),
    (dict(mu=torch.rand(1, 2, 16, 8).transpose(2, 3)), "magnitudes as fp32 or bf16"),
    (dict(v=torch.randn(1, 2, 8, 4).bfloat16()), "values as (B, Hkv, L, Dv) of the magnitudes' dtype"),
    (dict(angles=torch.rand(1, 9, 16)), "angle tables as a contiguous fp32 (1 or B, L, 2d)"),
    (dict(pad=torch.ones(1, 8, dtype=torch.int64)), "key padding mask as a contiguous bool (B, L)")])
def test_kernel_decode_names_what_it_refuses(kernel, bad, why):
    args = dict(q_rows=torch.randn(1, 2, 1, 16), mu=torch.rand(1, 2, 8, 8), v=torch.randn(1, 2, 8, 4),
                angles=torch.rand(1, 8, 16), pad=None)
    args.update(bad)
    with pytest.raises(RuntimeError, match=re.escape(why)):
        cpu_flash.magnitude_decode(args["q_rows"], args["mu"], args["v"], args["angles"], args["pad"])


@pytest.mark.parametrize("new_tokens", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_takes_the_kernel_and_equals_the_reference(kernel, monkeypatch, dtype, new_tokens):
    # grouped kv heads, sequences at their own offsets with left padding, a cache with room to grow: every step
    # of one new token, or of three (causal among them, by position), goes through the kernel and equals the
    # float64 reference; the prefill (nothing cached before it, fewer tokens than KERNEL_MAX_NEW_TOKENS) takes the
    # full-sequence path, as training does; with POSKIT_CPU_KERNEL=0 no step takes the kernel
    monkeypatch.setattr(pope_decode, "KERNEL_MAX_NEW_TOKENS", 8)
    enc = build("pope", num_heads=4, dtype=torch.float32, delta_init="uniform")
    B, H, Hkv, T = 2, 4, 2, 13
    q, k, v = make_qkv(B=B, H=H, Hkv=Hkv, Tq=T, Tk=T, dtype=torch.float32)
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, :3] = False
    positions = (torch.arange(T) - torch.tensor([[3], [0]])).clamp(min=0) + torch.tensor([[0], [500]])
    enc64 = build("pope", num_heads=4, delta_init="uniform")
    enc64.load_state_dict(enc.state_dict())
    ref = poskit.attention(q.double(), k.double(), v.double(), enc64, backend="reference", q_positions=positions,
                           k_positions=positions, is_causal=True, enable_gqa=True, attn_mask=real[:, None, None, :])
    calls = []
    original = cpu_flash.magnitude_decode
    monkeypatch.setattr(cpu_flash, "magnitude_decode", lambda *a: calls.append(1) or original(*a))
    for switch, want_calls in (("1", len(range(5, T, new_tokens))), ("0", 0)):
        monkeypatch.setenv(cpu_flash.ENV_SWITCH, switch)
        calls.clear()
        cache = KVCache(num_layers=1, max_length=32)
        qs, ks, vs = (t.to(dtype) for t in (q, k, v))
        with torch.no_grad():
            outs = [cached_attention(qs[:, :, :5], ks[:, :, :5], vs[:, :, :5], enc.to(dtype), cache, 0,
                                     positions[:, :5], attention_mask=real[:, :5])]
            for t in range(5, T, new_tokens):
                new = slice(t, t + new_tokens)
                outs.append(cached_attention(qs[:, :, new], ks[:, :, new], vs[:, :, new], enc.to(dtype), cache, 0,
                                             positions[:, new], attention_mask=real[:, new]))
        out = torch.cat(outs, 2)
        assert len(calls) == want_calls and out.dtype == dtype
        tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(out.double()[:, :, 5:], ref[:, :, 5:], **tol)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_decode_splits_the_keys_of_one_head_among_threads(kernel, threads, dtype):
    # one (batch, kv head) pair and more threads: each takes a run of the keys with its own softmax state, and the
    # states are merged (each split's sums rescaled to the largest running max of the row)
    g = torch.Generator().manual_seed(threads)
    q_rows = torch.randn(1, 1, 3, 64, generator=g)
    mu = torch.nn.functional.softplus(torch.randn(1, 1, 1500, 32, generator=g)).to(dtype)
    v = torch.randn(1, 1, 1500, 16, generator=g).to(dtype)
    angles = torch.rand(1, 1500, 64, generator=g) * 2 - 1
    mu[..., 1400:, :] += 2  # the last split's logits are the largest: the others' weights are rescaled in the merge
    with _threads(threads):
        out = cpu_flash.magnitude_decode(q_rows, mu, v, angles, None)
    torch.testing.assert_close(out.double(), _magnitude_formula(q_rows, mu, v, angles, None), atol=2e-5, rtol=1e-4)


def test_kernel_decode_takes_both_positions_or_neither(kernel):
    args = (torch.randn(1, 2, 1, 16), torch.rand(1, 2, 8, 8), torch.randn(1, 2, 8, 4), torch.rand(1, 8, 16))
    with pytest.raises(ValueError, match="both q_positions and k_positions"):
        cpu_flash.magnitude_decode(*args, None, torch.tensor([[8]]), None)


def test_the_rows_from_which_the_decode_multiplies_tiles_follow_the_machine_s_calibration(kernel, tmp_path,
                                                                                          monkeypatch):
    # the calibration's threshold per dtype decides the form (seen in the rounding: products and loops sum in other
    # orders); without one, the library's default; an explicit tiled_rows overrides both
    from poskit.attention import kernel_build
    from poskit.attention import kernel_calibration as kc

    library = tmp_path / kernel_build.LIBRARY_NAME
    monkeypatch.setattr(cpu_flash, "_library", library)
    monkeypatch.delenv(kc.ENV_SWITCH)  # the suite reads no calibration unless a test turns it on, as here
    g = torch.Generator().manual_seed(3)
    q_rows = torch.randn(2, 2, 6, 64, generator=g) / 4
    mu, v = torch.rand(2, 2, 700, 32, generator=g), torch.randn(2, 2, 700, 16, generator=g)
    angles = torch.rand(1, 700, 64, generator=g) * 2 - 1
    loops = cpu_flash.magnitude_decode(q_rows, mu, v, angles, tiled_rows=7)
    products = cpu_flash.magnitude_decode(q_rows, mu, v, angles, tiled_rows=6)
    assert not torch.equal(loops, products)
    torch.testing.assert_close(loops, products, atol=1e-5, rtol=1e-5)
    assert torch.equal(cpu_flash.magnitude_decode(q_rows, mu, v, angles), loops)  # the default: 16 rows
    kc.write(library, {"results": {}, "pope_decode_rows": {"tiled_rows": {"float32": 4, "bfloat16": 64}}})
    assert kc.decode_tiled_rows(library, torch.float32) == 4 and kc.decode_tiled_rows(library, torch.bfloat16) == 64
    assert torch.equal(cpu_flash.magnitude_decode(q_rows, mu, v, angles), products)
    assert torch.equal(cpu_flash.magnitude_decode(q_rows, mu, v, angles, tiled_rows=100), loops)
    with pytest.raises(ValueError, match="tiled_rows must be a positive int or None"):
        cpu_flash.magnitude_decode(q_rows, mu, v, angles, tiled_rows=0)


def test_the_calibration_takes_the_products_from_where_they_stay_faster():
    from poskit.attention import kernel_calibration as kc

    assert kc.choose_tiled_rows({4: (1.0, 2.0), 8: (2.0, 1.9), 16: (3.0, 2.0)}) == 8
    assert kc.choose_tiled_rows({4: (1.0, 0.9), 8: (2.0, 2.5), 16: (3.0, 2.0)}) == 16  # faster at 4 alone: noise
    assert kc.choose_tiled_rows({4: (1.0, 0.5), 8: (1.0, 0.5)}) == 4
    assert kc.choose_tiled_rows({4: (1.0, 2.0), 8: (1.0, 2.0)}) == 16  # never faster: loops past the largest


@pytest.mark.parametrize("rows", [{"float32": 0}, {"float32": "16"}, {"float16": 16}, {"float32": True}])
def test_a_malformed_decode_threshold_is_named(tmp_path, rows):
    from poskit.attention import kernel_calibration as kc

    path = tmp_path / kc.FILE_NAME
    path.write_text(__import__("json").dumps({"results": {}, "pope_decode_rows": {"tiled_rows": rows}}))
    with pytest.raises(kc.CalibrationError, match=r"pope_decode_rows\.tiled_rows.*not a positive integer"):
        kc.read(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_calibration_that_measured_the_loops_faster_routes_one_token_steps_to_them(kernel, tmp_path, monkeypatch,
                                                                                     dtype):
    # one-token steps, which the torch.compile'd loops can take too, follow this machine's "magnitude_decode"
    # decision for their dtype; a step of several new tokens keeps the kernel (without it the Cartesian keys of
    # the whole cache are rebuilt), as does every step where the loops are switched off
    from poskit.attention import kernel_build
    from poskit.attention import kernel_calibration as kc

    monkeypatch.delenv(kc.ENV_SWITCH)  # the suite reads no calibration unless a test turns it on, as here
    library = tmp_path / kernel_build.LIBRARY_NAME
    monkeypatch.setattr(cpu_flash, "_library", library)
    other = "bfloat16" if dtype == torch.float32 else "float32"
    kc.write(library, {"results": {f"magnitude_decode/{kc._dtype_name(dtype)}": {"kernel": False},
                                   f"magnitude_decode/{other}": {"kernel": True}}})
    enc = build("pope", num_heads=4, dtype=torch.float32, delta_init="uniform")
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=12, Tk=12, dtype=torch.float32)
    positions = torch.arange(12)
    ref = _reference(enc, q, k, v, positions)
    kernel_calls, loop_calls = [], []
    original = cpu_flash.magnitude_decode
    monkeypatch.setattr(cpu_flash, "magnitude_decode", lambda *a: kernel_calls.append(1) or original(*a))
    logits = pope_decode._fused_logits
    monkeypatch.setattr(pope_decode, "_fused_logits", lambda *a: loop_calls.append(1) or logits(*a))
    monkeypatch.setattr(pope_decode, "_fused_failed", False)

    def decode(step: int):
        kernel_calls.clear(), loop_calls.clear()
        cache = KVCache(num_layers=1, max_length=16)
        qs, ks, vs = (t.to(dtype) for t in (q, k, v))
        with torch.no_grad():
            outs = [cached_attention(qs[:, :, :4], ks[:, :, :4], vs[:, :, :4], enc.to(dtype), cache, 0,
                                     positions[:4])]
            for t in range(4, 12, step):
                outs.append(cached_attention(qs[:, :, t:t + step], ks[:, :, t:t + step], vs[:, :, t:t + step],
                                             enc.to(dtype), cache, 0, positions[t:t + step]))
        tol = dict(atol=2e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(torch.cat(outs, 2).double(), ref, **tol)
        return len(kernel_calls), len(loop_calls)

    assert decode(1) == (0, 8)  # measured slower here: the loops take every one-token step
    assert decode(4) == (2, 0)  # several new tokens: the kernel
    monkeypatch.setenv("POSKIT_FUSED_DECODE", "0")
    assert decode(1) == (8, 0)  # no loops to give way to
    monkeypatch.delenv("POSKIT_FUSED_DECODE")
    kc.write(library, {"results": {f"magnitude_decode/{kc._dtype_name(dtype)}": {"kernel": True}}})
    assert decode(1) == (8, 0)
    monkeypatch.setenv(kc.ENV_SWITCH, "off")  # routing by the defaults: the kernel
    kc.write(library, {"results": {f"magnitude_decode/{kc._dtype_name(dtype)}": {"kernel": False}}})
    assert decode(1) == (8, 0)
