"""One mask form between a model and the engine: a model's batch says which keys are real as a (B, Tk) bool
mask, and the engine takes that mask as it is (`engine.attention_with_key_mask`), so nothing widens it to an
SDPA-style 4-d attn_mask for the engine to split back. The entry gives bit for bit what poskit.attention
gives with the same mask written as attn_mask=keep[:, None, None, :], on every path and with any other
attn_mask beside it."""
import pytest
import torch

import poskit
from poskit.attention import engine
from poskit.attention import inputs as attention_inputs
from poskit.models import ModelConfig, Transformer
from conftest import ENCODING_OPTIONS, build, make_qkv

ATTENDING = [n for n in poskit.available_encodings() if build(n).kind != "absolute"]


def _padding(B=2, T=9):
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, :3] = False  # left padding
    real[0, 5] = False  # a pad in the middle
    return real


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ATTENDING)
def test_the_key_mask_entry_equals_attention_with_the_mask_as_attn_mask(name, causal):
    enc = build(name, dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=9, Tk=9, dtype=torch.float32)
    real = _padding()
    gates = {"gate_keys": k.flip(-1)} if getattr(enc, "gates", "") == "separate" else {}
    want = poskit.attention(q, k, v, enc, attn_mask=real[:, None, None, :], is_causal=causal, enable_gqa=True,
                            **gates)
    got = engine.attention_with_key_mask(q, k, v, enc, key_mask=real, is_causal=causal, enable_gqa=True, **gates)
    assert torch.equal(got, want), name


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("name", ["rope", "pope", "alibi", "relative", "cope"])
def test_a_general_attn_mask_beside_the_key_mask_equals_the_two_merged(name, kind):
    # what models/attention.py merged by hand before: the key mask folded into the user's attn_mask
    enc = build(name, dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=9, Tk=9, dtype=torch.float32)
    real = _padding()
    g = torch.Generator().manual_seed(1)
    allowed = torch.rand(9, 9, generator=g) > 0.3
    allowed |= torch.eye(9, dtype=torch.bool)
    mask = allowed if kind == "bool" else torch.where(allowed, torch.randn(9, 9, generator=g), float("-inf"))
    keep = real[:, None, None, :]
    merged = mask & keep if kind == "bool" else torch.where(keep, mask, float("-inf"))
    want = poskit.attention(q, k, v, enc, attn_mask=merged, is_causal=True, enable_gqa=True)
    got = engine.attention_with_key_mask(q, k, v, enc, key_mask=real, attn_mask=mask, is_causal=True,
                                         enable_gqa=True)
    assert torch.equal(got, want), name


def test_the_key_mask_entry_refuses_a_mask_of_the_wrong_shape_or_dtype():
    enc = build("rope", dtype=torch.float32)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=5, Tk=5, dtype=torch.float32)
    for bad in (torch.ones(2, 4, dtype=torch.bool), torch.ones(2, 5)):
        with pytest.raises(ValueError, match=r"key padding mask must be a bool tensor of shape \(2, 5\)"):
            engine.attention_with_key_mask(q, k, v, enc, key_mask=bad, enable_gqa=True)


@pytest.mark.parametrize("name", ["rope", "pope", "cope", "alibi", "learned"])
def test_a_padded_model_forward_hands_the_engine_its_key_mask_without_an_attn_mask(name, monkeypatch):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=17, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, encoding=name,
                                    encoding_options=ENCODING_OPTIONS.get(name, {})))
    ids = torch.randint(1, 17, (2, 9))
    real = _padding()
    before = model(ids, attention_mask=real.long())

    def no_split(*args, **kwargs):
        raise AssertionError("the model's key mask was widened to an attn_mask and split back")

    monkeypatch.setattr(attention_inputs, "split_attn_mask", no_split)
    after = model(ids, attention_mask=real.long())
    assert torch.equal(after, before)


def test_a_padded_cross_attention_hands_the_engine_its_key_mask(monkeypatch):
    torch.manual_seed(0)
    attn = poskit.nn.Attention(32, num_heads=4, encoding="rope")
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    real = _padding()
    before = attn(x, context=memory, context_mask=real)
    monkeypatch.setattr(attention_inputs, "split_attn_mask", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    assert torch.equal(attn(x, context=memory, context_mask=real), before)
