"""EncoderDecoder: against a float64 reference written from Vaswani et al.'s layout and the encodings'
formulas (computed here, the slow obvious way), incremental decoding equal to full decoding for every
encoding kind, padding on both streams, and the configuration errors."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from poskit.attention.kv_cache import KVCache
from poskit.util.config_check import ConfigError
from poskit.models import EncoderDecoder, EncoderDecoderConfig

V = 23


@pytest.fixture(autouse=True)
def _uncompiled_pope_decode(monkeypatch):
    # PoPE's compiled decode kernel is tested in test_pope_decode.py; compiling it here would cost a minute
    monkeypatch.setenv("POSKIT_FUSED_DECODE", "0")


def _model(encoding="sinusoidal", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(src_vocab_size=V, tgt_vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2,
               d_ff=24, dropout=0.0, encoding=encoding)
    cfg.update(kw)
    return EncoderDecoder(EncoderDecoderConfig(**cfg)).eval()


# ---------------------------------------------------------------------------------------------- reference
def _sinusoid(T, d):
    pe = torch.zeros(T, d, dtype=torch.float64)
    for p in range(T):
        for i in range(0, d, 2):
            pe[p, i] = math.sin(p / 10000 ** (i / d))
            pe[p, i + 1] = math.cos(p / 10000 ** (i / d))
    return pe


def _rotate(x, pos):  # x (T, hd): RoFormer eq. 34, pairs (2i, 2i+1) turned by pos * 10000^(-2i/hd)
    out = x.clone()
    hd = x.shape[-1]
    for t in range(x.shape[0]):
        for i in range(0, hd, 2):
            a = pos[t] * 10000 ** (-i / hd)
            out[t, i] = x[t, i] * math.cos(a) - x[t, i + 1] * math.sin(a)
            out[t, i + 1] = x[t, i + 1] * math.cos(a) + x[t, i] * math.sin(a)
    return out


def _attend(lin, xq, xk, H, qpos, kpos, keep, causal, kind):
    """One multi-head attention, head by head: softmax(q k^T / sqrt(hd) + bias, masked) v, then o_proj."""
    W = lambda m, x: x @ m.weight.double().T + (m.bias.double() if m.bias is not None else 0)  # noqa: E731
    q, k, v = W(lin.q_proj, xq), W(lin.k_proj, xk), W(lin.v_proj, xk)
    hd = q.shape[-1] // H
    heads = []
    for h in range(H):
        qh, kh, vh = (t[:, h * hd:(h + 1) * hd] for t in (q, k, v))
        if kind == "rope":
            qh, kh = _rotate(qh, qpos), _rotate(kh, kpos)
        logits = qh @ kh.T / math.sqrt(hd)
        for t in range(len(qpos)):
            for s in range(len(kpos)):
                if kind == "alibi":
                    logits[t, s] -= 2 ** (-8 * (h + 1) / H) * abs(qpos[t] - kpos[s])
                if not keep[s] or (causal and kpos[s] > qpos[t]):
                    logits[t, s] = -math.inf
        heads.append(torch.softmax(logits, -1) @ vh)
    return W(lin.o_proj, torch.cat(heads, -1))


def _ln(m, x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], m.weight.double(), m.bias.double(), m.eps)


def _sub(norm, x, f, pre):
    return x + f(_ln(norm, x)) if pre else _ln(norm, x + f(x))


def _ff(ff, x):
    return torch.relu(x @ ff.w1.weight.double().T + ff.w1.bias.double()) @ ff.w2.weight.double().T + ff.w2.bias.double()


def reference(model, src, tgt, src_keep, kind, cross_kind="none"):
    """Logits (Tt, V) of one example in float64, from the model's weights and the formulas above."""
    cfg = model.config
    pre, d, H = cfg.norm == "pre", cfg.d_model, cfg.n_heads
    src = src[src_keep]
    spos = list(range(len(src)))
    tpos = list(range(len(tgt)))
    keep_s, keep_t = [True] * len(src), [True] * len(tgt)
    x = model.src_embed.weight.double()[src] * math.sqrt(d)
    y = model.tgt_embed.weight.double()[tgt] * math.sqrt(d)
    if kind == "sinusoidal":
        x, y = x + _sinusoid(len(src), d), y + _sinusoid(len(tgt), d)
    attn_kind = "none" if kind == "sinusoidal" else kind
    for b in model.encoder:
        x = _sub(b.norm1, x, lambda h: _attend(b.attn, h, h, H, spos, spos, keep_s, False, attn_kind), pre)
        x = _sub(b.norm2, x, lambda h: _ff(b.mlp, h), pre)
    if pre:
        x = _ln(model.enc_norm, x)
    for b in model.decoder:
        y = _sub(b.norm1, y, lambda h: _attend(b.attn, h, h, H, tpos, tpos, keep_t, True, attn_kind), pre)
        y = _sub(b.norm_cross, y, lambda h: _attend(b.cross_attn, h, x, H, tpos, spos, keep_s, False, cross_kind), pre)
        y = _sub(b.norm2, y, lambda h: _ff(b.mlp, h), pre)
    if pre:
        y = _ln(model.dec_norm, y)
    return y @ model.out_proj.weight.double().T


@pytest.mark.parametrize("encoding,norm,cross", [("sinusoidal", "post", "none"), ("rope", "post", "none"),
                                                 ("rope", "pre", "aligned"), ("alibi", "pre", "none"),
                                                 ("alibi", "post", "aligned")])
def test_forward_equals_the_float64_reference(encoding, norm, cross):
    model = _model(encoding, norm=norm, cross_attention_positions=cross).double()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, V, (2, 6), generator=g)
    tgt = torch.randint(1, V, (2, 5), generator=g)
    src_mask = torch.ones(2, 6, dtype=torch.bool)
    src_mask[1, :2] = False  # row 1: two pads on the left
    out = model(src, tgt, src_mask)
    for i in range(2):
        ref = reference(model, src[i], tgt[i], src_mask[i], encoding, encoding if cross == "aligned" else "none")
        # 1e-6: the encodings hand their tables over in float32 (sinusoidal embed, rope angles)
        torch.testing.assert_close(out[i], ref, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------- decoding, padding
ALL = ["sinusoidal", "learned", "legendre", "rope", "pope", "alibi", "relative", "cope"]


@pytest.mark.parametrize("encoding", ALL)
def test_incremental_decoding_with_a_cache_equals_the_full_decoder(encoding):
    model = _model(encoding, seed=3)
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(1, V, (3, 7), generator=g), torch.randint(1, V, (3, 6), generator=g)
    with torch.no_grad():
        full = model(src, tgt)
        memory = model.encode(src)
        cache = KVCache(len(model.decoder))
        steps = [model.decode(tgt[:, :2], memory, cache=cache)]  # a prefill of two, then one at a time
        steps += [model.decode(tgt[:, t:t + 1], memory, cache=cache) for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned", "rope", "pope", "alibi", "relative", "cope"])
def test_padding_on_either_stream_changes_nothing_for_the_real_tokens(encoding):
    kw = {"cross_attention_positions": "aligned"} if encoding in ("rope", "pope", "alibi") else {}
    model = _model(encoding, seed=4, **kw)
    g = torch.Generator().manual_seed(5)
    src, tgt = torch.randint(1, V, (1, 5), generator=g), torch.randint(1, V, (1, 4), generator=g)
    with torch.no_grad():
        alone = model(src, tgt)
        # source padded on the left, target padded on the right, in a batch of two
        src_b = torch.cat((torch.cat((torch.zeros(1, 3, dtype=torch.long), src), 1),
                           torch.randint(1, V, (1, 8), generator=g)))
        src_m = torch.ones(2, 8, dtype=torch.bool)
        src_m[0, :3] = False
        tgt_b = torch.cat((torch.cat((tgt, torch.zeros(1, 2, dtype=torch.long)), 1),
                           torch.randint(1, V, (1, 6), generator=g)))
        tgt_m = torch.ones(2, 6, dtype=torch.bool)
        tgt_m[0, 4:] = False
        padded = model(src_b, tgt_b, src_m, tgt_m)
    torch.testing.assert_close(padded[0, :4], alone[0], atol=1e-5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(pads=st.integers(0, 5), left=st.booleans())
def test_encoder_output_of_a_padded_source_is_that_of_the_source_alone(pads, left):
    model = _model("rope", seed=6)
    src = torch.arange(1, 6)[None]
    filler = torch.zeros(1, pads, dtype=torch.long)
    padded = torch.cat((filler, src) if left else (src, filler), 1)
    mask = torch.cat((filler.bool(), torch.ones_like(src, dtype=torch.bool)) if left else
                     (torch.ones_like(src, dtype=torch.bool), filler.bool()), 1)
    with torch.no_grad():
        alone, out = model.encode(src).output, model.encode(padded, mask).output
    real = out[mask]
    torch.testing.assert_close(real, alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("encoding", ["rope", "pope"])
def test_translate_with_the_cache_equals_translate_without_it(encoding):
    model = _model(encoding, seed=7)
    src = torch.randint(3, V, (3, 5), generator=torch.Generator().manual_seed(8))
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    for beam in (1, 3):
        a = model.translate(src, mask, bos=1, eos=2, max_len=7, beam_size=beam)
        b = model.translate(src, mask, bos=1, eos=2, max_len=7, beam_size=beam, use_cache=False)
        assert a == b and len(a) == 3


def test_shared_and_tied_embeddings_and_separate_absolute_tables():
    m = _model("learned", share_embeddings=True)
    assert m.src_embed is m.tgt_embed and m.out_proj.weight is m.tgt_embed.weight
    assert m.src_abs is not m.tgt_abs  # learned position tables per stream
    m2 = _model("learned", tie_output=False, tgt_vocab_size=V + 4)
    assert m2.out_proj.weight is not m2.tgt_embed.weight and m2.out_proj.weight.shape[0] == V + 4


# --------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("encoding", ["sinusoidal", "cope"])
def test_aligned_cross_attention_is_refused_where_it_is_not_defined(encoding):
    with pytest.raises(ConfigError, match="cross_attention_positions") as e:
        _model(encoding, cross_attention_positions="aligned")
    assert encoding in str(e.value)


@pytest.mark.parametrize("field,value", [("norm", "sandwich"), ("cross_attention_positions", "rotated"),
                                         ("d_model", 15), ("dropout", 1.0), ("encoding", "nope")])
def test_bad_config_values_name_their_field(field, value):
    with pytest.raises(ConfigError, match=field):
        _model(**{field: value})


def test_bad_inputs_name_their_argument():
    m = _model()
    with pytest.raises(ConfigError, match="share_embeddings"):
        _model(share_embeddings=True, tgt_vocab_size=V + 1)
    with pytest.raises(ValueError, match="src ids must be in"):
        m(torch.tensor([[V]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="src_mask rows \\[0\\] have no real token"):
        m.encode(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]))
    with pytest.raises(ValueError, match="tgt_mask"):
        m(torch.tensor([[1, 2]]), torch.tensor([[1, 2]]), tgt_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match="tgt must have the memory's batch size"):
        m.decode(torch.tensor([[1], [2]]), m.encode(torch.tensor([[1, 2]])))
