"""poskit.nn.Attention: projections, grouped-query heads, masks and the KV cache around
poskit.attention, with the encoding chosen by one keyword."""
import pytest
import torch

import poskit
import poskit.nn
from poskit.attention import KVCache
from conftest import ENCODING_OPTIONS

ATTENTION_ENCODINGS = [n for n in poskit.available_encodings()
                       if n not in ("sinusoidal", "learned", "legendre")]


def _layer(name, num_kv_heads=2, **kw):
    torch.manual_seed(0)
    layer = poskit.nn.Attention(32, 4, num_kv_heads, encoding=name, **dict(ENCODING_OPTIONS.get(name, {}), **kw))
    return layer.double()


@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_equals_hand_written_projections_and_poskit_attention(name):
    layer = _layer(name)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    heads = lambda t, n: t.view(2, 9, n, 8).transpose(1, 2)
    q, k, v = heads(layer.q_proj(x), 4), heads(layer.k_proj(x), 2), heads(layer.v_proj(x), 2)
    gates = {"gate_keys": heads(layer.g_proj(x), 2)} if layer.g_proj is not None else {}
    out = poskit.attention(q, k, v, layer.encoding, is_causal=True, enable_gqa=True, backend="reference", **gates)
    want = layer.o_proj(out.transpose(1, 2).reshape(2, 9, 32))
    torch.testing.assert_close(layer(x, is_causal=True), want, atol=1e-12, rtol=0)
    assert not torch.allclose(layer(x), want)  # is_causal defaults to False, as in nn.MultiheadAttention


@pytest.mark.parametrize("name", ["rope", "pope", "alibi", "cope", "relative"])  # (rope-dynamic follows the length)
def test_cached_decode_equals_the_full_forward(name):
    layer = _layer(name)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    full = layer(x, is_causal=True)
    cache = KVCache(3)
    steps = [layer(x[:, :3], is_causal=True, cache=cache, layer_idx=2)]
    steps += [layer(x[:, t:t + 1], is_causal=True, cache=cache, layer_idx=2) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=0)
    assert cache.layer(2).length == 7 and cache.layer(0).length == 0


def test_padding_mask_and_cache_together():
    layer = _layer("cope")
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    padded = layer(x, is_causal=True, attention_mask=real)
    alone = layer(x[:1, 2:], is_causal=True)
    torch.testing.assert_close(padded[0, 2:], alone[0], atol=1e-10, rtol=0)
    cache = KVCache(1)
    first = layer(x[:, :4], is_causal=True, attention_mask=real[:, :4], cache=cache)
    second = layer(x[:, 4:], is_causal=True, cache=cache)  # positions continue per row, pads not counted
    torch.testing.assert_close(torch.cat((first, second), 1)[0, 2:], alone[0], atol=1e-10, rtol=0)


def test_gqa_equals_repeated_kv_projections():
    grouped = _layer("rope", num_kv_heads=2)
    full = _layer("rope", num_kv_heads=4)
    with torch.no_grad():  # kv head j of `grouped` serves query heads 2j, 2j + 1: repeat its weight rows
        for name in ("k_proj", "v_proj"):
            w = getattr(grouped, name).weight.view(2, 8, 32)
            getattr(full, name).weight.copy_(w.repeat_interleave(2, 0).reshape(32, 32))
        full.q_proj.weight.copy_(grouped.q_proj.weight)
        full.o_proj.weight.copy_(grouped.o_proj.weight)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    torch.testing.assert_close(grouped(x, is_causal=True), full(x, is_causal=True), atol=1e-12, rtol=0)


def test_general_attn_mask_like_sdpa():
    layer = _layer("alibi")
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(layer(x, attn_mask=causal), layer(x, is_causal=True))
    with pytest.raises(ValueError, match="attn_mask cannot be used with a cache"):
        layer(x, attn_mask=causal, is_causal=True, cache=KVCache(1))
    with pytest.raises(ValueError, match="pass is_causal=True with cache"):
        layer(x, cache=KVCache(1))


def test_state_dict_round_trip():
    a, b = _layer("pope"), _layer("pope", delta_init="zero")
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    assert not torch.allclose(a(x, is_causal=True), b(x, is_causal=True))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x, is_causal=True), b(x, is_causal=True), atol=0, rtol=0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="adds vectors to the token embeddings"):
        poskit.nn.Attention(32, 4, encoding="sinusoidal")
    with pytest.raises(ValueError, match=r"num_kv_heads must divide num_heads=4: one of \[1, 2, 4\]"):
        poskit.nn.Attention(32, 4, 3)
    with pytest.raises(ValueError, match="dim=30 must be divisible by num_heads=4"):
        poskit.nn.Attention(30, 4)
    with pytest.raises(ValueError, match="unknown option"):
        poskit.nn.Attention(32, 4, encoding="rope", bse=10)
    enc = poskit.build_encoding("rope", head_dim=8, num_heads=4)
    assert poskit.nn.Attention(32, 4, encoding=enc).encoding is enc
    with pytest.raises(ValueError, match="built with head_dim=16"):
        poskit.nn.Attention(32, 2, encoding=enc)
