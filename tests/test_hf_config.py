"""PoskitConfig: every ModelConfig field under a Hugging Face name, validation naming the HF field, round trips."""
import dataclasses

import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: one thread is faster on a busy machine

import poskit  # noqa: E402
from conftest import ENCODING_OPTIONS  # noqa: E402
from poskit.hf import PoskitConfig  # noqa: E402
from poskit.hf.config import MODEL_FIELDS, mlp_width  # noqa: E402
from poskit.models import ModelConfig, Transformer  # noqa: E402


def test_every_model_config_field_has_a_hugging_face_name():
    assert sorted(MODEL_FIELDS.values()) == sorted(f.name for f in dataclasses.fields(ModelConfig))
    hf_fields = {f.name for f in dataclasses.fields(PoskitConfig)}
    assert set(MODEL_FIELDS) <= hf_fields


def test_defaults_are_poskit_defaults_written_out():
    cfg = PoskitConfig()
    mc = cfg.to_model_config()
    ref = ModelConfig()
    assert mlp_width(mc) == mlp_width(ref) == cfg.intermediate_size
    assert dataclasses.replace(mc, mlp_ratio=ref.mlp_ratio, n_kv_heads=None, head_dim=None) == ref
    assert cfg.num_key_value_heads == cfg.num_attention_heads and cfg.head_dim == cfg.hidden_size // cfg.num_attention_heads


@pytest.mark.parametrize("encoding", poskit.available_encodings())
@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_model_config_round_trip_builds_the_same_model(encoding, mlp):
    mc = ModelConfig(vocab_size=33, d_model=24, n_layers=1, n_heads=4, n_kv_heads=2, mlp=mlp, mlp_ratio=2.7,
                     encoding=encoding, encoding_options=dict(ENCODING_OPTIONS.get(encoding, {})), tie_embeddings=True,
                     bias=True, norm_eps=1e-5, init_std=0.03, dropout=0.1)
    back = PoskitConfig.from_model_config(mc).to_model_config()
    # mlp_ratio is re-derived from the width, and the defaults of head_dim / n_kv_heads are written out (as
    # Hugging Face configs do): equal widths and sizes, every other field identical
    assert mlp_width(back) == mlp_width(mc)
    assert (back.dim_head, back.kv_heads) == (mc.dim_head, mc.kv_heads)
    assert dataclasses.replace(back, mlp_ratio=mc.mlp_ratio, head_dim=mc.head_dim, n_kv_heads=mc.n_kv_heads) == mc
    a, b = Transformer(mc), Transformer(back)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}


@pytest.mark.parametrize("hidden_act, width, d", [("gelu", 1, 8), ("gelu", 37, 24), ("silu", 1, 8), ("silu", 86, 32),
                                                  ("silu", 11008, 4096), ("gelu", 3072, 768)])
def test_intermediate_size_is_the_built_mlp_width(hidden_act, width, d):
    cfg = PoskitConfig(hidden_size=d, num_attention_heads=4, intermediate_size=width, hidden_act=hidden_act)
    with torch.device("meta"):
        mlp = Transformer(cfg.to_model_config()).blocks[0].mlp
    assert mlp.w1.out_features == width and mlp.w2.in_features == width


@pytest.mark.parametrize("field, value", [
    ("hidden_size", 0), ("num_hidden_layers", 0), ("num_attention_heads", -1), ("num_key_value_heads", 3),
    ("hidden_act", "relu"), ("intermediate_size", 0), ("position_encoding", "nope"), ("rms_norm_eps", 0.0),
    ("hidden_dropout", 1.0), ("initializer_range", -1.0), ("vocab_size", 0), ("max_position_embeddings", 0),
    ("tie_word_embeddings", "yes"), ("head_dim", 0)])
def test_bad_values_are_refused_naming_the_hugging_face_field(field, value):
    with pytest.raises((ValueError, TypeError)) as e:
        PoskitConfig(**{field: value})
    assert field in str(e.value)


def test_unknown_field_is_refused_listing_the_fields():
    with pytest.raises(ValueError, match=r"unknown PoskitConfig field\(s\) \['n_layers'\].*num_hidden_layers"):
        PoskitConfig(n_layers=3)


def test_encoding_options_are_checked_with_the_config():
    with pytest.raises(ValueError, match="position_encoding_options.*rope-linear.*factor"):
        PoskitConfig(position_encoding="rope-linear")
    with pytest.raises(ValueError, match="position_encoding_options.*bogus"):
        PoskitConfig(position_encoding="rope", position_encoding_options={"bogus": 1})


def test_config_json_round_trip(tmp_path):
    cfg = PoskitConfig(position_encoding="rope-yarn", position_encoding_options={"factor": 4.0, "original_max_positions": 8},
                       hidden_size=48, num_attention_heads=6, num_key_value_heads=3, hidden_act="silu",
                       intermediate_size=100, max_position_embeddings=128, eos_token_id=2)
    cfg.save_pretrained(tmp_path)
    back = PoskitConfig.from_pretrained(tmp_path)
    assert back.to_model_config() == cfg.to_model_config()
    assert (back.max_position_embeddings, back.eos_token_id, back.intermediate_size) == (128, 2, 100)


def test_a_bidirectional_config_is_refused_by_the_causal_lm():
    from poskit.hf import PoskitForCausalLM

    cfg = PoskitConfig(vocab_size=11, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, is_causal=False)
    assert cfg.to_model_config().causal is False
    with pytest.raises(ValueError, match="is_causal"):
        PoskitForCausalLM(cfg)
    with pytest.raises(ValueError, match="attention_type"):
        PoskitConfig(attention_type="sparse")


# -- position_encoding through EncodingSpec ---------------------------------------------------------------------

def test_position_encoding_takes_spec_text():
    cfg = PoskitConfig(position_encoding="pope:delta_init=uniform:softplus=no", hidden_size=16,
                       num_attention_heads=2)
    assert cfg.position_encoding == "pope"
    assert cfg.position_encoding_options == {"delta_init": "uniform", "softplus": False}
    mc = cfg.to_model_config()
    assert (mc.encoding, mc.encoding_options) == ("pope", {"delta_init": "uniform", "softplus": False})


def test_spec_text_and_options_that_disagree_are_refused_naming_both():
    with pytest.raises(ValueError, match=r"position_encoding 'rope:base=500' sets base=500 and "
                                         r"position_encoding_options\['base'\]=100"):
        PoskitConfig(position_encoding="rope:base=500", position_encoding_options={"base": 100})
    cfg = PoskitConfig(position_encoding="rope:base=500", position_encoding_options={"base": 500})
    assert cfg.position_encoding_options == {"base": 500}


@pytest.mark.parametrize("value, needle", [
    ("rope:bogus=1", "position_encoding: encoding option rope:bogus must be one of rope's options"),
    ("rope:base=1:base=2", "position_encoding: encoding option rope:base must be given once"),
])
def test_bad_spec_text_is_one_line_naming_position_encoding(value, needle):
    with pytest.raises(ValueError) as e:
        PoskitConfig(position_encoding=value)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_encoding_options_are_typed_by_the_one_bool_rule_and_named_by_the_hf_field():
    assert PoskitConfig(position_encoding="pope", position_encoding_options={"softplus": "no"}
                        ).position_encoding_options == {"softplus": False}
    with pytest.raises(ValueError, match=r"^position_encoding_options\.softplus must be true or false"):
        PoskitConfig(position_encoding="pope", position_encoding_options={"softplus": "maybe"})
