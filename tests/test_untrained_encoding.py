"""An encoding whose trainable parameters no model holds never trains, silently: poskit says so, once.

Registered as a submodule of any nn.Module (an attribute, a ModuleList, poskit.nn.Attention, a poskit model),
the encoding is the model's to train and nothing is said; outside every module, the first gradient that reaches
its parameters after attention() ran with gradients on warns, once per encoding. A forward pass alone
(inference) says nothing.
"""
import warnings

import pytest
import torch
from torch import nn

import poskit
from poskit.attention import KVCache, cached_attention, linear_attention
from poskit.encodings.registration import UntrainedEncodingWarning, in_a_module

ADVICE = r"assign it as an attribute of your nn.Module"


def qkv(T=5):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, T, 16, generator=g) for _ in range(3)]


def untrained_warnings(call) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the once-per-encoding rule is the encoding's, not Python's registry
        call()
    return [w for w in caught if issubclass(w.category, UntrainedEncodingWarning)]


@pytest.mark.parametrize("name, options", [("pope", {}), ("cope", {}), ("relative", {}),
                                           ("cope-alibi", {"learned_slopes": True})])
def test_an_encoding_outside_every_module_warns_once_saying_what_to_do(name, options):
    enc = poskit.build_encoding(name, head_dim=16, num_heads=2, **options)
    q, k, v = qkv()
    assert untrained_warnings(lambda: poskit.attention(q, k, v, enc, is_causal=True)) == []  # inference: quiet
    first = untrained_warnings(lambda: poskit.attention(q, k, v, enc, is_causal=True).sum().backward())
    assert len(first) == 1
    message = str(first[0].message)
    assert f"the encoding {name!r} has trainable parameters but is not part of any nn.Module" in message
    assert ADVICE in message and "\n" not in message
    again = untrained_warnings(lambda: poskit.attention(q, k, v, enc, is_causal=True).sum().backward())
    assert again == []  # once per encoding
    other = poskit.build_encoding(name, head_dim=16, num_heads=2, **options)
    assert len(untrained_warnings(lambda: poskit.attention(q, k, v, other, is_causal=True).sum().backward())) == 1


def test_the_trap_it_reports_cope_never_trains():
    # the optimizer of a model that does not hold the encoding leaves CoPE's embeddings at their zeros
    enc = poskit.build_encoding("cope", head_dim=16, num_heads=2)
    proj = nn.Linear(16, 16)
    opt = torch.optim.SGD(proj.parameters(), lr=0.1)
    q, k, v = qkv()
    with pytest.warns(UntrainedEncodingWarning, match=ADVICE):
        poskit.attention(proj(q), k, v, enc, is_causal=True).pow(2).sum().backward()
    opt.step()
    assert enc.pos_emb.grad is not None and torch.equal(enc.pos_emb, torch.zeros_like(enc.pos_emb))


class Holder(nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.enc = enc


@pytest.mark.parametrize("register", [
    lambda enc: Holder(enc),
    lambda enc: nn.ModuleList([enc]),
    lambda enc: nn.Sequential().add_module("enc", enc),
    lambda enc: nn.Module().register_module("enc", enc),
    lambda enc: poskit.nn.Attention(32, 2, encoding=enc),
])
def test_an_encoding_registered_in_any_module_is_not_warned_about(register):
    enc = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    assert not in_a_module(enc)
    register(enc)
    assert in_a_module(enc)
    q, k, v = qkv()
    assert untrained_warnings(lambda: poskit.attention(q, k, v, enc, is_causal=True).sum().backward()) == []


def test_an_encoding_registered_after_its_first_call_is_not_warned_about():
    enc = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    q, k, v = qkv()
    out = poskit.attention(q, k, v, enc, is_causal=True)
    holder = Holder(enc)  # registered before the backward: the model holds it now
    assert untrained_warnings(lambda: out.sum().backward()) == [] and holder.enc is enc


def test_poskit_models_and_layers_hold_their_encodings():
    from poskit.models import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=11, d_model=32, n_layers=1, n_heads=2, encoding="cope"))
    assert all(in_a_module(enc) for enc in model.encoding_modules())
    tokens = torch.randint(0, 11, (2, 6))
    assert untrained_warnings(lambda: model(tokens).sum().backward()) == []
    layer = poskit.nn.Attention(32, 2, encoding="relative")
    assert untrained_warnings(lambda: layer(torch.randn(1, 5, 32), is_causal=True).sum().backward()) == []


def test_no_warning_without_gradients_or_without_trainable_parameters():
    q, k, v = qkv()
    pope = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    with torch.no_grad():
        assert untrained_warnings(lambda: poskit.attention(q, k, v, pope, is_causal=True)) == []
    q.requires_grad_(True)  # a backward through attention, but no parameter of the encoding to train
    frozen = poskit.build_encoding("pope", head_dim=16, num_heads=2).requires_grad_(False)
    for enc in (frozen, poskit.build_encoding("rope", head_dim=16, num_heads=2),
                poskit.build_encoding("alibi", head_dim=16, num_heads=2),
                poskit.build_encoding("pope", head_dim=16, num_heads=2, phase_bias=False)):
        assert untrained_warnings(lambda: poskit.attention(q, k, v, enc, is_causal=True).sum().backward()) == []


def test_a_refused_call_does_not_warn():
    pope = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    q, k, v = qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="dropout_p must be 0.0"):
            poskit.attention(q, k, v, pope, dropout_p=0.1)
    assert not [w for w in caught if issubclass(w.category, UntrainedEncodingWarning)]


def test_the_kv_cache_and_linear_attention_warn_too():
    q, k, v = qkv()
    pope = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    step = lambda: cached_attention(q, k, v, pope, KVCache(1), 0, torch.arange(5)).sum().backward()  # noqa: E731
    assert len(untrained_warnings(step)) == 1
    pope = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    assert len(untrained_warnings(lambda: linear_attention(q, k, v, pope).sum().backward())) == 1
