"""rope-llama3 and rope-longrope (HF transformers' rope types) against their formulas written out in float64.

llama3 (Llama 3.1): wavelength lambda_i = 2 pi / theta_i; lambda_i < L / high_freq_factor keeps theta_i,
lambda_i > L / low_freq_factor gives theta_i / factor, and in between (1 - g) theta_i / factor + g theta_i with
g = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor). longrope: theta_i / lambda_i with
lambda = long_factor beyond original_max_positions, short_factor otherwise; cos and sin times
sqrt(1 + ln(factor) / ln(original_max_positions)) unless attention_factor is given.
"""
import math

import pytest
import torch

import poskit
from poskit.attention import KVCache, cached_attention
from conftest import make_qkv


def theta(d, base):
    return [base ** (-2 * i / d) for i in range(d // 2)]


def llama3_reference(d, base, factor, low, high, original):
    out = []
    for t in theta(d, base):
        wavelength = 2 * math.pi / t
        if wavelength < original / high:
            out.append(t)
        elif wavelength > original / low:
            out.append(t / factor)
        else:
            g = (original / wavelength - low) / (high - low)
            out.append((1 - g) * t / factor + g * t)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("d, base, factor, low, high, original", [
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),  # Llama 3.1's published values
    (64, 10000.0, 32.0, 1.0, 4.0, 8192),   # Llama 3.2's factor
    (16, 10000.0, 4.0, 2.0, 3.0, 256),
])
def test_llama3_frequencies_are_the_formula(d, base, factor, low, high, original):
    enc = poskit.build_encoding("rope-llama3", head_dim=d, num_heads=1, base=base, factor=factor, low_freq_factor=low,
                                high_freq_factor=high, original_max_positions=original)
    torch.testing.assert_close(enc.inv_freq, llama3_reference(d, base, factor, low, high, original), rtol=1e-14, atol=0)
    assert enc.attention_factor == 1.0 and not enc.length_dependent


def test_llama3_logits_are_rope_with_those_frequencies():
    # the whole logit, not just the table: rope-llama3 equals plain rope given the formula's frequencies
    opts = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=32)
    enc = poskit.build_encoding("rope-llama3", head_dim=16, num_heads=4, **opts).double()
    plain = poskit.build_encoding("rope", head_dim=16, num_heads=4).double()
    plain.inv_freq.copy_(llama3_reference(16, 10000.0, 8.0, 1.0, 4.0, 32))
    q, k, _ = make_qkv(Tq=40, Tk=40)
    torch.testing.assert_close(poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True), poskit.attention_scores(q, k, plain, is_causal=True, enable_gqa=True), rtol=0, atol=1e-12)


SHORT, LONG = [1.0, 1.1, 1.3, 2.0], [1.0, 2.0, 5.0, 16.0]


def longrope(**kw):
    opts = dict(short_factor=SHORT, long_factor=LONG, factor=8.0, original_max_positions=16)
    return poskit.build_encoding("rope-longrope", head_dim=8, num_heads=4, **{**opts, **kw}).double()


@pytest.mark.parametrize("seq_len, factors", [(None, SHORT), (1, SHORT), (16, SHORT), (17, LONG), (1000, LONG)])
def test_longrope_frequencies_switch_past_the_original_context(seq_len, factors):
    enc = longrope()
    want = torch.tensor([t / f for t, f in zip(theta(8, 10000.0), factors)], dtype=torch.float64)
    got = enc.inv_freq if seq_len is None else enc.inv_freq_for(seq_len)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    assert enc.attention_factor == pytest.approx(math.sqrt(1 + math.log(8) / math.log(16)), rel=1e-15)


def test_longrope_attention_factor_option_and_factor_one():
    assert longrope(attention_factor=1.5).attention_factor == 1.5
    assert longrope(factor=1.0).attention_factor == 1.0  # s <= 1: no temperature


def test_longrope_logits_scale_by_the_attention_factor_squared_and_use_the_call_length():
    enc, flat = longrope(), longrope(attention_factor=1.0)
    q, k, _ = make_qkv(H=4, Hkv=4, Tq=20, Tk=20, D=8)
    a = enc.attention_factor
    torch.testing.assert_close(poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True), poskit.attention_scores(q, k, flat, is_causal=True, enable_gqa=True) * a * a, rtol=1e-12, atol=1e-13)
    # the first 16 positions: short factors when the call ends there, long ones when it goes on to 20
    short = poskit.attention_scores(q[:, :, :16], k[:, :, :16], enc, is_causal=True, enable_gqa=True)
    assert not torch.allclose(short, poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True)[:, :, :16, :16])
    plain = poskit.build_encoding("rope", head_dim=8, num_heads=4).double()
    plain.inv_freq.copy_(torch.tensor([t / f for t, f in zip(theta(8, 10000.0), SHORT)], dtype=torch.float64))
    torch.testing.assert_close(short, poskit.attention_scores(q[:, :, :16], k[:, :, :16], plain, is_causal=True, enable_gqa=True) * a * a, rtol=1e-12, atol=1e-13)


def test_longrope_decoding_past_the_original_context_equals_each_prefix():
    # like dynamic NTK, the frequencies depend on the length so far: the cache keeps raw keys
    enc = longrope()
    assert enc.cache_form == "raw"
    q, k, v = make_qkv(B=1, H=4, Hkv=4, Tq=20, Tk=20, D=8)
    cache = KVCache(num_layers=1)
    for t in range(20):
        out = cached_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0, torch.arange(t, t + 1))
        prefix = poskit.attention(q[:, :, :t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, is_causal=True, enable_gqa=True)
        torch.testing.assert_close(out, prefix[:, :, t:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name, options, message", [
    ("rope-longrope", dict(short_factor=[1.0, 1.0], long_factor=LONG, factor=2.0, original_max_positions=16),
     r"short_factor must be a list of rotary_dim // 2 = 4 positive finite numbers"),
    ("rope-longrope", dict(short_factor=SHORT, long_factor=[1.0, 0.0, 1.0, 1.0], factor=2.0, original_max_positions=16),
     r"long_factor must be a list of rotary_dim // 2 = 4 positive"),
    ("rope-longrope", dict(short_factor=SHORT, long_factor=[1.0, True, 1.0, 1.0], factor=2.0, original_max_positions=16),
     r"long_factor must be a list"),
    ("rope-longrope", dict(short_factor=2.0, long_factor=LONG, factor=2.0, original_max_positions=16),
     r"short_factor must be a list"),
    ("rope-longrope", dict(short_factor=SHORT, long_factor=LONG, original_max_positions=16),
     r"needs factor .* or attention_factor"),
    ("rope-longrope", dict(short_factor=SHORT, long_factor=LONG, factor=2.0),
     r"original_max_positions \(the training context\) must be an int >= 1 for rope scaling 'longrope'"),
    ("rope-longrope", dict(short_factor=SHORT, long_factor=LONG, attention_factor=-1.0, original_max_positions=16),
     r"attention_factor must be a finite number > 0"),
    ("rope-llama3", dict(factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0, original_max_positions=16),
     r"high_freq_factor must be > low_freq_factor"),
    ("rope-llama3", dict(factor=8.0, high_freq_factor=4.0, original_max_positions=16),
     r"low_freq_factor must be a finite number > 0 for rope scaling 'llama3', got None"),
    ("rope-llama3", dict(low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=16),
     r"factor must be a number >= 1 for rope scaling 'llama3'"),
    # rope-yarn reads attention_factor too (HF's yarn does); rope-linear reads none of them
    ("rope-linear", dict(factor=2.0, attention_factor=1.2),
     r"attention_factor applies only to rope-yarn, rope-longrope, not to rope-linear"),
    ("rope", dict(low_freq_factor=1.0), r"low_freq_factor applies only to rope-llama3, not to rope"),
])
def test_bad_options_name_the_option_and_what_is_allowed(name, options, message):
    with pytest.raises(ValueError, match=message):
        poskit.build_encoding(name, head_dim=8, num_heads=2, **options)
