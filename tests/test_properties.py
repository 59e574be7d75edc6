"""Invariants that hold for every encoding, checked with hypothesis."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings.base import encoding_class
from conftest import build, make_qkv

# the encodings that enter attention (absolute ones go on the embeddings and are refused: test_absolute.py)
ALL = [n for n in poskit.available_encodings() if encoding_class(n).kind != "absolute"]
# the logits of these depend only on s - t (or on content and order): shifting every position changes nothing.
# rope-dynamic is excluded by design: its base depends on the longest position, hence on the shift.
SHIFT_INVARIANT = ["rope", "rope-linear", "rope-ntk", "rope-yarn", "pope", "alibi", "relative", "relative-capped", "cope",
                   "cope-alibi", "none"]

SETTINGS = dict(max_examples=15, deadline=None)


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
@settings(**SETTINGS)
@given(offset=st.integers(0, 10**6), T=st.integers(1, 9), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_logits_depend_only_on_relative_position(name, offset, T, causal, seed):
    enc = build(name, **({"max_distance": 16} if name == "relative" else {}))
    q, k, _ = make_qkv(Tq=T, Tk=T, gen_seed=seed)
    pos = torch.arange(T)
    a = poskit.attention_scores(q, k, enc, is_causal=causal, q_positions=pos, k_positions=pos, enable_gqa=True)
    b = poskit.attention_scores(q, k, enc, is_causal=causal, q_positions=pos + offset, k_positions=pos + offset, enable_gqa=True)
    assert torch.equal(torch.isinf(a), torch.isinf(b))
    fin = torch.isfinite(a)
    assert torch.allclose(a[fin], b[fin], atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("name", ALL)
@settings(**SETTINGS)
@given(groups=st.sampled_from([1, 2, 4]), T=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_gqa_equals_explicit_head_repetition(name, groups, T, seed):
    H = 4
    enc = build(name, num_heads=H)
    q, k, v = make_qkv(H=H, Hkv=H // groups, Tq=T, Tk=T, gen_seed=seed)
    kw = dict(gate_keys=k.flip(-1)) if getattr(enc, "gates", None) == "separate" else {}
    grouped = poskit.attention(q, k, v, enc, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True)
    rep = {name: t.repeat_interleave(groups, dim=1) for name, t in kw.items()}
    explicit = poskit.attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), enc,
                                backend="reference", **{"is_causal": True, **rep}, enable_gqa=True)
    assert torch.allclose(grouped, explicit, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
@settings(**SETTINGS)
@given(T=st.integers(1, 10), data=st.data(), seed=st.integers(0, 2**16))
def test_decoding_one_query_equals_row_of_full_computation(name, T, data, seed):
    t = data.draw(st.integers(0, T - 1))
    enc = build(name)
    q, k, v = make_qkv(Tq=T, Tk=T, gen_seed=seed)
    if name == "rope-dynamic":
        # dynamic NTK's base depends on the current length by definition, so the decode step at t equals
        # the full computation over the prefix 0..t (that is what a causal LM sees at step t)
        q, k, v = q[:, :, : t + 1], k[:, :, : t + 1], v[:, :, : t + 1]
    full_scores = poskit.attention_scores(q, k, enc, is_causal=True, enable_gqa=True)
    full = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    kp = torch.arange(t + 1)
    row_scores = poskit.attention_scores(q[:, :, t : t + 1], k[:, :, : t + 1], enc, q_positions=torch.tensor([t]), k_positions=kp, is_causal=True, enable_gqa=True)
    row = poskit.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc, q_positions=torch.tensor([t]), k_positions=kp, is_causal=True, enable_gqa=True)
    assert torch.allclose(row_scores[:, :, 0], full_scores[:, :, t, : t + 1], atol=1e-12)
    assert torch.allclose(row[:, :, 0], full[:, :, t], atol=1e-12)


@pytest.mark.parametrize("name", ["rope", "pope", "alibi", "relative", "cope"])
def test_batched_positions_equal_per_example_calls(name):
    enc = build(name)
    q, k, v = make_qkv(B=2, Tq=5, Tk=5)
    pos = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])
    both = poskit.attention_scores(q, k, enc, q_positions=pos, k_positions=pos, is_causal=True, enable_gqa=True)
    for b in range(2):
        one = poskit.attention_scores(q[b : b + 1], k[b : b + 1], enc, q_positions=pos[b], k_positions=pos[b], is_causal=True, enable_gqa=True)
        assert torch.allclose(both[b : b + 1], one, atol=1e-12)


def test_causal_masking_is_by_position_not_index():
    enc = build("rope")
    q, k, _ = make_qkv(Tq=2, Tk=6)
    scores = poskit.attention_scores(q, k, enc, q_positions=torch.tensor([4, 5]), k_positions=torch.arange(6), is_causal=True, enable_gqa=True)
    assert torch.isfinite(scores[..., 0, :5]).all() and torch.isinf(scores[..., 0, 5]).all()
    assert torch.isfinite(scores[..., 1, :]).all()
