"""Incremental decoding through the KV cache equals one full forward, for every encoding."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings.base import encoding_class
from poskit.attention import KVCache, cached_attention
from conftest import build, make_qkv

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
