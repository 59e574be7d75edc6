"""poskit.models.Transformer: shapes for every encoding, causality, KV-cache generation, config validation."""
import pytest
import torch

import poskit
from poskit.models import ModelConfig, Transformer

# tiny matrices: one thread is faster, and avoids OpenMP spin-waiting on a busy machine (conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


V = 13

# options some encodings need (scaling variants: the factor; dynamic/yarn: the training context)
OPTIONS = {
    "rope-linear": {"factor": 2.0},
    "rope-ntk": {"factor": 2.0},
    "rope-dynamic": {"factor": 2.0, "original_max_positions": 64},
    "rope-yarn": {"factor": 2.0, "original_max_positions": 16},
    "rope-llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_positions": 16},
    "rope-longrope": {"short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0], "factor": 4.0,
                      "original_max_positions": 64},
    "learned": {"max_positions": 64},
    "relative": {"max_distance": 64},
}


def make(encoding, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, encoding=encoding,
                      encoding_options=OPTIONS.get(encoding, {}), **kw)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("encoding", poskit.available_encodings())
def test_forward_shapes_and_causality(encoding):
    model = make(encoding)
    x = torch.randint(1, V, (3, 11))
    logits = model(x)
    assert logits.shape == (3, 11, V)
    assert torch.isfinite(logits).all()
    # changing the last token must not change the logits of earlier positions (causal model)
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] % (V - 1)) + 1
    torch.testing.assert_close(model(x2)[:, :-1], logits[:, :-1], rtol=1e-5, atol=1e-5)
    # relative encodings see only differences of positions; absolute ones see the positions themselves
    shifted = model(x, positions=torch.arange(5, 16))
    absolute = poskit.build_encoding(encoding, head_dim=8, num_heads=4, dim=32, **OPTIONS.get(encoding, {})).kind == "absolute"
    if absolute:
        assert not torch.allclose(shifted, logits, atol=1e-4), f"{encoding}: positions had no effect"
    else:
        torch.testing.assert_close(shifted, logits, rtol=1e-4, atol=1e-5)
    # and the encoding is really used: stretching the distances changes the logits (CoPE counts by content)
    if encoding not in ("none", "cope", "cope-alibi"):
        stretched = model(x, positions=torch.arange(0, 22, 2))
        assert not torch.allclose(stretched, logits, atol=1e-4), f"{encoding}: positions had no effect"


def test_absolute_encoding_lives_at_the_embeddings_and_others_per_layer():
    m = make("sinusoidal")
    assert m.abs_encoding is not None and m.abs_encoding.kind == "absolute"
    assert all(b.attn.encoding.kind == "none" for b in m.blocks)
    p = make("pope")
    assert p.abs_encoding is None
    deltas = [b.attn.encoding.delta for b in p.blocks]
    assert len({id(d) for d in deltas}) == 2  # one phase bias per layer


@pytest.mark.parametrize("kw", [dict(n_kv_heads=2), dict(n_kv_heads=1), dict(mlp="swiglu"), dict(tie_embeddings=True),
                                dict(dropout=0.1), dict(head_dim=16), dict(bias=True)])
def test_variants_forward(kw):
    model = make("rope", **kw)
    out = model(torch.randint(1, V, (2, 7)))
    assert out.shape == (2, 7, V)
    if kw.get("tie_embeddings"):
        assert model.head.weight is model.embed.weight
    if "n_kv_heads" in kw:
        assert model.blocks[0].attn.k_proj.out_features == kw["n_kv_heads"] * 8


def test_dropout_only_in_training_mode():
    model = make("rope", dropout=0.5)
    x = torch.randint(1, V, (2, 7))
    torch.testing.assert_close(model(x), model(x))
    model.train()
    assert not torch.allclose(model(x), model(x))


def test_cope_separate_gates_has_its_own_projection():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=32, n_heads=4, encoding="cope", encoding_options={"gates": "separate", "p_max": 8})
    model = Transformer(cfg).eval()
    assert model.blocks[0].attn.g_proj is not None
    assert make("cope").blocks[0].attn.g_proj is None
    assert model(torch.randint(1, V, (2, 9))).shape == (2, 9, V)


CACHE_CASES = [e for e in poskit.available_encodings()] + ["cope-separate", "rope-gqa", "pope-gqa", "alibi-gqa"]


def _cache_model(case):
    if case == "cope-separate":
        torch.manual_seed(0)
        return Transformer(ModelConfig(vocab_size=V, d_model=32, n_heads=4, encoding="cope",
                                       encoding_options={"gates": "separate", "p_max": 8})).eval()
    if case.endswith("-gqa"):
        return make(case[:-4], n_kv_heads=2)
    return make(case)


@pytest.mark.parametrize("case", CACHE_CASES)
def test_incremental_logits_with_cache_equal_full_forward(case):
    from poskit.attention.kv_cache import KVCache

    model = _cache_model(case)
    x = torch.randint(1, V, (2, 12))
    full = model(x)
    cache = KVCache(2)
    # prompt of 5 tokens, then one token at a time; dynamic NTK recomputes its base per call by design, so
    # it is compared within its original context (64) where it equals plain RoPE
    parts = [model(x[:, :5], cache=cache)] + [model(x[:, t:t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["none", "rope", "pope", "alibi", "cope", "learned", "relative", "rope-yarn", "pope-gqa"])
def test_generate_with_cache_equals_without(case):
    model = _cache_model(case)
    prompt = torch.randint(1, V, (3, 4))
    greedy_cached = model.generate(prompt, 10)
    greedy_plain = model.generate(prompt, 10, use_cache=False)
    assert greedy_cached.shape == (3, 14)
    assert torch.equal(greedy_cached[:, :4], prompt)
    assert torch.equal(greedy_cached, greedy_plain)
    # sampling with the same generator draws the same tokens both ways
    a = model.generate(prompt, 10, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 10, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3),
                       use_cache=False)
    assert torch.equal(a, b)


def test_top_k_one_is_greedy_and_sampling_varies():
    model = make("rope")
    prompt = torch.randint(1, V, (2, 3))
    greedy = model.generate(prompt, 8)
    assert torch.equal(model.generate(prompt, 8, temperature=1.5, top_k=1, generator=torch.Generator().manual_seed(0)), greedy)
    samples = {tuple(model.generate(prompt, 8, temperature=5.0, generator=torch.Generator().manual_seed(s))[0].tolist())
               for s in range(5)}
    assert len(samples) > 1


def test_generate_restores_training_mode():
    model = make("rope").train()
    model.generate(torch.randint(1, V, (1, 2)), 2)
    assert model.training


@pytest.mark.parametrize("field,value,needle", [
    ("mlp", "relu", "mlp must be one of"),
    ("encoding", "rotary", "encoding must be one of"),
    ("n_kv_heads", 3, "n_kv_heads must be one of"),
    ("d_model", 30, "divisible by n_heads"),
    ("dropout", 1.0, "dropout must be in"),
    ("n_layers", 0, "n_layers must be a positive int"),
    # types, checked against the annotations before anything uses the value
    ("dropout", "abc", "dropout must be a number, got 'abc'"),
    ("tie_embeddings", "no", "tie_embeddings must be true or false, got 'no'"),
    ("bias", 1, "bias must be true or false, got 1"),
    ("n_heads", 4.0, "n_heads must be an integer, got 4.0"),
    ("head_dim", "8", "head_dim must be an integer or null, got '8'"),
    ("encoding_options", [], "encoding_options must be a JSON object"),
    ("norm_eps", 0.0, "norm_eps must be > 0"),
])
def test_bad_config_raises_value_error(field, value, needle):
    kw = dict(vocab_size=V, d_model=32, n_heads=4)
    kw[field] = value
    with pytest.raises(ValueError, match=needle):
        ModelConfig(**kw)


def test_bad_inputs_raise_value_error():
    model = make("rope")
    with pytest.raises(ValueError, match="tokens must be"):
        model(torch.randint(1, V, (5,)))
    with pytest.raises(ValueError, match="positions must have shape"):
        model(torch.randint(1, V, (2, 5)), positions=torch.arange(4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.randint(1, V, (1, 2)), -1)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(torch.randint(1, V, (1, 2)), 2, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="encoding_options|unknown option"):
        Transformer(ModelConfig(vocab_size=V, d_model=32, n_heads=4, encoding="rope", encoding_options={"bogus": 1}))


def test_config_round_trip():
    cfg = ModelConfig(vocab_size=V, d_model=32, n_heads=4, encoding="pope", encoding_options={"delta_init": "uniform"})
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown model config field"):
        ModelConfig.from_dict({**cfg.to_dict(), "depth": 3})
