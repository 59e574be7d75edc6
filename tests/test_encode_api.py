"""The public encode API: `q_enc, k_enc = enc(q, k, positions)` then SDPA with
`scale=enc.sdpa_scale(head_dim)` equals poskit.attention, for every encoding that acts on q and k."""
import pytest
import torch
import torch.nn.functional as F

import poskit
from conftest import build, make_qkv

QK = [n for n in poskit.available_encodings() if build(n).kind in ("qk", "none")]
OTHERS = [n for n in poskit.available_encodings() if n not in QK]


@pytest.mark.parametrize("name", QK)
@pytest.mark.parametrize("positions", ["default", "1d", "2d"])
def test_encode_then_sdpa_equals_poskit_attention(name, positions):
    enc = build(name)
    q, k, v = make_qkv(H=4, Hkv=2, Tq=9, Tk=9)
    pos = {"default": None, "1d": torch.arange(9) + 3, "2d": torch.stack([torch.arange(9), torch.arange(9) * 2])}[positions]
    q_enc, k_enc = enc(q, k, pos)
    assert q_enc.shape[-1] == k_enc.shape[-1] == enc.qk_width * 16
    got = F.scaled_dot_product_attention(q_enc, k_enc, v, is_causal=True, scale=enc.sdpa_scale(16), enable_gqa=True)
    want = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True, q_positions=pos, k_positions=pos)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", QK)
def test_q_and_k_positions_apart_for_a_decode_step(name):
    enc = build(name)
    q, k, v = make_qkv(H=4, Hkv=2, Tq=1, Tk=6)
    q_enc, k_enc = enc(q, k, q_positions=torch.tensor([5]), k_positions=torch.arange(6))
    got = F.scaled_dot_product_attention(q_enc, k_enc, v, scale=enc.sdpa_scale(), enable_gqa=True)
    want = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True, q_positions=torch.tensor([5]))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="give q_positions and k_positions instead"):
        enc(q, k, torch.arange(6))
    with pytest.raises(ValueError, match="either positions .* or q_positions/k_positions"):
        enc(q, q, torch.arange(1), q_positions=torch.arange(1))


def test_pope_needs_sdpa_scale_because_its_outputs_are_twice_as_wide():
    enc = build("pope")
    q, k, v = make_qkv(H=4, Hkv=4)
    q_enc, k_enc = enc(q, k)
    assert q_enc.shape[-1] == 32 and enc.sdpa_scale(16) == 16 ** -0.5
    right = F.scaled_dot_product_attention(q_enc, k_enc, v, scale=enc.sdpa_scale(16))
    sdpa_default = F.scaled_dot_product_attention(q_enc, k_enc, v)  # 1/sqrt(32): not poskit's logits
    torch.testing.assert_close(right, poskit.attention(q, k, v, enc))
    assert (right - sdpa_default).abs().max() > 1e-3


@pytest.mark.parametrize("name", OTHERS)
def test_encodings_that_do_not_act_on_q_and_k_alone_say_what_to_use(name):
    enc = build(name)
    q, k, _ = make_qkv(H=4, Hkv=4)
    use = "enc.embed" if enc.kind == "absolute" else "poskit.attention"
    with pytest.raises(TypeError, match=use):
        enc(q, k)


def test_sdpa_scale_and_encode_refuse_bad_arguments():
    enc = build("rope")
    with pytest.raises(ValueError, match="head_dim must be this encoding's head_dim=16"):
        enc.sdpa_scale(32)
    with pytest.raises(ValueError, match="head_dim must be"):
        enc.sdpa_scale(0)
    q, k, _ = make_qkv(H=4, Hkv=4)
    with pytest.raises(ValueError, match=r"k must be a \(B, heads, T, 16\) tensor"):
        enc(q, k[..., :8])
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        enc(q, k, torch.arange(7.0))
