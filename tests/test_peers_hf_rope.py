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


# -- every rope_type against HF's own functions evaluated in float64, on the dicts of real configs -------------
# HF computes its frequencies in float32 (torch.float); the same functions run with torch.float meaning float64
# give HF's formulas at poskit's precision, so the two can be compared to a few float64 ulps instead of float32's.

import copy  # noqa: E402
import types  # noqa: E402

from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3.configuration_phi3 import Phi3Config  # noqa: E402

from poskit.encodings.rope_hf import from_hf  # noqa: E402

FLOAT64_RTOL = 8 * 2.0**-53
_TORCH64 = types.ModuleType("torch_float64")
_TORCH64.__dict__.update({k: v for k, v in vars(torch).items() if not k.startswith("__")})
_TORCH64.float = _TORCH64.float32 = torch.float64


def in_float64(fn):
    """HF's function `fn` with `torch.float` / `torch.float32` and `Tensor.float()` meaning float64 (its nested
    helpers too), for the duration of each call."""
    fn = getattr(fn, "__func__", fn)
    rebound = types.FunctionType(fn.__code__, {**fn.__globals__, "torch": _TORCH64}, fn.__name__, fn.__defaults__,
                                 fn.__closure__)

    def call(*args, **kwargs):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.Tensor, "float", torch.Tensor.double)
            return rebound(*args, **kwargs)

    return call


def hf_default(config, device=None, seq_len=None):
    return in_float64(LlamaRotaryEmbedding.compute_default_rope_parameters)(config)


PHI3_SHORT = [1.0, 1.02, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7]
PHI3_LONG = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]
# name -> (rope dict, config fields beside it, seq_lens to compare at (None: construction))
REAL = {
    "default": ({"rope_type": "default", "rope_theta": 500000.0}, dict(max_position_embeddings=64), [None]),
    "linear": ({"type": "linear", "factor": 4.0}, dict(max_position_embeddings=64), [None]),
    "dynamic (Qwen)": ({"type": "dynamic", "factor": 4.0}, dict(max_position_embeddings=16), [None, 12, 16, 40]),
    "yarn (Qwen2.5)": ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
                       dict(max_position_embeddings=8192), [None]),
    # HF's validation wants the key; a None factor is derived as max_position_embeddings / original
    "yarn without factor": ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 1024},
                            dict(max_position_embeddings=8192), [None]),
    "yarn (DeepSeek-V3)": ({"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
                           dict(max_position_embeddings=163840), [None]),
    "yarn (DeepSeek-V2-Lite)": ({"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                 "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},
                                dict(max_position_embeddings=163840), [None]),
    "yarn, every option": ({"rope_type": "yarn", "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False,
                            "attention_factor": 1.3, "original_max_position_embeddings": 2048, "rope_theta": 50000.0,
                            "partial_rotary_factor": 0.5}, dict(max_position_embeddings=16384), [None]),
    "llama3 (Llama 3.1)": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
                           dict(max_position_embeddings=131072), [None]),
    "longrope (Phi-3)": ({"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
                         dict(max_position_embeddings=131072, original_max_position_embeddings=4096),
                         [None, 4096, 4097]),
    "longrope with factor": ({"rope_type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG,
                              "factor": 4.0, "original_max_position_embeddings": 16},
                             dict(max_position_embeddings=64), [None, 17]),
}


@pytest.mark.parametrize("case", list(REAL))
def test_every_rope_type_equals_hf_in_float64(case):
    table, fields, seq_lens = REAL[case]
    rope_type = table.get("rope_type", table.get("type"))
    # a model's config class fills rope_theta with its default_theta (10000) when the dict has none; Phi-3's
    # moves its original_max_position_embeddings into the dict
    config_class = Phi3Config if "original_max_position_embeddings" in fields else PretrainedConfig
    config = config_class(hidden_size=D * H, num_attention_heads=H, num_key_value_heads=H, head_dim=D,
                          rope_parameters={"rope_theta": 10000.0, **copy.deepcopy(table)}, **fields)
    hf_fn = hf_default if rope_type == "default" else in_float64(ROPE_INIT_FUNCTIONS[rope_type])
    name, options = from_hf(copy.deepcopy(table), head_dim=D, **fields).to_config()
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, **options)
    for seq_len in seq_lens:
        theirs, their_factor = hf_fn(config, "cpu", seq_len=seq_len)
        assert theirs.dtype == torch.float64
        ours = enc.inv_freq if seq_len is None else enc.inv_freq_for(seq_len)
        torch.testing.assert_close(ours, theirs, rtol=FLOAT64_RTOL, atol=0, msg=f"{case} at seq_len {seq_len}")
        assert enc.attention_factor == pytest.approx(their_factor, rel=FLOAT64_RTOL, abs=0)


def test_the_float64_evaluation_is_hf_s_formula():
    # the proxy changes the precision, not the formula: at float32 rounding it is HF's float32 result
    config = PretrainedConfig(hidden_size=D * H, num_attention_heads=H, head_dim=D, max_position_embeddings=8192,
                              rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                               "original_max_position_embeddings": 2048})
    f32, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    f64, _ = in_float64(ROPE_INIT_FUNCTIONS["yarn"])(config, "cpu")
    assert f32.dtype == torch.float32 and f64.dtype == torch.float64
    torch.testing.assert_close(f64.float(), f32, rtol=FLOAT32_RTOL, atol=0)
    assert not torch.equal(f64, f32.double())


@pytest.mark.parametrize("rotary_dim", [D, D // 2])
def test_half_layout_equals_hf_apply_rotary_pos_emb_in_float64(rotary_dim):
    # the rotated q and k themselves, not only the logits; a partial rotary dim rotates the leading channels as
    # HF's partial-rotary models do (apply_rotary_pos_emb on q[..., :rotary_dim], the rest passed through)
    enc = poskit.build_encoding("rope", head_dim=D, num_heads=H, layout="half", base=BASE, rotary_dim=rotary_dim).double()
    T = 11
    q, k = rand(2, H, T, D, seed=3), rand(2, H, T, D, seed=4)
    positions = torch.arange(T) + 5
    freqs = positions.double()[:, None] * enc.inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    rq, rk = apply_rotary_pos_emb(q[..., :rotary_dim], k[..., :rotary_dim], emb.cos()[None], emb.sin()[None])
    oq, ok = enc(q, k, positions)
    torch.testing.assert_close(oq, torch.cat((rq, q[..., rotary_dim:]), -1), rtol=0, atol=1e-15)
    torch.testing.assert_close(ok, torch.cat((rk, k[..., rotary_dim:]), -1), rtol=0, atol=1e-15)


def test_converted_interleaved_weights_run_in_hf_s_layout():
    # a poskit layer in the interleaved layout, its q/k weights converted to the half layout, rotated by HF's
    # apply_rotary_pos_emb: the same logits (what exporting a poskit RoPE run to a Llama-layout model needs)
    from poskit.encodings.rotary import convert_qk_layout

    T, width = 10, 24
    x = rand(1, T, width, seed=5)
    wq, wk = rand(H * D, width, seed=6), rand(H * D, width, seed=7)
    enc = poskit.build_encoding("rope", head_dim=D, num_heads=H, base=BASE).double()

    def heads(w):
        return (x @ w.T).view(1, T, H, D).transpose(1, 2)

    want = poskit_logits(heads(wq), heads(wk), enc)
    inv_freq, _ = hf_default(PretrainedConfig(hidden_size=D * H, num_attention_heads=H, head_dim=D,
                                              rope_parameters={"rope_type": "default", "rope_theta": BASE}))
    got = hf_logits(*(heads(convert_qk_layout(w, head_dim=D, src="interleaved", dst="half")) for w in (wq, wk)),
                    inv_freq, 1.0, torch.arange(T))
    assert_visible_close(want, got)
