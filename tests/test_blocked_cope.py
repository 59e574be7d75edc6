"""Blocked CoPE (attention/blocked_cope.py) against the materialised float64 reference, forward and backward."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import poskit
from poskit.attention import KVCache, cached_attention
from poskit.attention import blocked_cope as bc
from poskit.attention.blocked_cope import blocked_cope_attention
from poskit.attention.engine import route
from poskit.attention.inputs import prepare

# (encoding, options): the variants of the paper (gates from keys, values or separate keys; cope-alibi)
VARIANTS = {
    "keys": ("cope", dict(init_std=1.0)),
    "values": ("cope", dict(init_std=1.0, gates="values")),
    "separate": ("cope", dict(init_std=1.0, gates="separate")),
    "alibi": ("cope-alibi", dict()),
    "alibi-learned": ("cope-alibi", dict(learned_slopes=True)),
}



def attend(q, k, v, enc, *, causal=True, key_padding_mask=None, **kw):
    """poskit.attention with this file's spelling: causal by default, GQA allowed, and a (B, Tk) key padding
    mask (True = real key) passed as SDPA's bool attn_mask (True = attend)."""
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    return poskit.attention(q, k, v, enc, is_causal=causal, attn_mask=mask, enable_gqa=True, **kw)

def make_encoding(variant, H, D, p_max, seed=0):
    name, options = VARIANTS[variant]
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, p_max=p_max, **options).double()
    if variant == "alibi-learned":  # learned slopes start at 0: give them values whose gradient matters
        with torch.no_grad():
            enc.slopes.copy_(torch.randn(H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return enc


def run_blocked(enc, q, k, v, gate_keys=None, block=4, **kw):
    """blocked_cope_attention with the encoding's operands, as the engine calls it."""
    kw = dict(dict(causal=True, q_positions=None, k_positions=None), **kw)
    inp = prepare(q, k, v, enc, scale=None, **kw)
    source = enc.gate_source(k, v, gate_keys)
    pos_emb, slopes = enc.fused_operands()
    return blocked_cope_attention(q, k, v, scale=inp.scale, q_positions=inp.q_positions, k_positions=inp.k_positions,
                                  causal=inp.causal, p_max=enc.p_max, pos_emb=pos_emb, slopes=slopes,
                                  gate_keys=None if source is k else source, key_padding_mask=inp.key_padding_mask,
                                  block=block)


def assert_matches_reference(enc, q, k, v, gate_keys=None, block=4, seed=0, **kw):
    got = run_blocked(enc, q, k, v, gate_keys, block, **kw)
    want = attend(q, k, v, enc, gate_keys=gate_keys, backend="reference", **kw)
    torch.testing.assert_close(got, want, atol=1e-11, rtol=0)
    inputs = [q, k, v] + ([gate_keys] if gate_keys is not None else []) + \
        [p for p in enc.parameters() if p.requires_grad]
    w = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed))
    got_grads = torch.autograd.grad(got, inputs, w, allow_unused=True)
    want_grads = torch.autograd.grad(want, inputs, w, allow_unused=True)
    for n, (g, r) in enumerate(zip(got_grads, want_grads)):
        r = torch.zeros_like(inputs[n]) if r is None else r
        g = torch.zeros_like(inputs[n]) if g is None else g
        torch.testing.assert_close(g, r, atol=1e-10, rtol=0, msg=lambda m: f"gradient of input {n}: {m}")


def qkv(B, H, Hkv, Tq, Tk, D, seed, gate_keys=False, logit_gain=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (logit_gain * torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)).requires_grad_()
    k, v, gk = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    return q, k, v, (gk if gate_keys else None)


@settings(max_examples=60, deadline=None)
@given(
    variant=st.sampled_from(list(VARIANTS)),
    B=st.integers(1, 2), Hkv=st.integers(1, 2), groups=st.sampled_from([1, 2]),
    Tk=st.integers(1, 40), n_new=st.integers(1, 40), D=st.sampled_from([4, 8]),
    p_max=st.sampled_from([1, 2, 3, 7]), block=st.integers(1, 12),
    causal=st.booleans(), padding=st.booleans(), batch_positions=st.booleans(), seed=st.integers(0, 2**16),
)
def test_blocked_cope_equals_reference(variant, B, Hkv, groups, Tk, n_new, D, p_max, block, causal, padding,
                                       batch_positions, seed):
    # ragged T (any block size against any length), GQA, the decode layout (the last n_new of Tk tokens),
    # per-sequence positions, padding, non-causal
    Tq = min(n_new, Tk)
    enc = make_encoding(variant, Hkv * groups, D, p_max, seed)
    q, k, v, gk = qkv(B, Hkv * groups, Hkv, Tq, Tk, D, seed, gate_keys=variant == "separate")
    kw = dict(causal=causal, q_positions=torch.arange(Tk - Tq, Tk), k_positions=torch.arange(Tk))
    if batch_positions:  # sequence b shifted by 3 b, keys still non-decreasing
        kw = dict(causal=causal, q_positions=kw["q_positions"] + 3 * torch.arange(B)[:, None],
                  k_positions=kw["k_positions"] + 3 * torch.arange(B)[:, None])
    if padding:
        kw["key_padding_mask"] = torch.rand(B, Tk, generator=torch.Generator().manual_seed(seed)) > 0.3
    assert_matches_reference(enc, q, k, v, gk, block=block, seed=seed, **kw)


def aligned_qkv(seed, gate_gain=None, T=64, D=8):
    """q and k near one direction u (content logits about 3 |u|^2 / sqrt(D): gates near 1); separate gate
    keys gate_gain * u (negative: gates near 0)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(D, generator=g, dtype=torch.float64)
    noise = lambda: 0.1 * torch.randn(1, 2, T, D, generator=g, dtype=torch.float64)  # noqa: E731
    q, k = u + noise(), 3 * u + noise()
    v = torch.randn(1, 2, T, D, generator=g, dtype=torch.float64)
    gk = None if gate_gain is None else gate_gain * u + noise()
    return [None if x is None else x.requires_grad_() for x in (q, k, v, gk)]


class _Widths:
    """Records (window width, visible key count) of every block the blocked path recomputes."""

    def __init__(self, monkeypatch):
        self.seen = []
        original = bc._Setup.recompute

        def recompute(setup, st_):
            blk = original(setup, st_)
            self.seen.append((blk.width, st_.ke))
            return blk
        monkeypatch.setattr(bc._Setup, "recompute", recompute)


@pytest.mark.parametrize("variant", ["keys", "separate", "alibi-learned"])
def test_saturated_rows_take_the_near_key_window(variant, monkeypatch):
    # gates near 1 (large logits) saturate p_max = 3 after a few keys: the far keys get the constant bias
    widths = _Widths(monkeypatch)
    enc = make_encoding(variant, 2, 8, 3)
    q, k, v, gk = aligned_qkv(seed=1, gate_gain=3.0 if variant == "separate" else None)
    assert_matches_reference(enc, q, k, v, gk, block=8)
    assert any(width < ke for width, ke in widths.seen), widths.seen


def test_rows_that_never_saturate_use_the_whole_row(monkeypatch):
    # separate gate keys opposite to q: gates near 0, the gate sums never reach p_max - 1 = 6
    widths = _Widths(monkeypatch)
    enc = make_encoding("separate", 2, 8, 7)
    q, k, v, gk = aligned_qkv(seed=2, gate_gain=-3.0)
    assert_matches_reference(enc, q, k, v, gk, block=8)
    assert any(width == ke and ke > 8 + 4 * 7 for width, ke in widths.seen), widths.seen


class _LargestOutput(TorchDispatchMode):
    """The largest number of elements any aten op produces while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("variant", ["keys", "alibi-learned"])
def test_no_tensor_of_size_t_by_t_forward_and_backward(variant, monkeypatch):
    monkeypatch.setenv("POSKIT_CPU_KERNEL", "0")  # the blocked path (the compiled kernel serves gates from keys)
    B, H, T, D = 1, 2, 512, 8
    enc = make_encoding(variant, H, D, 16).float()
    q, k, v, _ = qkv(B, H, H, T, T, D, seed=3)
    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    assert route(enc, q, k) == "blocked-contextual"
    with _LargestOutput() as mode:
        out = attend(q, k, v, enc)
        out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    # one block of queries against every key, per head: never the (T, T) logits
    assert mode.largest <= B * H * bc.DEFAULT_BLOCK * T < B * H * T * T, mode.largest


@pytest.mark.parametrize("variant", ["keys", "separate", "alibi"])
def test_kv_cache_decode_takes_the_blocked_path_and_equals_the_full_forward(variant):
    B, H, Hkv, T, D = 2, 4, 2, 13, 8
    enc = make_encoding(variant, H, D, 4)
    q, k, v, gk = qkv(B, H, Hkv, T, T, D, seed=4, gate_keys=variant == "separate")
    full = attend(q, k, v, enc, gate_keys=gk, backend="reference")
    cache = KVCache(num_layers=1)
    prefill = 5
    out = cached_attention(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill], enc, cache, 0,
                           torch.arange(prefill), gate_keys=None if gk is None else gk[:, :, :prefill])
    rows = [out]
    for t in range(prefill, T):
        assert route(enc, q[:, :, t:t + 1], cache.layer(0).keys, enable_gqa=True) == "blocked-contextual"
        rows.append(cached_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0,
                                     torch.tensor([t]), gate_keys=None if gk is None else gk[:, :, t:t + 1]))
    torch.testing.assert_close(torch.cat(rows, 2), full, atol=1e-11, rtol=0)


def test_fp32_and_bf16_inputs_stay_close_to_the_float64_reference():
    enc = make_encoding("keys", 2, 8, 5)
    q, k, v, _ = qkv(2, 2, 2, 40, 40, 8, seed=5)
    want = attend(q, k, v, enc, backend="reference")
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        low = enc.to(dtype)
        got = run_blocked(low, *(x.detach().to(dtype) for x in (q, k, v)), causal=True, q_positions=None,
                          k_positions=None)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)
        enc.double()


def test_bad_arguments_are_named():
    q = k = v = torch.randn(1, 2, 4, 8)
    pos = torch.arange(4)[None]
    kw = dict(scale=1.0, q_positions=pos, k_positions=pos, causal=True, p_max=3)
    with pytest.raises(ValueError, match="exactly one of pos_emb"):
        blocked_cope_attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="exactly one of pos_emb"):
        blocked_cope_attention(q, k, v, pos_emb=torch.zeros(8, 3), slopes=torch.zeros(2), **kw)
    with pytest.raises(ValueError, match=r"pos_emb must have shape \(8, 3\)"):
        blocked_cope_attention(q, k, v, pos_emb=torch.zeros(8, 4), **kw)
    with pytest.raises(ValueError, match=r"slopes must have shape \(2,\)"):
        blocked_cope_attention(q, k, v, slopes=torch.zeros(3), **kw)
    with pytest.raises(ValueError, match="p_max must be an int >= 1"):
        blocked_cope_attention(q, k, v, slopes=torch.zeros(2), **dict(kw, p_max=0))
    with pytest.raises(ValueError, match="k_positions must be non-decreasing"):
        blocked_cope_attention(q, k, v, slopes=torch.zeros(2), **dict(kw, k_positions=pos.flip(-1)))
