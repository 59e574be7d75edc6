"""Every config field and argument that names an encoding goes through EncodingSpec: the decoder's and the
encoder-decoder's configs type and check their encoding options when they are made (one bool rule, one error
format naming the field), the ViT takes a spec, RoPE's nullable flags are bools and its HF dicts JSON objects,
and rope_hf.from_hf gives a spec."""
import pytest
import torch

import poskit
from poskit.encodings import base as encodings_base
from poskit.encodings import spec as spec_module
from poskit.encodings.rope_hf import from_hf
from poskit.encodings.spec import EncodingSpec, SpecError
from poskit.models import EncoderDecoder, EncoderDecoderConfig, ModelConfig, Transformer, ViT
from poskit.training import TrainConfig
from poskit.util.config_check import ConfigError


# -- the decoder's and the encoder-decoder's configs ---------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda **kw: ModelConfig(**kw),
    lambda **kw: EncoderDecoderConfig(**kw),
], ids=["ModelConfig", "EncoderDecoderConfig"])
def test_a_config_types_its_encoding_options_by_the_one_bool_rule(make):
    cfg = make(encoding="pope", encoding_options={"softplus": "no", "delta_init": "uniform"})
    assert cfg.encoding_options == {"softplus": False, "delta_init": "uniform"}


@pytest.mark.parametrize("make", [ModelConfig, EncoderDecoderConfig], ids=["ModelConfig", "EncoderDecoderConfig"])
@pytest.mark.parametrize("options, field, needle", [
    ({"theta": 1}, "encoding_options.theta", "must be one of rope's options ['attention_factor'"),
    ({"rope_interleave": "maybe"}, "encoding_options.rope_interleave", "must be true or false"),
    ({"rope_scaling": "linear"}, "encoding_options.rope_scaling", "must be a JSON object"),
])
def test_a_bad_encoding_option_is_refused_when_the_config_is_made_naming_the_field(make, options, field, needle):
    with pytest.raises(ConfigError) as e:
        make(encoding="rope", encoding_options=options)
    message = str(e.value)
    assert e.value.field == field and message.startswith(f"{field} ") and needle in message, message
    assert "\n" not in message


@pytest.mark.parametrize("make", [ModelConfig, EncoderDecoderConfig], ids=["ModelConfig", "EncoderDecoderConfig"])
def test_an_unknown_encoding_name_is_refused_naming_the_field_in_the_same_format(make):
    with pytest.raises(ConfigError, match=r"^encoding must be one of \[.*\], got 'rotary'$"):
        make(encoding="rotary")


def test_a_train_config_names_the_nested_field():
    with pytest.raises(ConfigError, match=r"^model\.encoding_options\.theta must be one of rope's options"):
        TrainConfig.from_dict({"model": {"encoding": "rope", "encoding_options": {"theta": 1}}})


@pytest.mark.parametrize("name, options", [("pope", {"softplus": "no"}), ("rope", {"base": 500}),
                                           ("sinusoidal", {}), ("cope", {"p_max": 6})])
def test_the_models_build_what_the_spec_builds(name, options):
    spec = EncodingSpec.from_config(name, options)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding=name,
                                    encoding_options=options))
    torch.manual_seed(0)
    typed = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding=name,
                                    encoding_options=spec.options))
    a, b = model.state_dict(), typed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    seq = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2,
                                              n_encoder_layers=1, n_decoder_layers=1, d_ff=32, encoding=name,
                                              encoding_options=options))
    assert seq.config.encoding_options == spec.options


# -- the ViT ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("given", ["rope:base=100", EncodingSpec.parse("rope:base=100")], ids=["text", "spec"])
def test_the_vit_takes_a_spec(given):
    vit = ViT(encoding=given, dim=16, heads=2)
    enc = vit.blocks[0].attn.encoding
    assert enc.name == "rope" and enc.base == 100.0 and enc.position_coords == 2
    assert vit(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_the_vit_with_a_plain_name_is_unchanged():
    torch.manual_seed(0)
    a = ViT(encoding="rope", dim=16, heads=2)
    torch.manual_seed(0)
    b = ViT(encoding=EncodingSpec.parse("rope"), dim=16, heads=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("given, needle", [
    ("rope:bogus=1", "encoding option rope:bogus must be one of rope's options"),
    ("rope:axial_dims=[4,4]", "axial_dims"),
    ("alibi", "encoding must be one of"),
    ("rotary", "encoding must be one of"),
])
def test_the_vit_refuses_a_bad_spec_in_one_line(given, needle):
    with pytest.raises(ValueError) as e:
        ViT(encoding=given, dim=16, heads=2)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


# -- RoPE's nullable flags and HF dicts in a spec ----------------------------------------------------------

@pytest.mark.parametrize("text, key, value", [
    ("rope-yarn:factor=4:original_max_positions=8:truncate=no", "truncate", False),
    ("rope-yarn:factor=4:original_max_positions=8:truncate=YES", "truncate", True),
    ("rope:rope_interleave=0", "rope_interleave", False),
    ("rope:rope_interleave=null", "rope_interleave", None),
])
def test_options_annotated_bool_or_none_are_bools(text, key, value):
    spec = EncodingSpec.parse(text)
    assert spec.options[key] is value
    spec.build(head_dim=8, num_heads=2)  # and build_encoding takes them


def test_a_nullable_bool_refuses_other_words():
    with pytest.raises(SpecError, match=r"encoding option rope:rope_interleave must be true or false .*or null "
                                        r".*got 'half'"):
        EncodingSpec.parse("rope:rope_interleave=half")


def test_rope_dict_options_are_json_objects_in_braces():
    spec = EncodingSpec.parse('rope-linear:rope_scaling={"rope_type":"linear","factor":2.0}')
    assert spec.options == {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert EncodingSpec.parse(spec.label) == spec
    enc = spec.build(head_dim=8, num_heads=2)
    direct = poskit.build_encoding("rope-linear", head_dim=8, num_heads=2, factor=2.0)
    assert torch.equal(enc.inv_freq, direct.inv_freq)
    for bad in ("rope:rope_scaling=linear", "rope:rope_parameters=[1,2]", "rope:rope_parameters=3"):
        with pytest.raises(SpecError, match=r"encoding option rope:rope_\w+ must be a JSON object in braces"):
            EncodingSpec.parse(bad, arg="--encoding")


def test_the_allowed_options_are_computed_in_one_place():
    assert spec_module.allowed_options("rope") == encodings_base.allowed_options("rope")
    for name in poskit.available_encodings():
        assert spec_module.allowed_options(name) == encodings_base.allowed_options(name)
        assert not {"head_dim", "num_heads", "dim"} & set(encodings_base.allowed_options(name))


def test_from_hf_gives_a_spec():
    spec = from_hf({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}, head_dim=8, rope_theta=500000.0)
    assert isinstance(spec, EncodingSpec) and spec.name == "rope-llama3"
    name, options = spec.to_config()
    assert options["base"] == 500000.0 and options["layout"] == "half" and options["original_max_positions"] == 64
    assert EncodingSpec.parse(spec.label) == spec
