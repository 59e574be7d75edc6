"""Test-time RoPE scalings of `poskit extrapolate --rope-scaling`: one table (encodings/rope_scaling.py's), every
variant swapped into a trained RoPE model, and the options each is given."""
import pytest
import torch

import poskit
from poskit.encodings import rope_scaling
from poskit.evaluate import ROPE_SCALINGS, with_rope_scaling
from poskit.evaluate.extrapolation import scaling_options as options_at
from poskit.models import ModelConfig, Transformer


def test_every_scaling_rope_has_is_offered():
    assert set(ROPE_SCALINGS) == set(rope_scaling.ROPE_INIT_FUNCTIONS) - {"none"}
    assert {"llama3", "longrope"} <= set(ROPE_SCALINGS)
    assert all(poskit.encodings.base.encoding_class(name) is poskit.encodings.base.encoding_class("rope")
               for name in ROPE_SCALINGS.values())


@pytest.mark.parametrize("scaling", sorted(ROPE_SCALINGS))
def test_each_scaling_swaps_into_a_rope_model_and_keeps_its_weights(scaling):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, d_model=32, n_layers=2, n_heads=4, encoding="rope",
                                    encoding_options={"base": 500.0})).eval()
    scaled = with_rope_scaling(model, scaling, factor=4.0, original_max_positions=16)
    for block, old in zip(scaled.blocks, model.blocks):
        enc = block.attn.encoding
        assert enc.name == ROPE_SCALINGS[scaling] and enc.scaling == scaling and enc.factor == 4.0
        assert (enc.base, enc.layout, enc.rotary_dim) == (500.0, old.attn.encoding.layout, old.attn.encoding.rotary_dim)
    for (name, a), (_, b) in zip(model.state_dict().items(), scaled.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.randint(0, 11, (1, 64))
    assert torch.isfinite(scaled(ids)).all()
    # past the training context the scaled model computes something else than the model as trained
    assert not torch.allclose(scaled(ids), model(ids))


def test_llama3_and_longrope_options():
    llama3 = options_at("llama3", 8.0, 64, 16, 10000.0)
    assert llama3 == dict(factor=8.0, original_max_positions=64, low_freq_factor=1.0, high_freq_factor=4.0)
    longrope = options_at("longrope", 8.0, 2048, 16, 10000.0)
    assert longrope["short_factor"] == [1.0] * 8 and longrope["original_max_positions"] == 2048
    long = longrope["long_factor"]
    # YaRN's divisors: the highest frequencies kept (1), the lowest interpolated by the factor, none outside [1, 8]
    assert long[0] == 1.0 and long[-1] == pytest.approx(8.0) and all(1.0 <= f <= 8.0 + 1e-12 for f in long)
    assert long == sorted(long)
    yarn = poskit.build_encoding("rope-yarn", head_dim=16, num_heads=1, factor=8.0, original_max_positions=2048)
    enc = poskit.build_encoding("rope-longrope", head_dim=16, num_heads=1, **longrope)
    torch.testing.assert_close(enc.inv_freq_for(4096), yarn.inv_freq, rtol=1e-15, atol=0)
    # the plain variants get no options of others
    assert options_at("linear", 2.0, 64, 16, 10000.0) == {"factor": 2.0}
    assert options_at("yarn", 2.0, 64, 16, 10000.0) == {"factor": 2.0, "original_max_positions": 64}


# -- dispatch on what the encoding declares, not on its name -------------------------------------------------------

def test_an_encoding_registered_under_another_name_that_declares_the_scalings_is_scaled():
    from poskit.encodings.base import register, unregister
    from poskit.encodings.rotary import RotaryEncoding

    class MyRope(RotaryEncoding):
        """A user's RoPE registered under its own name."""

    register("my-rope-for-scaling", scaling="none")(MyRope)
    try:
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=11, d_model=32, n_layers=1, n_heads=4,
                                        encoding="my-rope-for-scaling")).eval()
        assert "yarn" in model.blocks[0].attn.encoding.test_time_scalings
        scaled = with_rope_scaling(model, "yarn", factor=4.0, original_max_positions=16)
        assert scaled.blocks[0].attn.encoding.scaling == "yarn" and scaled.blocks[0].attn.encoding.factor == 4.0
    finally:
        unregister("my-rope-for-scaling")


@pytest.mark.parametrize("encoding, options", [("alibi", {}), ("pope", {}), ("rope-linear", {"factor": 2.0})])
def test_an_encoding_that_declares_no_test_time_scaling_is_refused_naming_it(encoding, options):
    model = Transformer(ModelConfig(vocab_size=11, d_model=32, n_layers=1, n_heads=4, encoding=encoding,
                                    encoding_options=options))
    assert model.blocks[0].attn.encoding.test_time_scalings == ()
    with pytest.raises(ValueError, match=rf"^test-time rope scaling 'ntk' needs a model whose encoding takes it "
                                         rf"\(plain rope\); encoding {encoding!r} takes none$"):
        with_rope_scaling(model, "ntk", factor=2.0, original_max_positions=16)
