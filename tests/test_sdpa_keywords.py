"""poskit.attention takes F.scaled_dot_product_attention's keywords with their meanings:
attn_mask (bool True = attend, float added), is_causal (default False), scale, enable_gqa; the old
`causal=` / `key_padding_mask=` are refused with their replacement named."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import poskit
from poskit.attention.inputs import prepare
from conftest import build, make_qkv
from extras import need

ATTENTION_ENCODINGS = [n for n in poskit.available_encodings() if poskit.build_encoding(
    n, head_dim=16, num_heads=4, dim=32, **__import__("conftest").ENCODING_OPTIONS.get(n, {})).kind != "absolute"]
CONTEXTUAL = {"cope", "cope-alibi"}


def _gates(enc, k):
    return dict(gate_keys=k.flip(-1)) if getattr(enc, "gates", "") == "separate" else {}


@pytest.mark.parametrize("fn", ["attention", "attention_scores", "reference_attention"])
@pytest.mark.parametrize("old, names", [("causal", "is_causal"), ("key_padding_mask", "attn_mask")])
def test_old_keywords_are_refused_naming_their_replacement(fn, old, names):
    from poskit.attention import reference_attention

    q, k, v = make_qkv(H=4, Hkv=4)
    call = {"attention": lambda **kw: poskit.attention(q, k, v, build("rope"), **kw),
            "attention_scores": lambda **kw: poskit.attention_scores(q, k, build("rope"), **kw),
            "reference_attention": lambda **kw: reference_attention(q, k, v, build("rope"), **kw)}[fn]
    value = True if old == "causal" else torch.ones(2, 7, dtype=torch.bool)
    with pytest.raises(TypeError, match=names) as err:
        call(**{old: value})
    if old == "key_padding_mask":
        assert "True = attend" in str(err.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'causl'"):
        call(causl=True)


def test_is_causal_defaults_to_false_as_in_sdpa():
    q, k, v = make_qkv(H=4, Hkv=4)
    enc = build("none")
    torch.testing.assert_close(poskit.attention(q, k, v, enc), F.scaled_dot_product_attention(q, k, v))
    assert not torch.allclose(poskit.attention(q, k, v, enc), poskit.attention(q, k, v, enc, is_causal=True))


@pytest.mark.parametrize("Tq, Tk", [(3, 7), (7, 3), (1, 5)])
def test_default_positions_give_sdpa_top_left_causal_mask_for_unequal_lengths(Tq, Tk):
    # default positions are arange(Tq) and arange(Tk): query t sees keys s <= t, SDPA's top-left alignment
    q, k, v = make_qkv(H=4, Hkv=2, Tq=Tq, Tk=Tk)
    got = poskit.attention(q, k, v, build("none"), is_causal=True, enable_gqa=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want)
    # a decode step against a longer cache needs its position: bottom-right alignment
    bottom_right = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    got = poskit.attention(q, k, v, build("none"), is_causal=True, enable_gqa=True,
                           q_positions=torch.arange(Tk - Tq, Tk))
    if Tq <= Tk:
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right,
                                                                       enable_gqa=True))


def test_enable_gqa_false_refuses_fewer_kv_heads_like_sdpa():
    q, k, v = make_qkv(H=4, Hkv=2)
    with pytest.raises(RuntimeError):  # SDPA's own refusal
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        poskit.attention(q, k, v, build("rope"))
    grouped = poskit.attention(q, k, v, build("none"), enable_gqa=True)
    torch.testing.assert_close(grouped, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["bool", "float"]), shape=st.sampled_from(["BHQK", "QK", "B11K", "K", "1HQ1"]),
       is_causal=st.booleans(), gqa=st.booleans(), scale=st.sampled_from([None, 0.3]), seed=st.integers(0, 2**16))
def test_no_encoding_equals_sdpa_for_every_mask(kind, shape, is_causal, gqa, scale, seed):
    B, H, Tq, Tk = 2, 4, 5, 5
    q, k, v = make_qkv(B=B, H=H, Hkv=2 if gqa else 4, Tq=Tq, Tk=Tk, gen_seed=seed)
    mask = _random_mask(kind, shape, (B, H, Tq, Tk), seed, keep_one=True)
    if is_causal:  # SDPA's docs call attn_mask with is_causal an error: fold the causal mask into SDPA's mask
        causal = torch.ones(Tq, Tk, dtype=torch.bool).tril()
        sdpa_mask = mask & causal if kind == "bool" else torch.where(causal, mask, float("-inf"))
    else:
        sdpa_mask = mask if mask.dim() > 1 else mask[None]  # (SDPA wants at least (Tq|1, Tk))
    got = poskit.attention(q, k, v, build("none"), attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, scale=scale, enable_gqa=gqa)
    torch.testing.assert_close(got, want)


def _random_mask(kind, shape, full, seed, keep_one=False):
    B, H, Tq, Tk = full
    sizes = {"BHQK": (B, H, Tq, Tk), "QK": (Tq, Tk), "B11K": (B, 1, 1, Tk), "K": (Tk,), "1HQ1": (1, H, Tq, 1)}[shape]
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(sizes, generator=g) > 0.4
    if keep_one:  # the first key always visible: SDPA's output for a row with no key is not poskit's 0
        keep[..., 0] = True
    if kind == "bool":
        return keep
    values = torch.randn(sizes, generator=g, dtype=torch.float64)
    return values.masked_fill(~keep, float("-inf"))


@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(["bool", "float"]), shape=st.sampled_from(["BHQK", "QK", "B11K", "1HQ1"]),
       is_causal=st.booleans(), seed=st.integers(0, 2**16))
def test_masks_fast_path_equals_reference_for_every_encoding(name, kind, shape, is_causal, seed):
    B, H, Tq, Tk = 2, 4, 6, 6
    enc = build(name)
    q, k, v = make_qkv(B=B, H=H, Hkv=2, Tq=Tq, Tk=Tk, gen_seed=seed, requires_grad=True)
    mask = _random_mask(kind, shape, (B, H, Tq, Tk), seed)
    kw = dict(attn_mask=mask, is_causal=is_causal, enable_gqa=True, **_gates(enc, k.detach()))
    fast = poskit.attention(q, k, v, enc, **kw)
    ref = poskit.attention(q, k, v, enc, backend="reference", **kw)
    torch.testing.assert_close(fast, ref)
    g_fast = torch.autograd.grad(fast.sum(), (q, k, v), allow_unused=True)
    g_ref = torch.autograd.grad(ref.sum(), (q, k, v), allow_unused=True)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", [n for n in ATTENTION_ENCODINGS if n not in CONTEXTUAL])
def test_float_mask_is_added_to_the_logits_and_bool_mask_hides(name):
    # independent of the engine's mask code: the unmasked reference logits plus the mask
    enc = build(name)
    q, k, _ = make_qkv(H=4, Hkv=2)
    plain = poskit.attention_scores(q, k, enc, enable_gqa=True)
    added = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    torch.testing.assert_close(poskit.attention_scores(q, k, enc, enable_gqa=True, attn_mask=added), plain + added)
    hide = torch.rand(7, 7) > 0.5
    got = poskit.attention_scores(q, k, enc, enable_gqa=True, attn_mask=hide)
    torch.testing.assert_close(got, plain.masked_fill(~hide, float("-inf")))


@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_rows_without_a_visible_key_output_zero(name):
    enc = build(name)
    q, k, v = make_qkv(H=4, Hkv=2)
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    mask[0, 0, 3] = False  # query 3 of sequence 0 sees nothing
    floats = torch.zeros(2, 1, 7, 7, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    for m in (mask, floats):
        out = poskit.attention(q, k, v, enc, attn_mask=m, enable_gqa=True, **_gates(enc, k))
        assert (out[0, :, 3] == 0).all() and out.isfinite().all()
        assert (out[0, :, 2] != 0).any()


def test_key_only_masks_become_the_key_padding_mask_of_the_fast_paths():
    q, k, v = make_qkv(H=4, Hkv=2)
    keep = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    for m in (keep[:, None, None, :], torch.zeros(2, 1, 1, 7, dtype=torch.float64).masked_fill(
            ~keep[:, None, None, :], float("-inf"))):
        inp = prepare(q, k, v, build("rope"), causal=True, q_positions=None, k_positions=None, scale=None, attn_mask=m)
        assert inp.attn_mask is None and torch.equal(inp.key_padding_mask, keep)
    general = torch.ones(7, 7, dtype=torch.bool)
    inp = prepare(q, k, v, build("rope"), causal=True, q_positions=None, k_positions=None, scale=None,
                  attn_mask=general)
    assert inp.key_padding_mask is None and inp.attn_mask.shape == (1, 1, 7, 7)
    # a float key mask with values other than 0 and -inf is added, so it stays general
    inp = prepare(q, k, v, build("rope"), causal=True, q_positions=None, k_positions=None, scale=None,
                  attn_mask=torch.full((2, 1, 1, 7), 0.5, dtype=torch.float64))
    assert inp.key_padding_mask is None and inp.attn_mask is not None


@pytest.mark.parametrize("bad, match", [
    (torch.ones(7, 7, dtype=torch.float32), "bool .* or float of q's dtype"),
    (torch.ones(7, 7, dtype=torch.long), "bool .* or float of q's dtype"),
    (torch.ones(6, 7, dtype=torch.bool), r"broadcastable to \(B, H, Tq, Tk\) = \(2, 4, 7, 7\)"),
    (torch.ones(1, 1, 1, 1, 7, dtype=torch.bool), "broadcastable"),
    ([[True] * 7] * 7, "attn_mask must be a tensor"),
])
def test_bad_attn_masks_are_refused(bad, match):
    q, k, v = make_qkv(H=4, Hkv=2)
    with pytest.raises(ValueError, match=match):
        poskit.attention(q, k, v, build("rope"), attn_mask=bad, enable_gqa=True)


def test_dropout_p_zero_is_accepted_and_other_values_refused():
    q, k, v = make_qkv(H=4, Hkv=4)
    torch.testing.assert_close(poskit.attention(q, k, v, build("rope"), dropout_p=0.0),
                               poskit.attention(q, k, v, build("rope")))
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        poskit.attention(q, k, v, build("rope"), dropout_p=0.1)


def test_triton_backend_refuses_a_general_mask():
    need("triton", "triton")
    q, k, v = make_qkv(H=4, Hkv=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="backend='triton' serves attn_mask only when it varies along the keys"):
        poskit.attention(q, k, v, build("pope", dtype=torch.float32), backend="triton", enable_gqa=True,
                         attn_mask=torch.ones(7, 7, dtype=torch.bool))
