"""Options without a paper default (a scaled RoPE's factor and training length, an absolute encoding's model
width): build_encoding names every missing one in one error, with an example call that works."""
import re

import pytest

import poskit
from poskit.models import ModelConfig, Transformer

MISSING = {
    "rope-linear": ["factor"],
    "rope-ntk": ["factor"],
    "rope-dynamic": ["factor", "original_max_positions"],
    "rope-yarn": ["factor", "original_max_positions"],
    "rope-llama3": ["factor", "original_max_positions", "low_freq_factor", "high_freq_factor"],
    "rope-longrope": ["original_max_positions", "short_factor", "long_factor", "factor|attention_factor"],
    "sinusoidal": ["dim"],
    "learned": ["dim"],
    "legendre": ["dim"],
}


def _example_call(message: str) -> str:
    match = re.search(r"for example: (poskit\.build_encoding\(.*\))$", message, re.M)
    assert match, f"no example call in: {message}"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(MISSING))
def test_one_error_lists_every_missing_option_and_its_example_builds(name):
    with pytest.raises(ValueError) as info:
        poskit.build_encoding(name, head_dim=16, num_heads=2)
    message = str(info.value)
    listed = re.search(r"option\(s\) (\[.*?\])", message).group(1)
    assert listed == repr(MISSING[name])
    for option in MISSING[name]:
        first, *others = option.split("|")
        line = rf"^\s+needs {first} \(must .*\) or {others[0]} \(must .*\)" if others else rf"^\s+{first}\b.* must be "
        assert re.search(line, message, re.M), f"{option} is not explained"
    enc = eval(_example_call(message), {"poskit": poskit})  # the example in the message really builds
    assert enc.name == name


def test_given_options_are_kept_in_the_example_and_only_the_missing_ones_listed():
    with pytest.raises(ValueError) as info:
        poskit.build_encoding("rope-yarn", head_dim=16, num_heads=2, factor=8.0, base=500.0)
    message = str(info.value)
    assert "option(s) ['original_max_positions']" in message
    call = _example_call(message)
    assert "factor=8.0" in call and "base=500.0" in call
    enc = eval(call, {"poskit": poskit})
    assert (enc.factor, enc.base, enc.original_max_positions) == (8.0, 500.0, 2048)


def test_variants_with_every_option_given_build_and_plain_rope_needs_none():
    assert poskit.build_encoding("rope", head_dim=16, num_heads=2).factor is None
    enc = poskit.build_encoding("rope-yarn", head_dim=16, num_heads=2, factor=4.0, original_max_positions=64)
    assert enc.attention_factor == pytest.approx(0.1 * __import__("math").log(4.0) + 1)


def test_a_model_reports_every_missing_option_at_once():
    with pytest.raises(ValueError) as info:
        Transformer(ModelConfig(vocab_size=10, d_model=32, n_layers=1, n_heads=2, encoding="rope-dynamic"))
    assert "factor" in str(info.value) and "original_max_positions" in str(info.value)
