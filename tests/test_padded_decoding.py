"""Padding everywhere, decoding included: the KV cache keeps a padding mask per key and
Transformer.forward/generate take Hugging Face's attention_mask (B, T), 1 = real token."""
import pytest
import torch

import poskit
from poskit.attention import KVCache, cached_attention
from poskit.attention.padding import padded_positions
from poskit.models import ModelConfig, Transformer
from conftest import ENCODING_OPTIONS, build, make_qkv

ALL = poskit.available_encodings()


def _model(name, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=17, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, encoding=name,
                      encoding_options=ENCODING_OPTIONS.get(name, {}))
    return Transformer(cfg).double()


def _padded(prompts, side="left"):
    T0 = max(len(p) for p in prompts)
    batch = torch.zeros(len(prompts), T0, dtype=torch.long)  # pad id 0: an ordinary token the mask hides
    mask = torch.zeros(len(prompts), T0, dtype=torch.long)
    for i, p in enumerate(prompts):
        cols = slice(T0 - len(p), T0) if side == "left" else slice(0, len(p))
        batch[i, cols], mask[i, cols] = p, 1
    return batch, mask


PROMPTS = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2]), torch.tensor([6, 5, 3])]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("name", ALL)
def test_left_padded_greedy_generation_equals_each_prompt_alone(name, use_cache):
    model = _model(name)
    batch, mask = _padded(PROMPTS)
    out = model.generate(batch, 5, attention_mask=mask, use_cache=use_cache)
    for i, p in enumerate(PROMPTS):
        alone = model.generate(p[None], 5, use_cache=use_cache)
        assert torch.equal(out[i, batch.shape[1]:], alone[0, len(p):]), (name, i)


@pytest.mark.parametrize("name", ["rope", "pope", "cope", "alibi", "learned"])
def test_right_padding_is_handled_too(name):
    # each row continues from its last real token; the pads stay in the sequence, hidden and uncounted
    model = _model(name)
    batch, mask = _padded(PROMPTS, side="right")
    out = model.generate(batch, 4, attention_mask=mask.bool())
    for i, p in enumerate(PROMPTS):
        assert torch.equal(out[i, batch.shape[1]:], model.generate(p[None], 4)[0, len(p):])


@pytest.mark.parametrize("name", ["rope", "cope"])
def test_padded_forward_logits_equal_the_sequences_alone(name):
    model = _model(name)
    batch, mask = _padded(PROMPTS)
    logits = model(batch, attention_mask=mask)
    for i, p in enumerate(PROMPTS):
        torch.testing.assert_close(logits[i, -len(p):], model(p[None])[0], atol=1e-10, rtol=0)


def test_a_fully_padded_row_is_refused_by_generate_and_harmless_in_forward():
    model = _model("cope")
    batch, mask = _padded(PROMPTS)
    mask[1] = 0
    with pytest.raises(ValueError, match=r"attention_mask rows \[1\] have no real token"):
        model.generate(batch, 2, attention_mask=mask)
    logits = model(batch, attention_mask=mask)
    assert logits.isfinite().all()
    torch.testing.assert_close(logits[0], model(PROMPTS[0][None])[0], atol=1e-10, rtol=0)


def test_attention_mask_is_validated():
    model = _model("rope")
    batch, mask = _padded(PROMPTS)
    with pytest.raises(ValueError, match=r"attention_mask must be a \(3, 5\) tensor"):
        model(batch, attention_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="bools or the ints 0 and 1"):
        model(batch, attention_mask=mask * 2)
    with pytest.raises(ValueError, match="bools or the ints 0 and 1"):
        model(batch, attention_mask=mask.float())


def test_hugging_face_full_length_mask_with_a_cache():
    model = _model("rope")
    batch, mask = _padded(PROMPTS)
    cache = KVCache(2)
    model(batch, cache=cache, attention_mask=mask)
    nxt = torch.tensor([[1], [2], [3]])
    full = torch.cat((mask, torch.ones(3, 1, dtype=torch.long)), 1)
    a = model(nxt, cache=cache, attention_mask=full)
    cache.crop(5)
    b = model(nxt, cache=cache)  # the stored mask carries on without a mask
    torch.testing.assert_close(a, b)
    cache.crop(5)
    wrong = full.clone()
    wrong[1, 0] = 1
    with pytest.raises(ValueError, match="must equal the padding already stored"):
        model(nxt, cache=cache, attention_mask=wrong)
    assert cache.length == 5


@pytest.mark.parametrize("name", [n for n in ALL if build(n).kind != "absolute"])
def test_cached_attention_with_padding_equals_attention_with_the_key_mask(name):
    enc = build(name)
    B, T = 2, 8
    q, k, v = make_qkv(B=B, H=4, Hkv=2, Tq=T, Tk=T)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, :3] = False  # left padding
    real[0, 5] = False  # a pad in the middle
    pos = padded_positions(real)
    gates = {"gate_keys": k.flip(-1)} if getattr(enc, "gates", "") == "separate" else {}
    cache = KVCache(1)
    for i, j in ((0, 4), (4, 5), (5, 6), (6, 8)):
        g = {"gate_keys": gates["gate_keys"][:, :, i:j]} if gates else {}
        step = cached_attention(q[:, :, i:j], k[:, :, i:j], v[:, :, i:j], enc, cache, 0, pos[:, i:j],
                                attention_mask=real[:, i:j].long(), **g)
        # the full forward over the prefix (rope-dynamic's frequencies follow the length seen so far)
        g = {"gate_keys": gates["gate_keys"][:, :, :j]} if gates else {}
        full = poskit.attention(q[:, :, :j], k[:, :, :j], v[:, :, :j], enc, is_causal=True, enable_gqa=True,
                                q_positions=pos[:, :j], k_positions=pos[:, :j],
                                attn_mask=real[:, None, None, :j], **g)[:, :, i:j]
        keep = real[:, None, i:j, None].expand_as(full)  # the rows of real queries (a pad's own row is moot)
        torch.testing.assert_close(step[keep], full[keep])
    assert torch.equal(cache.layer(0).key_mask, real)


def test_cache_key_mask_grows_crops_and_is_validated_before_mutation():
    cache = KVCache(1)
    layer = cache.layer(0)
    k = torch.randn(2, 1, 3, 4)
    layer.append(k, k, torch.arange(3))
    assert layer.key_mask is None  # no padding seen: nothing stored
    layer.append(k, k, torch.arange(3, 6), key_mask=torch.tensor([[True, False, True], [True] * 3]))
    assert layer.key_mask.tolist() == [[True] * 4 + [False, True], [True] * 6]  # earlier keys: real
    layer.append(k[:, :, :1], k[:, :, :1], torch.tensor([6]))  # no mask: a real token
    assert layer.key_mask.shape == (2, 7) and layer.key_mask[:, -1].all()
    assert cache.next_positions().tolist() == [7, 7]
    with pytest.raises(ValueError, match=r"key_mask must be a bool tensor of shape \(B, T\) = \(2, 1\)"):
        layer.append(k[:, :, :1], k[:, :, :1], torch.tensor([7]), key_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_mask must be a bool tensor"):
        layer.append(k[:, :, :1], k[:, :, :1], torch.tensor([7]), key_mask=torch.ones(2, 1))
    assert layer.length == 7 and layer.key_mask.shape == (2, 7)  # unchanged by the refusals
    cache.crop(5)
    assert layer.key_mask.tolist() == [[True] * 4 + [False], [True] * 5]
    assert cache.next_positions().tolist() == [4, 5]  # the pad at position 4 is not counted
    cache.crop(0)
    assert layer.key_mask is None or layer.key_mask.shape == (2, 0)


def test_cached_attention_refuses_a_bad_mask_before_touching_the_cache():
    enc = build("cope")
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=3, Tk=3)
    cache = KVCache(1)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(3))
    for bad in (torch.ones(2, 2, dtype=torch.bool), torch.full((2, 3), 2)):
        with pytest.raises(ValueError, match="attention_mask must"):
            cached_attention(q, k, v, enc, cache, 0, torch.arange(3, 6), attention_mask=bad)
    assert cache.length == 3 and cache.layer(0).key_mask is None
    with pytest.raises(TypeError, match="attn_mask"):
        cached_attention(q, k, v, enc, cache, 0, torch.arange(3, 6), key_padding_mask=torch.ones(2, 3))


def test_pope_fused_decode_kernel_serves_a_padded_cache(monkeypatch):
    # float32 takes the compiled magnitude kernel on CPU; it must hide the pads as the exact rebuild does
    enc = build("pope", dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=6, Tk=6, dtype=torch.float32)
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]).bool()
    pos = padded_positions(real)
    outs = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("POSKIT_FUSED_DECODE", fused)
        cache = KVCache(1)
        cached_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], enc, cache, 0, pos[:, :5], attention_mask=real[:, :5])
        outs[fused] = cached_attention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], enc, cache, 0, pos[:, 5:])
    torch.testing.assert_close(outs["1"], outs["0"], atol=1e-5, rtol=1e-5)
    alone = poskit.attention(q[:1, :, 2:], k[:1, :, 2:], v[:1, :, 2:], enc, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(outs["1"][:1], alone[:, :, -1:], atol=1e-5, rtol=1e-5)
