"""poskit's RoPE scalings against HF transformers' `modeling_rope_utils.ROPE_INIT_FUNCTIONS` (extra `poskit[peers]`).

For linear, dynamic, yarn, llama3 and longrope: the inverse frequencies and the attention factor, then the
float64 logits through HF's `apply_rotary_pos_emb` ("half" layout, cos/sin = cat(freqs, freqs).cos() times the
attention factor, as HF's rotary modules build them). poskit's `original_max_positions` is HF's
`original_max_position_embeddings`, except for dynamic, where HF reads `max_position_embeddings`.
Differences, asserted below: HF computes the frequencies in float32 (equal to poskit's float64 at float32
rounding); the logits are compared in float64 with poskit's frequencies in HF's cos/sin.
"""
import math

import pytest
import torch
from extras import need

need("transformers", "peers")
from transformers import PretrainedConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402

import poskit  # noqa: E402
from peer_checks import FLOAT32_RTOL, assert_visible_close, poskit_logits, rand  # noqa: E402

D, H = 16, 2
LONG = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7]

# (poskit name, poskit options, HF rope_parameters without rope_type/rope_theta, HF max_position_embeddings)
CASES = {
    "linear": ("rope-linear", dict(factor=4.0), dict(factor=4.0), 64),
    "dynamic": ("rope-dynamic", dict(factor=4.0, original_max_positions=16), dict(factor=4.0), 16),
    "yarn": ("rope-yarn", dict(factor=4.0, original_max_positions=32),
             dict(factor=4.0, original_max_position_embeddings=32), 128),
    "llama3": ("rope-llama3", dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=64),
               dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64), 512),
    "longrope": ("rope-longrope", dict(short_factor=SHORT, long_factor=LONG, factor=4.0, original_max_positions=16),
                 dict(short_factor=SHORT, long_factor=LONG, factor=4.0, original_max_position_embeddings=16), 64),
}
BASE = 10000.0


def hf_init(variant, seq_len=None):
    _, _, params, max_positions = CASES[variant]
    config = PretrainedConfig(hidden_size=D * H, num_attention_heads=H, head_dim=D, max_position_embeddings=max_positions,
                              rope_parameters=dict(rope_type=variant, rope_theta=BASE, **params))
    return ROPE_INIT_FUNCTIONS[variant](config, "cpu", seq_len=seq_len)


def build(variant):
    name, options, _, _ = CASES[variant]
    return poskit.build_encoding(name, head_dim=D, num_heads=H, layout="half", base=BASE, **options).double()


# seq_len None is construction; dynamic and longrope change beyond their original context (16)
@pytest.mark.parametrize("variant, seq_len", [("linear", None), ("dynamic", 12), ("dynamic", 40), ("yarn", None),
                                              ("llama3", None), ("longrope", None), ("longrope", 16), ("longrope", 17)])
def test_frequencies_and_attention_factor_match(variant, seq_len):
    enc = build(variant)
    theirs, their_factor = hf_init(variant, seq_len)
    assert theirs.dtype == torch.float32
    ours = enc.inv_freq if seq_len is None else enc.inv_freq_for(seq_len)
    torch.testing.assert_close(theirs.double(), ours, rtol=FLOAT32_RTOL, atol=0)
    assert enc.attention_factor == pytest.approx(their_factor, rel=1e-15)


def test_the_cases_exercise_every_branch():
    # llama3: some frequencies kept, some divided by the factor, some blended; longrope: long != short
    plain = build("llama3").inv_freq / poskit.build_encoding("rope", head_dim=D, num_heads=H).inv_freq
    assert (plain == 1).any() and (plain == 1 / 8).any() and ((plain > 1 / 8) & (plain < 1)).any()
    enc = build("longrope")
    assert not torch.equal(enc.inv_freq_for(16), enc.inv_freq_for(17))
    assert enc.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)), rel=1e-15)


def hf_logits(q, k, inv_freq, attention_factor, positions):
    freqs = positions.double()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_factor, emb.sin() * attention_factor
    rq, rk = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    return (rq @ rk.transpose(-1, -2)) * D**-0.5


@pytest.mark.parametrize("variant, T", [("linear", 20), ("dynamic", 40), ("yarn", 40), ("llama3", 40),
                                         ("longrope", 16), ("longrope", 24)])
def test_logits_through_hf_apply_rotary_pos_emb(variant, T):
    enc = build(variant)
    _, attention_factor = hf_init(variant, T)
    q, k = rand(2, H, T, D, seed=0), rand(2, H, T, D, seed=1)
    want = hf_logits(q, k, enc.inv_freq_for(T), attention_factor, torch.arange(T))
    assert_visible_close(poskit_logits(q, k, enc), want)
