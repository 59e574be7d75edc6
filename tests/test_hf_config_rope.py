"""PoskitConfig takes Hugging Face's RoPE fields as Llama's config does (rope_theta, rope_parameters /
rope_scaling, partial_rotary_factor, original_max_position_embeddings, rope_interleave), stores them as poskit's
rope options, and refuses two fields that disagree, naming both."""
import json

import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")

import poskit  # noqa: E402
from poskit.hf import PoskitConfig, PoskitForCausalLM  # noqa: E402

SMALL = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, vocab_size=20)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


@pytest.mark.parametrize("fields, encoding, options", [
    (dict(rope_theta=500000.0), "rope", {"base": 500000.0}),
    (dict(rope_parameters=dict(YARN, rope_theta=1e6)), "rope-yarn",
     {"base": 1e6, "factor": 4.0, "original_max_positions": 32}),
    (dict(rope_scaling=YARN, rope_theta=1e6), "rope-yarn", {"base": 1e6, "factor": 4.0, "original_max_positions": 32}),
    (dict(position_encoding="rope-yarn", rope_scaling={"type": "yarn", "factor": 4.0},
          original_max_position_embeddings=32), "rope-yarn", {"factor": 4.0, "original_max_positions": 32}),
    (dict(partial_rotary_factor=0.5, rope_interleave=False), "rope", {"rotary_dim": 4, "layout": "half"}),
    (dict(position_encoding_options={"rope_theta": 1000.0}), "rope", {"base": 1000.0}),
])
def test_hf_rope_fields_become_poskit_options(fields, encoding, options, tmp_path):
    config = PoskitConfig(**SMALL, **fields)
    assert config.position_encoding == encoding and config.position_encoding_options == options
    # and they are what the model builds, saved and loaded as poskit's options
    enc = PoskitForCausalLM(config).model.blocks[0].attn.encoding
    want = poskit.build_encoding(encoding, head_dim=8, num_heads=4, **options)
    assert torch.equal(enc.inv_freq, want.inv_freq) and enc.attention_factor == want.attention_factor
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["position_encoding_options"] == options and "rope_theta" not in saved
    assert PoskitConfig.from_pretrained(tmp_path).position_encoding_options == options


@pytest.mark.parametrize("fields, message", [
    (dict(rope_theta=100.0, position_encoding_options={"base": 200.0}), r"base=200.0 and rope_theta=100.0"),
    (dict(rope_theta=100.0, position_encoding_options={"rope_theta": 200.0}),
     r"rope_theta=100.0 and position_encoding_options\['rope_theta'\]=200.0 disagree"),
    (dict(position_encoding="rope-linear", rope_parameters=YARN), r"names poskit's encoding 'rope-yarn', not 'rope-linear'"),
    (dict(position_encoding="pope", rope_theta=1000.0), r"rope_theta is a RoPE field; position_encoding 'pope'"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "bogus": 1}), r"unknown key\(s\) \['bogus'\]"),
])
def test_conflicting_or_misplaced_hf_rope_fields_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        PoskitConfig(**SMALL, **fields)
