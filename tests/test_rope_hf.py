"""Hugging Face's RoPE conventions in poskit (encodings/rope_hf.py, rotary.py): HF's option names and rope
dicts give the same encoding as poskit's names; two names for one option must agree; from_hf reads the rope
dicts of real configs; the yarn options HF knows; the half layout and the q/k weight conversion between layouts.
(The equality with HF's own functions is in tests/test_peers_hf_rope.py.)"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import poskit
from poskit.encodings.rope_hf import from_hf
from poskit.encodings.rotary import convert_qk_layout, layout_permutation
from conftest import make_qkv

D, H = 16, 2


def build(name, **options):
    return poskit.build_encoding(name, head_dim=D, num_heads=H, **options)


def same(a, b):
    assert torch.equal(a.inv_freq, b.inv_freq) and a.attention_factor == b.attention_factor
    assert (a.base, a.layout, a.rotary_dim, a.factor, a.original_max_positions) == (
        b.base, b.layout, b.rotary_dim, b.factor, b.original_max_positions)


YARN = dict(factor=4.0, original_max_positions=32)


@pytest.mark.parametrize("name, poskit_options, hf_options", [
    ("rope", dict(base=500000.0), dict(rope_theta=500000.0)),
    ("rope", dict(rotary_dim=8), dict(partial_rotary_factor=0.5)),
    ("rope", dict(layout="half"), dict(rope_interleave=False)),
    ("rope", dict(layout="interleaved"), dict(rope_interleave=True)),
    ("rope-yarn", YARN, dict(factor=4.0, original_max_position_embeddings=32)),
    ("rope-yarn", YARN, dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
    ("rope-yarn", YARN, dict(rope_parameters={"type": "yarn", "factor": 4, "original_max_position_embeddings": 32})),
    ("rope-yarn", dict(YARN, base=1e6), dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                                "original_max_position_embeddings": 32})),
    # HF's yarn without factor: max_position_embeddings / original_max_position_embeddings
    ("rope-yarn", YARN, dict(max_position_embeddings=128, original_max_position_embeddings=32)),
    # HF's dynamic NTK grows the base past max_position_embeddings
    ("rope-dynamic", dict(factor=2.0, original_max_positions=16), dict(factor=2.0, max_position_embeddings=16)),
    ("rope-llama3", dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=64),
     dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 64})),
    # plain rope ignores max_position_embeddings, as HF's default rope does
    ("rope", dict(), dict(max_position_embeddings=4096)),
])
def test_hf_names_build_the_same_encoding(name, poskit_options, hf_options):
    same(build(name, **hf_options), build(name, **poskit_options))


def test_a_name_given_twice_with_one_value_is_accepted():
    same(build("rope", base=500000.0, rope_theta=500000), build("rope", base=500000.0))
    same(build("rope-yarn", **YARN, rope_scaling={"rope_type": "yarn", "factor": 4.0}), build("rope-yarn", **YARN))


@pytest.mark.parametrize("name, options, message", [
    ("rope", dict(base=100.0, rope_theta=200.0), r"base=100.0 and rope_theta=200.0 both set base and disagree"),
    ("rope", dict(rotary_dim=8, partial_rotary_factor=0.25), r"rotary_dim=8 and partial_rotary_factor=0.25"),
    ("rope", dict(layout="interleaved", rope_interleave=False), r"layout='interleaved' and rope_interleave=False"),
    ("rope-yarn", dict(factor=4.0, original_max_positions=32, original_max_position_embeddings=64),
     r"original_max_positions=32 and original_max_position_embeddings=64"),
    ("rope-yarn", dict(factor=2.0, original_max_positions=32, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
     r"factor=2.0 and rope_parameters\['factor'\]=4.0"),
    ("rope-yarn", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                       rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}),
     r"rope_parameters and rope_scaling .* disagree"),
    ("rope-dynamic", dict(factor=2.0, original_max_positions=16, max_position_embeddings=32),
     r"original_max_positions=16 and max_position_embeddings=32"),
    ("rope", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), r"names poskit's encoding 'rope-yarn', not 'rope'"),
    ("rope-yarn", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "mrope_section": [2, 2]}),
     r"rope_scaling: unknown key\(s\) \['mrope_section'\]"),
    ("rope-yarn", dict(rope_scaling={"rope_type": "proportional"}), r"rope_scaling\['rope_type'\] must be one of"),
    ("rope-yarn", dict(rope_scaling={"rope_type": "yarn", "type": "linear"}), r"\['rope_type'\]='yarn' and .*\['type'\]='linear'"),
    ("rope-yarn", dict(rope_scaling=[("factor", 2)]), r"rope_scaling must be a dict"),
    ("rope", dict(rope_theta=0.5), r"rope_theta must be a finite number > 1"),
    ("rope", dict(rope_parameters={"rope_theta": "x"}), r"rope_parameters\['rope_theta'\] must be a finite number > 1"),
    ("rope-yarn", dict(factor=0.5, original_max_position_embeddings=32), r"factor must be a finite number >= 1"),
    ("rope-yarn", dict(rope_parameters={"factor": 0.5, "original_max_position_embeddings": 32}),
     r"rope_parameters\['factor'\] must be a finite number >= 1"),
    ("rope", dict(partial_rotary_factor=0.2), r"partial_rotary_factor=0.2 rotates int\(head_dim \* 0.2\) = 3"),
    ("rope", dict(partial_rotary_factor=1.5), r"partial_rotary_factor must be a finite number in \(0, 1\]"),
    ("rope", dict(rope_interleave="no"), r"rope_interleave must be true or false"),
    ("rope-yarn", dict(YARN, mscale=0.7), r"mscale and mscale_all_dim go together"),
    ("rope-yarn", dict(YARN, attention_factor=1.2, mscale=1.0, mscale_all_dim=1.0), r"attention_factor and mscale"),
    ("rope-yarn", dict(YARN, beta_fast=1.0, beta_slow=2.0), r"beta_fast must be > beta_slow"),
    ("rope-yarn", dict(YARN, beta_fast=-3.0), r"beta_fast must be a finite number > 0"),
    ("rope-yarn", dict(YARN, truncate="yes"), r"truncate must be true or false"),
    ("rope-linear", dict(factor=2.0, beta_fast=16.0), r"beta_fast applies only to rope-yarn, not to rope-linear"),
])
def test_bad_or_conflicting_hf_options_name_the_keys(name, options, message):
    with pytest.raises(ValueError, match=message):
        build(name, **options)


def test_missing_options_counted_after_hf_names():
    # the dict names the variant but holds neither factor nor a length: both are listed as missing, in one error
    with pytest.raises(ValueError, match=r"has no default for 2 option\(s\) \['factor', 'original_max_positions'\]"):
        build("rope-yarn", rope_parameters={"rope_type": "yarn"})
    # given under HF names they are not missing
    build("rope-yarn", rope_parameters={"factor": 2.0}, original_max_position_embeddings=16)


def test_yarn_options_change_what_they_should():
    # a context long enough for the ramp ends to fall inside the dims (32 rotations in 2048 positions)
    long = dict(factor=4.0, original_max_positions=2048)
    plain = build("rope-yarn", **long)
    assert build("rope-yarn", **long, beta_fast=32.0, beta_slow=1.0, truncate=True).inv_freq.equal(plain.inv_freq)
    assert not build("rope-yarn", **long, beta_fast=8.0).inv_freq.equal(plain.inv_freq)
    assert not build("rope-yarn", **long, truncate=False).inv_freq.equal(plain.inv_freq)
    assert build("rope-yarn", **YARN, attention_factor=1.5).attention_factor == 1.5
    s = 4.0
    assert build("rope-yarn", **YARN, mscale=0.707, mscale_all_dim=1.0).attention_factor == pytest.approx(
        (0.1 * 0.707 * math.log(s) + 1) / (0.1 * math.log(s) + 1), rel=1e-15)
    assert build("rope-yarn", **YARN, mscale=1.0, mscale_all_dim=1.0).attention_factor == 1.0  # DeepSeek-V3


LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
           "rope_type": "llama3"}
PHI3_SHORT, PHI3_LONG = [1.0] * 8, [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0]


@pytest.mark.parametrize("table, fields, name, want", [
    (LLAMA31, dict(rope_theta=500000.0), "rope-llama3",
     dict(base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)),
    ({**LLAMA31, "rope_theta": 500000.0}, {}, "rope-llama3",  # transformers 5 keeps rope_theta in the dict
     dict(base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, dict(rope_theta=1e6), "rope-yarn",
     dict(base=1e6, factor=4.0, original_max_positions=32768)),  # Qwen2.5
    ({"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
      "original_max_position_embeddings": 4096}, dict(rope_theta=10000.0), "rope-yarn",  # DeepSeek-V3
     dict(base=10000.0, factor=40, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0,
          original_max_positions=4096)),
    ({"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},  # Phi-3: the lengths beside it
     dict(original_max_position_embeddings=4096, max_position_embeddings=131072), "rope-longrope",
     dict(base=10000.0, short_factor=PHI3_SHORT, long_factor=PHI3_LONG, original_max_positions=4096, factor=32.0)),
    ({"type": "su", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG, "original_max_position_embeddings": 4096,
      "factor": 32.0}, {}, "rope-longrope",
     dict(base=10000.0, short_factor=PHI3_SHORT, long_factor=PHI3_LONG, original_max_positions=4096, factor=32.0)),
    ({"type": "dynamic", "factor": 2.0}, dict(max_position_embeddings=2048), "rope-dynamic",
     dict(base=10000.0, factor=2.0, original_max_positions=2048)),
    ({"type": "linear", "factor": 2.0}, {}, "rope-linear", dict(base=10000.0, factor=2.0)),
    (None, dict(rope_theta=1e4, partial_rotary_factor=0.5), "rope", dict(base=1e4, rotary_dim=8)),
])
def test_from_hf_reads_the_dicts_of_real_configs(table, fields, name, want):
    spec = from_hf(table, head_dim=D, **fields)
    got_name, options = spec.to_config()
    assert got_name == name
    assert options == dict(want, layout="half")
    poskit.build_encoding(got_name, head_dim=D, num_heads=H, **options)  # and they build
    spec.build(head_dim=D, num_heads=H)


def test_from_hf_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['mrope_section'\]"):
        from_hf({"rope_type": "default", "mrope_section": [4, 4]}, head_dim=D)
    with pytest.raises(ValueError, match=r"rope_type'\] must be one of .* got 'proportional'"):
        from_hf({"rope_type": "proportional"}, head_dim=D)
    with pytest.raises(ValueError, match=r"need max_position_embeddings"):
        from_hf({"rope_type": "dynamic", "factor": 2.0}, head_dim=D)


# -- the half layout and the conversion of q/k projection weights between layouts ------------------------------

def test_half_layout_pairs_channel_i_with_i_plus_half():
    enc = build("rope", layout="half", rotary_dim=8).double()
    x = torch.zeros(1, 1, 1, D, dtype=torch.float64)
    x[..., 1] = 1.0  # pair 1 is (1, 5) in the half layout: position 3 moves channel 1 into channel 5 only
    out = enc.encode_k(x, torch.tensor([[3]]))
    angle = 3 * enc.inv_freq[1].item()
    assert out[..., 1].item() == pytest.approx(math.cos(angle)) and out[..., 5].item() == pytest.approx(math.sin(angle))
    assert torch.count_nonzero(out).item() == 2


@settings(max_examples=25, deadline=None)
@given(heads=st.integers(1, 3), pairs=st.integers(1, 4), extra=st.integers(0, 2).map(lambda n: 2 * n),
       src=st.sampled_from(["interleaved", "half"]))
def test_layout_conversion_round_trips_and_is_a_permutation(heads, pairs, extra, src):
    rd, hd = 2 * pairs, 2 * pairs + extra
    dst = "half" if src == "interleaved" else "interleaved"
    w = torch.randn(heads * hd, 5, dtype=torch.float64)
    there = convert_qk_layout(w, head_dim=hd, src=src, dst=dst, rotary_dim=rd)
    assert torch.equal(convert_qk_layout(there, head_dim=hd, src=dst, dst=src, rotary_dim=rd), w)
    assert sorted(layout_permutation(hd, src, dst, rd).tolist()) == list(range(hd))
    assert torch.equal(there[:, :].view(heads, hd, 5)[:, rd:], w.view(heads, hd, 5)[:, rd:])  # passed channels stay


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_logits_of_a_layer_equal_after_converting_its_q_k_weights(rotary_dim):
    # one attention layer: x -> q = x Wq^T, k = x Wk^T (+ biases), rope in the interleaved layout; the same layer
    # with Wq, Wk, bq, bk converted and rope in the half layout gives the same logits
    g = torch.Generator().manual_seed(0)
    T, width, Hkv = 9, 24, 1
    x = torch.randn(2, T, width, generator=g, dtype=torch.float64)
    wq, wk = torch.randn(H * D, width, generator=g, dtype=torch.float64), torch.randn(Hkv * D, width, generator=g, dtype=torch.float64)
    bq, bk = torch.randn(H * D, generator=g, dtype=torch.float64), torch.randn(Hkv * D, generator=g, dtype=torch.float64)

    def logits(layout, wq, wk, bq, bk):
        enc = build("rope", layout=layout, rotary_dim=rotary_dim).double()
        q = (x @ wq.T + bq).view(2, T, H, D).transpose(1, 2)
        k = (x @ wk.T + bk).view(2, T, Hkv, D).transpose(1, 2)
        return poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True)

    conv = dict(head_dim=D, src="interleaved", dst="half", rotary_dim=rotary_dim)
    want = logits("interleaved", wq, wk, bq, bk)
    got = logits("half", *(convert_qk_layout(t, **conv) for t in (wq, wk, bq, bk)))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # and the conversion matters: the unconverted weights in the half layout give other logits
    assert not torch.allclose(logits("half", wq, wk, bq, bk), want)


@pytest.mark.parametrize("kwargs, message", [
    (dict(weight=torch.zeros(10, 3), head_dim=4, src="interleaved", dst="half"), r"weight must be a \(num_heads \* 4"),
    (dict(weight=torch.zeros(8, 3), head_dim=4, src="interleaved", dst="rotate"), r"dst must be one of"),
    (dict(weight=torch.zeros(8, 3), head_dim=4, src="half", dst="interleaved", rotary_dim=3), r"rotary_dim must be an even"),
])
def test_bad_conversion_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        convert_qk_layout(**kwargs)


def test_default_layout_is_still_interleaved():
    enc = build("rope")
    assert enc.layout == "interleaved" and enc.base == 10000.0
    q, k, _ = make_qkv(H=H, Hkv=H, D=D)
    half = build("rope", layout="half").double()
    assert not torch.allclose(poskit.attention_scores(q, k, enc.double()), poskit.attention_scores(q, k, half))
