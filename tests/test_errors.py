"""Bad input gets a ValueError that names the argument and the allowed values."""
import pytest
import torch

import poskit
from conftest import build, make_qkv


def test_unknown_encoding_lists_names():
    with pytest.raises(ValueError, match=r"name must be one of \[.*'pope'.*\]"):
        poskit.build_encoding("no-such-encoding", head_dim=8, num_heads=2)


def test_unknown_option_lists_allowed():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['theta'\].*allowed options: \[.*'base'.*\]"):
        poskit.build_encoding("rope", head_dim=8, num_heads=2, theta=5)


def test_variant_options_are_fixed():
    with pytest.raises(ValueError, match="unknown option"):
        poskit.build_encoding("rope-yarn", head_dim=8, num_heads=2, scaling="linear", factor=2.0, original_max_positions=8)


def test_odd_head_dim_for_rope():
    with pytest.raises(ValueError, match="head_dim must be even"):
        poskit.build_encoding("rope", head_dim=7, num_heads=2)


def test_non_dividing_kv_heads():
    enc = build("rope", num_heads=4)
    q, k, v = make_qkv(H=4, Hkv=3)
    with pytest.raises(ValueError, match=r"H_kv=3 must divide the query heads H=4; allowed H_kv: \[1, 2, 4\]"):
        poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda q, k, v: (q[0], k, v), "q must be a 4-d tensor"),
        (lambda q, k, v: (q, k[..., :8], v), "k must have shape"),
        (lambda q, k, v: (q, k, v[:, :, :3]), "v must have shape"),
        (lambda q, k, v: (q[..., :8], k[..., :8], v), "head_dim=16"),
        (lambda q, k, v: (q, k.float(), v), "share a dtype"),
    ],
)
def test_bad_shapes(mutate, match):
    enc = build("rope")
    q, k, v = mutate(*make_qkv())
    with pytest.raises(ValueError, match=match):
        poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)


def test_wrong_number_of_heads_for_encoding():
    enc = build("alibi", num_heads=8)
    q, k, v = make_qkv(H=4, Hkv=4)
    with pytest.raises(ValueError, match="num_heads=8"):
        poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(q_positions=torch.arange(7.0)), "q_positions must be an integer tensor"),
        (dict(k_positions=torch.arange(6)), r"k_positions must have shape \(7,\) or \(2, 7\)"),
        (dict(q_positions=torch.zeros(3, 7, dtype=torch.long)), r"q_positions must have shape"),
        (dict(attn_mask=torch.ones(2, 1, 1, 7, dtype=torch.long)), "attn_mask must be bool"),
        (dict(backend="cuda"), r"backend must be one of \['auto', 'reference', 'sdpa', 'triton'\]"),
    ],
)
def test_bad_attention_arguments(kw, match):
    enc = build("rope")
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=match):
        poskit.attention(q, k, v, enc, **{"is_causal": True, **kw}, enable_gqa=True)


def test_backend_that_cannot_serve_raises():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match="backend='sdpa' cannot serve"):
        poskit.attention(q, k, v, build("cope"), backend="sdpa", is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="backend='triton' serves only pope, cope and cope-alibi"):
        poskit.attention(q, k, v, build("rope"), backend="triton", is_causal=True, enable_gqa=True)


def test_gate_keys_rejected_for_other_encodings():
    q, k, v = make_qkv()
    for backend in ("reference", "sdpa"):
        with pytest.raises(ValueError, match="gate_keys is only accepted"):
            poskit.attention(q, k, v, build("rope"), gate_keys=k, backend=backend, is_causal=True, enable_gqa=True)


def test_learned_table_and_relative_distance_limits():
    with pytest.raises(ValueError, match=r"positions must be in \[0, 63\]"):
        build("learned", dim=8).embed(torch.tensor([100]))
    q, k, v = make_qkv(Tq=10, Tk=10)
    with pytest.raises(ValueError, match="max_distance=3"):
        poskit.attention(q, k, v, build("relative", max_distance=3), is_causal=True, enable_gqa=True)


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("alibi", dict(num_heads=True), r"num_heads must be an int >= 1, got True"),
        ("alibi", dict(num_heads=0), r"num_heads must be an int >= 1, got 0"),
        ("rope", dict(head_dim=True), r"head_dim must be an int >= 1, got True"),
        ("rope", dict(head_dim=8.0), r"head_dim must be an int >= 1, got 8.0"),
        ("learned", dict(dim=0), r"dim must be an int >= 1, got 0"),
        ("learned", dict(dim=-1), r"dim must be an int >= 1, got -1"),
        ("learned", dict(dim=8, max_positions=True), r"max_positions must be an int >= 1, got True"),
        ("sinusoidal", dict(dim=7), r"dim must be an even int >= 2 for the sinusoidal encoding, got 7"),
        ("legendre", dict(dim=1), r"dim must be an int >= 2 for the legendre encoding, got 1"),
        ("rope", dict(base="x"), r"base must be a finite number > 1, got 'x'"),
        ("rope", dict(base=1.0), r"base must be a finite number > 1, got 1.0"),
        ("sinusoidal", dict(dim=8, base="x"), r"base must be a finite number > 1, got 'x'"),
        ("pope", dict(base=float("nan")), r"base must be a finite number > 1, got nan"),
        ("rope-ntk", dict(factor=0.5), r"factor must be a finite number >= 1, got 0.5"),
        ("rope-linear", dict(factor=True), r"factor must be a finite number >= 1, got True"),
        ("rope-yarn", dict(factor=2.0, original_max_positions=64.0), r"original_max_positions must be an int >= 1, got 64.0"),
        ("rope-dynamic", dict(factor=2.0), r"original_max_positions \(the training context\) must be an int >= 1"),
        ("relative", dict(max_distance=True), r"max_distance must be an int >= 0, got True"),
        ("relative", dict(max_distance=-1), r"max_distance must be an int >= 0, got -1"),
        ("cope", dict(p_max=True), r"p_max must be an int >= 1, got True"),
        ("cope-alibi", dict(p_max=2.5), r"p_max must be an int >= 1, got 2.5"),
        ("cope", dict(init_std=-0.1), r"init_std must be a finite number >= 0, got -0.1"),
    ],
)
def test_bad_encoding_options_name_the_argument_and_allowed_values(name, kwargs, match):
    kwargs = dict(dict(head_dim=8, num_heads=2), **kwargs)
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding(name, **kwargs)


def test_zero_kv_heads():
    q, k, v = make_qkv(H=4, Hkv=2)
    with pytest.raises(ValueError, match=r"H_kv=0 must divide the query heads H=4; allowed H_kv: \[1, 2, 4\]"):
        poskit.attention_scores(q, k[:, :0], build("rope"), is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match=r"H_kv=0 must divide"):
        poskit.attention(q, k[:, :0], v[:, :0], build("alibi"), is_causal=True, enable_gqa=True)


def test_cope_value_gates_without_v():
    q, k, _ = make_qkv()
    with pytest.raises(ValueError, match=r"gates='values' needs v"):
        poskit.attention_scores(q, k, build("cope", gates="values"), is_causal=True, enable_gqa=True)
