"""Incremental decoding through the KV cache equals one full forward, for every encoding."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings.base import encoding_class
from poskit.attention import KVCache, cached_attention
from conftest import build, make_qkv
from memory_helpers import allocated_bytes

# the encodings that enter attention (absolute ones go on the embeddings and are refused: test_absolute.py)
ALL = [n for n in poskit.available_encodings() if encoding_class(n).kind != "absolute"]


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=8, deadline=None)
@given(T=st.integers(2, 12), prefill=st.integers(0, 6), groups=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_token_by_token_decode_equals_full_forward(name, T, prefill, groups, seed):
    prefill = min(prefill, T - 1)
    enc = build(name)
    q, k, v = make_qkv(H=4, Hkv=4 // groups, Tq=T, Tk=T, gen_seed=seed)
    gk = k.flip(-1) if getattr(enc, "gates", None) == "separate" else None
    full = poskit.attention(q, k, v, enc, backend="reference", gate_keys=gk, is_causal=True, enable_gqa=True)
    cache = KVCache(num_layers=2)
    outs = []
    steps = ([(0, prefill)] if prefill else []) + [(t, t + 1) for t in range(prefill, T)]
    for a, b in steps:
        pos = torch.arange(a, b)
        sl = slice(a, b)
        outs.append(cached_attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], enc, cache, 1, pos,
                                     gate_keys=None if gk is None else gk[:, :, sl]))
    assert cache.layer(1).length == T and cache.layer(0).length == 0
    if name == "rope-dynamic":
        # its base depends on the length seen so far: each step equals the full forward over its prefix
        for (a, b), out in zip(steps, outs):
            prefix = poskit.attention(q[:, :, :b], k[:, :, :b], v[:, :, :b], enc, backend="reference", is_causal=True, enable_gqa=True)
            assert torch.allclose(out, prefix[:, :, a:b], atol=1e-10)
    else:
        assert torch.allclose(torch.cat(outs, dim=2), full, atol=1e-10)


@pytest.mark.parametrize("name", ["rope", "pope"])
def test_static_rotary_encodings_cache_encoded_keys(name):
    enc = build(name)
    q, k, v = make_qkv(Tq=3, Tk=3)
    cache = KVCache(num_layers=1)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(3))
    layer = cache.layer(0)
    assert layer.encoded
    if name == "pope":  # pope caches the key magnitude softplus(k), d wide
        torch.testing.assert_close(layer.keys, torch.nn.functional.softplus(k))
    else:  # rope caches the rotated key
        torch.testing.assert_close(layer.keys, enc.encode_k(k, torch.arange(3)[None]))


def test_dynamic_rope_and_cope_cache_raw_keys():
    for name in ("rope-dynamic", "cope"):
        enc = build(name)
        q, k, v = make_qkv(Tq=3, Tk=3)
        cache = KVCache(num_layers=1)
        cached_attention(q, k, v, enc, cache, 0, torch.arange(3))
        assert not cache.layer(0).encoded and torch.equal(cache.layer(0).keys, k)


def test_cache_errors_and_bookkeeping():
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        KVCache(num_layers=0)
    cache = KVCache(num_layers=1)
    with pytest.raises(ValueError, match=r"layer index must be in \[0, 0\]"):
        cache.layer(1)
    assert cache.next_position() == 0
    q, k, v = make_qkv(Tq=4, Tk=4)
    cached_attention(q, k, v, build("alibi"), cache, 0, torch.arange(4))
    assert cache.next_position() == 4 and cache.length == 4
    with pytest.raises(ValueError, match="keys must have shape"):
        cache.append(0, k[:, :1], v[:, :1], torch.arange(4, 8))


def test_a_layer_knows_whether_its_keys_are_finite():
    # checked on each append (the new keys only), so that a decode step need not read the whole cache for it
    layer = KVCache(num_layers=1).layer(0)
    q, k, v = make_qkv(B=2, Tq=5, Tk=5)
    layer.append(k, v, torch.arange(5))
    assert layer.keys_finite
    bad = k[:, :, :1].clone()
    bad[1, 0, 0, 0] = float("inf")
    layer.append(bad, v[:, :, :1], torch.tensor([5]))
    assert not layer.keys_finite
    layer.append(k[:, :, :1], v[:, :, :1], torch.tensor([6]))
    assert not layer.keys_finite  # a finite append after it does not hide it
    layer.crop(6)
    assert not layer.keys_finite
    layer.crop(5)  # the infinite key is gone
    assert layer.keys_finite
    layer.append(bad, v[:, :, :1], torch.tensor([5]))
    layer.select_batch(torch.tensor([0, 0]))  # the row that held it is gone
    assert layer.keys_finite
    layer.append(bad, v[:, :, :1], torch.tensor([6]))
    layer.select_batch(torch.tensor([1]))
    assert not layer.keys_finite
    layer.crop(0)
    assert layer.keys_finite


def test_separate_gate_keys_count_as_keys():
    layer = KVCache(num_layers=1).layer(0)
    q, k, v = make_qkv(Tq=3, Tk=3)
    gates = k.clone()
    gates[0, 0, 1, 0] = float("nan")
    layer.append(k, v, torch.arange(3), gate_keys=gates)
    assert not layer.keys_finite


@pytest.mark.parametrize("name", ["alibi", "cope", "relative-capped", "rope"])
def test_a_decode_step_does_not_read_the_cache_to_check_it_is_finite(name):
    """The cache knows its keys are finite; a step checks its new query alone (a sum over the cached keys took
    about 5 ms of a 16 ms fp32 step at B=8, 8192 keys). A key that is not finite still reaches every query that
    sees it, as on the reference path."""
    from torch.profiler import ProfilerActivity, profile

    enc = build(name)
    cache = KVCache(1, max_length=64)
    q, k, v = make_qkv(B=1, H=4, Hkv=2, Tq=40, Tk=40, dtype=torch.float32)  # (float64 takes the exact paths)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(40))
    q1, k1, v1 = make_qkv(B=1, H=4, Hkv=2, Tq=1, Tk=1, gen_seed=1, dtype=torch.float32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        cached_attention(q1, k1, v1, enc, cache, 0, torch.tensor([40]))
    summed = [e.input_shapes[0] for e in prof.events() if e.name == "aten::sum" and e.input_shapes
              and e.input_shapes[0]]
    assert not any(len(s) == 4 and s[2] == 41 for s in summed), summed
    k1[0, 0, 0, 0] = float("nan")
    cached_attention(q1, k1, v1, enc, cache, 0, torch.tensor([41]))
    assert not cache.layer(0).keys_finite
    out = cached_attention(q1, k1 * 0, v1, enc, cache, 0, torch.tensor([42]))
    assert out[0, :2].isnan().all() and torch.isfinite(out[0, 2:]).all()  # kv head 0 serves query heads 0, 1


@pytest.mark.parametrize("name", ["rope-dynamic", "xpos"])
def test_re_encoding_raw_keys_reads_the_cache_in_place(name):
    """Encodings that re-encode the cached raw keys at every step (dynamic NTK, xPos) allocate the encoded keys,
    and nothing more for a cache with room to grow (whose keys are a view with gaps between heads) than for a
    filled one: the rotation made the view contiguous first, a copy of the cache per step."""
    enc = build(name)
    allocated = {}
    for room in (1, 64):
        cache = KVCache(1, max_length=200 + room)
        q, k, v = make_qkv(B=2, H=4, Hkv=4, Tq=200, Tk=200, dtype=torch.float32)
        cached_attention(q, k, v, enc, cache, 0, torch.arange(200))
        q1, k1, v1 = make_qkv(B=2, H=4, Hkv=4, Tq=1, Tk=1, gen_seed=1, dtype=torch.float32)
        allocated[room] = allocated_bytes(lambda: cached_attention(q1, k1, v1, enc, cache, 0, torch.tensor([200])))
    cache_keys = 2 * 4 * 201 * 16 * 4
    assert allocated[64] < allocated[1] + cache_keys / 4, allocated
