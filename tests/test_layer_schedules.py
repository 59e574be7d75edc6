"""Per-layer encodings (ModelConfig.layer_encodings, irope's declared pattern, HF's no_rope_layers /
no_rope_layer_interval / sliding_window_pattern + rope_local_base_freq): a scheduled model equals a model built by
hand with those encodings per layer, decoding through the KV cache equals the full forward, models without a
schedule are unchanged, the refusals name the field, and the HF bridge keeps the schedule."""
import pytest
import torch

import poskit
from poskit.attention import KVCache
from poskit.models import ModelConfig, Transformer
from poskit.models.decoder import layer_spec

V = 37


def config(n_layers=4, **kw):
    return ModelConfig(vocab_size=V, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, **kw)


SCHEDULES = {
    "irope": dict(layer_encodings=["*", "*", "*", "none"]),  # Llama 4: no position on every 4th layer
    "gemma": dict(encoding_options={"base": 1e6}, layer_encodings=["rope:base=10000", "*"]),  # local, global bases
    "mixed": dict(layer_encodings=["alibi", "t5", "*", "pope:delta_init=uniform", "none"], n_layers=5),
}


def hand_built(cfg: ModelConfig, specs) -> Transformer:
    """The model of `cfg` without its schedule, each layer's encoding then replaced by hand."""
    import dataclasses

    plain = Transformer(dataclasses.replace(cfg, layer_encodings=None))
    for block, spec in zip(plain.blocks, specs):
        name, options = spec
        block.attn.encoding = poskit.build_encoding(name, head_dim=cfg.dim_head, num_heads=cfg.n_heads, **options)
    return plain


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_scheduled_model_equals_one_built_by_hand_with_those_encodings(name):
    kw = dict(SCHEDULES[name])
    cfg = config(**kw)
    torch.manual_seed(0)
    scheduled = Transformer(cfg).double().eval()
    pattern = cfg.layer_encodings
    specs = [(cfg.encoding, cfg.encoding_options) if pattern[i % len(pattern)] == "*"
             else poskit.EncodingSpec.parse(pattern[i % len(pattern)]).to_config() for i in range(cfg.n_layers)]
    assert [layer_spec(cfg, i).to_config() for i in range(cfg.n_layers)] == specs
    by_hand = hand_built(cfg, specs).double().eval()
    assert [e.name for e in scheduled.encoding_modules()] == [s[0] for s in specs]
    by_hand.load_state_dict(scheduled.state_dict())  # the same names: nothing missing, nothing unexpected
    tokens = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(1))
    assert torch.equal(scheduled(tokens), by_hand(tokens))


def test_without_a_schedule_models_are_unchanged_and_a_pattern_of_the_model_encoding_is_no_schedule():
    for kw in (dict(), dict(encoding="pope", encoding_options={"delta_init": "uniform"}),
               dict(encoding="cope", encoding_options={"p_max": 4})):
        torch.manual_seed(3)
        plain = Transformer(config(**kw))
        torch.manual_seed(3)
        starred = Transformer(config(layer_encodings=["*"], **kw))
        a, b = plain.state_dict(), starred.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", SCHEDULES)
def test_decoding_token_by_token_equals_the_full_forward(name):
    torch.manual_seed(2)
    model = Transformer(config(**SCHEDULES[name])).double().eval()
    tokens = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    full = model(tokens, attention_mask=mask)
    cache = KVCache(model.config.n_layers)
    steps = [model(tokens[:, :5], cache=cache, attention_mask=mask[:, :5])]
    steps += [model(tokens[:, t:t + 1], cache=cache) for t in range(5, 12)]
    got = torch.cat(steps, 1)
    torch.testing.assert_close(got[mask], full[mask], atol=1e-10, rtol=0)
    # each layer caches in its own encoding's form: rotated keys (rope), magnitudes (pope), raw keys (the others)
    assert [layer.encoded for layer in cache.layers] == [e.cache_form != "raw" for e in model.encoding_modules()]


def test_generate_with_the_cache_equals_generate_without():
    torch.manual_seed(5)
    model = Transformer(config(**SCHEDULES["mixed"])).eval()
    prompt = torch.randint(0, V, (2, 4), generator=torch.Generator().manual_seed(6))
    assert torch.equal(model.generate(prompt, 6), model.generate(prompt, 6, use_cache=False))


def test_irope_declares_the_same_schedule_as_its_layer_encodings():
    torch.manual_seed(7)
    irope = Transformer(config(encoding="irope", encoding_options={"nope_every": 2, "base": 500}))
    torch.manual_seed(7)
    listed = Transformer(config(encoding_options={"base": 500}, layer_encodings=["*", "none"]))
    assert [e.name for e in irope.encoding_modules()] == ["irope", "none", "irope", "none"]
    assert all(e.base == 500 for e in irope.encoding_modules()[::2])
    tokens = torch.randint(0, V, (1, 9))
    assert torch.equal(irope(tokens), listed(tokens))
    # alone, one layer of it is rope; a model shorter than its interval has no layer without position (HF's count)
    q = torch.randn(1, 4, 6, 8)
    alone = poskit.build_encoding("irope", head_dim=8, num_heads=4)
    rope = poskit.build_encoding("rope", head_dim=8, num_heads=4)
    assert torch.equal(poskit.attention(q, q, q, alone, is_causal=True), poskit.attention(q, q, q, rope, is_causal=True))
    assert [e.name for e in Transformer(config(n_layers=3, encoding="irope")).encoding_modules()] == ["irope"] * 3


@pytest.mark.parametrize("kw, message", [
    (dict(layer_encodings=["*"] * 5), "layer_encodings must be a list of 1 to n_layers=4 encoding specs"),
    (dict(layer_encodings=[]), "layer_encodings must be a list of 1 to n_layers=4"),
    (dict(layer_encodings="none"), "layer_encodings must be a list of strings or null"),
    (dict(layer_encodings=["*", "ropee"]), r"layer_encodings\[1\] must be one of \["),
    (dict(layer_encodings=["rope:bse=3"]), r"layer_encodings\[0\]\.bse must be one of rope's options"),
    (dict(layer_encodings=["*", "pope:delta_projection=maybe"]), r"layer_encodings\[1\]\.delta_projection must be "
                                                                   "true or false"),
    (dict(layer_encodings=["rope:base=0.5"]), r"layer_encodings\[0\] 'rope:base=0.5': base must be"),
    (dict(layer_encodings=["learned"]), r"layer_encodings\[0\] must be an encoding inside attention"),
    (dict(layer_encodings=["irope"]), r"layer_encodings\[0\] must be the encoding of one layer"),
    (dict(encoding="irope", layer_encodings=["none"]), "layer_encodings must be null with encoding 'irope'"),
    (dict(encoding="irope", encoding_options={"nope_every": 1}), "nope_every must be"),
    (dict(attention="linear", layer_encodings=["*", "alibi"]), r"layer_encodings\[1\] must be an encoding that "
                                                               "declares a linear_form"),
])
def test_bad_schedules_are_refused_in_one_line_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message) as err:
        config(**kw)
    assert "\n" not in str(err.value)


def test_layer_entries_are_typed_by_the_encoding_spec_rules():
    # the same parser as `encoding`: a bool word reaches the encoding as a bool, never as a truthy string
    cfg = config(layer_encodings=["*", "pope:delta_projection=no:softplus=yes"])
    assert layer_spec(cfg, 1) == poskit.EncodingSpec("pope", {"delta_projection": False, "softplus": True})
    assert layer_spec(cfg, 0) == cfg.encoding_spec
    assert Transformer(cfg).blocks[1].attn.encoding.delta_projection is False


# -- the HF bridge ------------------------------------------------------------------------------------------------
def hf():
    from extras import need

    need("transformers", "hf", "transformers (poskit.hf needs it)")
    from poskit.hf import PoskitConfig, PoskitForCausalLM

    return PoskitConfig, PoskitForCausalLM


SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, vocab_size=V)


@pytest.mark.parametrize("fields, schedule", [
    (dict(no_rope_layer_interval=4), ["*", "*", "*", "none"]),
    (dict(no_rope_layers=[1, 0, 1, 1, 0]), ["*", "none", "*", "*"]),  # at least one flag per layer, as HF reads it
    (dict(no_rope_layer_interval=8), None),  # no layer is the 8th: no schedule
    (dict(sliding_window_pattern=2, rope_local_base_freq=10000.0, rope_theta=1e6, rope_interleave=False),
     ["rope:base=10000.0:layout=half", "*"] * 2),
])
def test_hf_names_of_schedules_become_layer_encodings(fields, schedule):
    PoskitConfig, _ = hf()
    cfg = PoskitConfig(**SMALL, **fields)
    assert cfg.layer_encodings == schedule
    assert cfg.to_model_config().layer_encodings == schedule


@pytest.mark.parametrize("fields, message", [
    (dict(no_rope_layers=[1, 0]), "no_rope_layers must be a list of at least num_hidden_layers=4 flags"),
    (dict(no_rope_layer_interval=0), "no_rope_layer_interval must be an int >= 1"),
    (dict(no_rope_layers=[1] * 4, no_rope_layer_interval=2), "give one"),
    (dict(sliding_window_pattern=6), "go together"),
    (dict(sliding_window_pattern=2, rope_local_base_freq=0.5), "rope_local_base_freq: base must be"),
    (dict(sliding_window_pattern=2, rope_local_base_freq=1e4, position_encoding="alibi"), "not a rope encoding"),
    (dict(layer_encodings=["*", "none"], no_rope_layer_interval=2), "both give the encoding of each layer"),
    (dict(layer_encodings=["*", "nope"]), r"layer_encodings\[1\] must be one of \["),
])
def test_hf_schedule_fields_are_refused_in_one_line(fields, message):
    PoskitConfig, _ = hf()
    with pytest.raises(ValueError, match=message) as err:
        PoskitConfig(**SMALL, **fields)
    assert "\n" not in str(err.value)


def test_hf_round_trip_keeps_the_schedule_and_its_logits(tmp_path):
    PoskitConfig, PoskitForCausalLM = hf()
    torch.manual_seed(8)
    model = PoskitForCausalLM(PoskitConfig(**SMALL, no_rope_layer_interval=2,
                                           position_encoding_options={"base": 500.0})).eval()
    ref = Transformer(model.config.to_model_config()).eval()
    ref.load_state_dict(model.model.state_dict())
    ids = torch.randint(0, V, (2, 9))
    assert torch.equal(model(ids).logits, ref(ids))
    model.config.poskit_fingerprint = model.config.fingerprint()
    model.save_pretrained(tmp_path)
    loaded = PoskitForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_encodings == ["*", "none"] * 2
    assert loaded.config.fingerprint()["fields"]["layer_encodings"] == ["*", "none"] * 2
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert torch.equal(loaded.generate(ids[:1, :4], max_new_tokens=5, do_sample=False),
                       ref.generate(ids[:1, :4], 5))
    # weights trained under one schedule are refused under another
    import json

    config = json.loads((tmp_path / "config.json").read_text())
    config["layer_encodings"] = ["*"] * 2 + ["none"] * 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="layer_encodings is"):
        PoskitForCausalLM.from_pretrained(tmp_path)


def test_hf_model_keeps_each_layers_own_rope_base(tmp_path):
    # the frequencies are non-persistent buffers that the HF model rebuilds: each from its own layer's spec
    PoskitConfig, PoskitForCausalLM = hf()
    torch.manual_seed(9)
    model = PoskitForCausalLM(PoskitConfig(**SMALL, rope_theta=1e6, sliding_window_pattern=2,
                                           rope_local_base_freq=100.0))
    ref = Transformer(model.config.to_model_config())
    model.save_pretrained(tmp_path)
    loaded = PoskitForCausalLM.from_pretrained(tmp_path)  # built under the meta device, buffers refilled
    for ours, back, theirs in zip(model.model.encoding_modules(), loaded.model.encoding_modules(),
                                  ref.encoding_modules()):
        assert torch.equal(ours.inv_freq, theirs.inv_freq) and torch.equal(back.inv_freq, theirs.inv_freq)
    assert len({float(e.inv_freq[1]) for e in ref.encoding_modules()}) == 2  # two bases, so the check can fail


def test_native_llama_export_refuses_a_schedule_naming_layer_encodings():
    # a native LlamaForCausalLM has one RoPE in every layer: a schedule is refused at the config, naming the field
    hf()
    from poskit.hf.llama import llama_config

    base = dict(mlp="swiglu", encoding="rope")
    llama_config(config(**base))  # the same config without a schedule is a Llama
    with pytest.raises(ValueError, match=r"^layer_encodings must be null \(one RoPE in every layer\)") as err:
        llama_config(config(layer_encodings=["*", "none"], **base))
    assert "\n" not in str(err.value)
