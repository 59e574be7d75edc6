"""The CPU fast paths' shortcuts (mask elision, grouped decode, preallocated cache) stay exact."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.attention import KVCache, cached_attention
from poskit.attention.engine import route
from poskit.attention.inputs import prepare
from poskit.attention.sdpa import mask_plan
from conftest import build, make_qkv
from cpu_kernel_helpers import kernel_off


def _plan(qp, kp, causal=True, pad=None, batch=1):
    qp, kp = torch.tensor(qp), torch.tensor(kp)
    q, k, v = make_qkv(B=batch, H=4, Hkv=4, Tq=qp.shape[-1], Tk=kp.shape[-1])
    enc = build("rope")
    return mask_plan(prepare(q, k, v, enc, causal=causal, q_positions=qp, k_positions=kp, scale=None,
                             key_padding_mask=pad))


def test_mask_plan_recognises_trivial_masks_and_nothing_else():
    assert _plan([5], [0, 1, 2, 3, 4, 5]) == "none"  # decode: the query is at or after every key
    assert _plan([7, 8, 9], [7, 8, 9]) == "causal"  # offset but identical increasing positions
    assert _plan([1, 2], [0, 1, 2]) == "explicit"  # a chunk against a longer cache: bottom-right aligned
    assert _plan([0, 2, 1], [0, 2, 1]) == "explicit"  # identical but not increasing: index order is not position order
    assert _plan([3, 3], [3, 3]) == "none"  # equal positions see each other
    assert _plan([2], [0, 1, 2], causal=False) == "none"
    assert _plan([2], [0, 1, 2], pad=torch.tensor([[True, False, True]])) == "explicit"
    # per-sequence positions: each decode query after its own keys
    assert _plan([[5], [9]], [[0, 1, 5], [7, 8, 9]], batch=2) == "none"
    assert _plan([[5], [8]], [[0, 1, 5], [7, 8, 9]], batch=2) == "explicit"


@pytest.mark.parametrize("name", ["rope", "rope-yarn", "pope", "alibi", "none"])
@settings(max_examples=10, deadline=None)
@given(offset=st.integers(0, 10**6), Tq=st.integers(1, 9), extra=st.integers(0, 9), groups=st.sampled_from([1, 2, 4]),
       shuffle=st.booleans(), seed=st.integers(0, 2**16))
def test_fast_path_equals_reference_for_any_positions(name, offset, Tq, extra, groups, shuffle, seed):
    # queries are the last Tq of Tk = Tq + extra keys, at large offsets, optionally in scrambled order
    enc = build(name)
    Tk = Tq + extra
    q, k, v = make_qkv(B=2, H=4, Hkv=4 // groups, Tq=Tq, Tk=Tk, gen_seed=seed)
    kp = torch.arange(offset, offset + Tk)
    if shuffle:
        kp = kp[torch.randperm(Tk, generator=torch.Generator().manual_seed(seed))]
    qp = kp[extra:]
    kw = dict(q_positions=qp, k_positions=kp)
    fast = poskit.attention(q, k, v, enc, **{"is_causal": True, **kw}, enable_gqa=True)
    ref = poskit.attention(q, k, v, enc, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True)
    torch.testing.assert_close(fast, ref, atol=1e-10, rtol=1e-10)


def test_grouped_decode_on_the_blocked_path_matches_reference_in_both_directions():
    # PoPE with 4 query heads per kv head: the few decode queries are stacked per kv head (no repeat_kv)
    enc = build("pope", num_heads=8)
    q, k, v = make_qkv(B=2, H=8, Hkv=2, Tq=3, Tk=11, requires_grad=True)
    kw = dict(q_positions=torch.tensor([8, 9, 10]), k_positions=torch.arange(11))
    assert route(enc, q) == "blocked"
    fast = poskit.attention(q, k, v, enc, **{"is_causal": True, **kw}, enable_gqa=True)
    grads = torch.autograd.grad(fast.square().sum(), (q, k, v, enc.delta))
    ref = poskit.attention(q, k, v, enc, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, enc.delta))
    torch.testing.assert_close(fast, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_route_names_the_path_taken(monkeypatch):
    kernel_off(monkeypatch)  # the paths without the compiled kernel (its routes: test_cpu_flash.py)
    q = torch.zeros(1, 4, 2, 16)
    assert route(build("pope"), q) == "blocked"
    assert route(build("alibi"), q) == "blocked"
    assert route(build("rope"), q) == "sdpa"
    assert route(build("relative"), q) == "blocked-bias"  # learned bias: generated per query block, never T x T
    assert route(build("cope"), q) == "blocked-contextual"
    assert route(build("rope"), q, backend="reference") == "reference"
    from poskit.attention.sdpa import BLOCKED_MAX_KEYS

    long_keys = torch.zeros(1, 4, BLOCKED_MAX_KEYS + 1, 16)
    assert route(build("pope"), long_keys, long_keys) == "sdpa"  # padded flash kernel beyond BLOCKED_MAX_KEYS
    assert route(build("pope"), q, long_keys) == "blocked"  # a few queries (decode) stay blocked


@pytest.mark.parametrize("name", ["pope", "rope", "alibi", "relative", "cope"])
def test_route_names_the_reference_path_for_empty_inputs(name):
    """attention() answers a call without queries or keys on the reference path; route() says so."""
    enc = build(name)
    empty, some = torch.zeros(1, 4, 0, 16), torch.zeros(1, 4, 3, 16)
    assert route(enc, empty) == "reference"
    assert route(enc, some, empty) == "reference"
    assert route(enc, empty, some) == "reference"
    out = poskit.attention(some, empty, empty, enc, is_causal=False)
    assert out.shape == (1, 4, 3, 16) and not out.any()


def test_long_pope_sequences_take_padded_sdpa_exactly(monkeypatch):
    from poskit.attention import sdpa as sdpa_module

    monkeypatch.setattr(sdpa_module, "BLOCKED_MAX_KEYS", 8)  # so that a small test takes the long-sequence path
    enc = build("pope")
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=70, Tk=70, requires_grad=True)
    assert route(enc, q, k, enable_gqa=True) == "sdpa"
    out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    ref = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, enc.delta))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, enc.delta))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_cache_grows_past_its_allocation_and_keeps_every_token():
    cache = KVCache(num_layers=1, max_length=4)
    enc = build("rope")
    q, k, v = make_qkv(Tq=150, Tk=150)
    outs = [cached_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], enc, cache, 0, torch.arange(3))]
    for t in range(3, 150):  # grows 4 -> 8 -> ... -> 256, copying only when it doubles
        outs.append(cached_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0,
                                     torch.tensor([t])))
    assert cache.length == 150 and cache.layer(0)._keys.data.shape[2] == 256
    torch.testing.assert_close(cache.layer(0).values, v)
    torch.testing.assert_close(cache.layer(0).positions, torch.arange(150)[None])
    full = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    torch.testing.assert_close(torch.cat(outs, 2), full)


def test_crop_rolls_back_and_decoding_continues_exactly():
    enc = build("pope")
    q, k, v = make_qkv(Tq=8, Tk=8)
    cache = KVCache(num_layers=2)
    cached_attention(q[:, :, :6], k[:, :, :6], v[:, :, :6], enc, cache, 0, torch.arange(6))
    cache.crop(4)  # drop tokens 4 and 5, decode them again
    assert cache.length == 4 and cache.next_position() == 4 and cache.layer(1).length == 0
    out = cached_attention(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], enc, cache, 0, torch.arange(4, 8))
    full = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, full[:, :, 4:])
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 8\]"):
        cache.crop(9)
    with pytest.raises(ValueError, match="max_length must be a positive int or None"):
        KVCache(num_layers=1, max_length=0)


def test_cache_mixes_shared_and_per_batch_positions():
    enc = build("alibi")
    q, k, v = make_qkv(B=2, Tq=5, Tk=5)
    cache = KVCache(num_layers=1)
    cached_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], enc, cache, 0, torch.arange(3))
    per_batch = torch.tensor([[3, 4], [3, 4]])
    out = cached_attention(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], enc, cache, 0, per_batch)
    assert cache.layer(0).positions.shape == (2, 5)
    torch.testing.assert_close(out, poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)[:, :, 3:])


def test_gate_keys_must_be_given_at_every_append():
    enc = build("cope", gates="separate")
    q, k, v = make_qkv(Tq=4, Tk=4)
    cache = KVCache(num_layers=1)
    cached_attention(q[:, :, :2], k[:, :, :2], v[:, :, :2], enc, cache, 0, torch.arange(2), gate_keys=k[:, :, :2])
    with pytest.raises(ValueError, match="gate_keys must be given at every append or never"):
        cache.append(0, k[:, :, 2:], v[:, :, 2:], torch.arange(2, 4))


@pytest.mark.parametrize("name", ["pope", "rope", "alibi", "cope", "relative"])
def test_backpropagating_through_several_decode_steps_equals_the_full_forward(name):
    # the cache grows out of place while autograd needs the views earlier steps attended to
    enc = build(name)
    q, k, v = make_qkv(B=1, H=4, Hkv=2, Tq=6, Tk=6, requires_grad=True)
    cache, outs = KVCache(num_layers=1), []
    for a, b in [(0, 2), (2, 3), (3, 4), (4, 6)]:
        outs.append(cached_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], enc, cache, 0, torch.arange(a, b)))
    params = [p for p in enc.parameters() if p.requires_grad]
    out = torch.cat(outs, 2)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, *params))
    ref = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v, *params))
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("budget", [0, None])  # recomputed probabilities / kept from the forward
@pytest.mark.parametrize("name", ["pope", "alibi"])
def test_blocked_backward_is_exact_whether_probabilities_are_kept_or_recomputed(name, budget, monkeypatch):
    from poskit.attention import blocked as blocked_module

    if budget is not None:
        monkeypatch.setattr(blocked_module, "SAVE_PROBS_BYTES", budget)
    calls = []
    original = blocked_module._block_probs
    monkeypatch.setattr(blocked_module, "_block_probs", lambda *a: calls.append(1) or original(*a))
    enc = build(name)
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=70, Tk=70, requires_grad=True)  # two query blocks
    params = [p for p in enc.parameters() if p.requires_grad]
    out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    assert route(enc, q) == "blocked" and len(calls) == 2
    upstream = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v, *params), upstream, retain_graph=True)
    assert len(calls) == (4 if budget == 0 else 2)  # the backward recomputed both blocks, or reused them
    second = torch.autograd.grad(out, (q, k, v, *params), upstream)  # kept probabilities are not consumed
    ref = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref, (q, k, v, *params), upstream)
    for a, b, r in zip(first, second, ref_grads):
        torch.testing.assert_close(a, r)
        torch.testing.assert_close(b, r)


@pytest.mark.parametrize("name", ["pope", "alibi"])
def test_blocked_path_in_chunks_of_batch_rows_is_exact(name, monkeypatch):
    # one batch row per chunk, with per-sequence positions, key padding and GQA: every slice must line up
    from poskit.attention import blocked as blocked_module

    monkeypatch.setattr(blocked_module, "CHUNK_BYTES", 1)
    enc = build(name)
    q, k, v = make_qkv(B=3, H=4, Hkv=2, Tq=40, Tk=70, requires_grad=True)
    kp = torch.stack([torch.arange(70), torch.arange(70) + 5, torch.arange(70) * 2])
    qp = kp[:, 30:]
    pad = torch.ones(3, 70, dtype=torch.bool)
    pad[1, :7] = False
    kw = dict(q_positions=qp, k_positions=kp, attn_mask=pad[:, None, None, :])
    params = [p for p in enc.parameters() if p.requires_grad]
    out = poskit.attention(q, k, v, enc, **{"is_causal": True, **kw}, enable_gqa=True)
    ref = poskit.attention(q, k, v, enc, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True)
    torch.testing.assert_close(out, ref)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, *params), upstream)
    ref_grads = torch.autograd.grad(ref, (q, k, v, *params), upstream)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    assert len(blocked_module._batch_chunks(3, 4, 64, 70, 8)) == 3


def test_cache_append_rejects_mismatched_tensors():
    cache = KVCache(num_layers=1)
    k = torch.zeros(2, 2, 3, 16)
    with pytest.raises(ValueError, match="keys and values must be"):
        cache.append(0, k, torch.zeros(2, 2, 4, 16), torch.arange(3))
    with pytest.raises(ValueError, match=r"positions must be \(T,\) or \(1\|B, T\) with T=3"):
        cache.append(0, k, torch.zeros(2, 2, 3, 16), torch.arange(4))
    with pytest.raises(ValueError, match="positions must be"):
        cache.append(0, k, torch.zeros(2, 2, 3, 16), torch.zeros(3, 3, dtype=torch.long))
    assert cache.length == 0  # nothing was half-appended
