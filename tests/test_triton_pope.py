"""Tests of the fused PoPE Triton kernel against a float64 reference.

Tensors live on CUDA when a GPU is present (compiled kernels), else on CPU under the Triton
interpreter; tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported when there is no GPU
and provides the `triton_device` fixture.
"""

import math

import pytest
import torch
from extras import need

need("triton", "triton")

from conftest import BF16_NEEDS_CUDA, require_runnable_kernels  # noqa: E402

from poskit.attention.triton_pope import kernels_interpreted, pope_attention_triton  # noqa: E402

require_runnable_kernels(kernels_interpreted(), "poskit.attention.triton_pope")


# ---------------------------------------------------------------------------
# float64 reference: eq. 5 of the paper, materialising all logits
# ---------------------------------------------------------------------------
def _theta(D):
    return 10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)


def reference(q, k, v, delta, q_positions, k_positions, *, causal, scale, softplus=True,
              key_padding_mask=None):
    q, k, v, delta = (t.to(torch.float64) for t in (q, k, v, delta))
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=1)  # HF repeat_kv order
    v = v.repeat_interleave(H // Hkv, dim=1)
    mu_q = torch.nn.functional.softplus(q) if softplus else q
    mu_k = torch.nn.functional.softplus(k) if softplus else k
    qp = q_positions.to(q.device).reshape(-1, Tq).to(torch.float64)  # (1 or B, Tq)
    kp = k_positions.to(q.device).reshape(-1, Tk).to(torch.float64)
    theta = _theta(D).to(q.device)
    a_q = qp[..., None] * theta  # (1|B, Tq, D)
    a_k = kp[..., None] * theta
    # (B, H, Tq, Tk, D): cos((s - t) theta_c + delta_c)
    ang = a_k[:, None, None, :, :] - a_q[:, None, :, None, :] + delta[None, :, None, None, :]
    logits = scale * (mu_q[:, :, :, None, :] * mu_k[:, :, None, :, :] * torch.cos(ang)).sum(-1)
    visible = torch.ones_like(logits, dtype=torch.bool)
    if causal:
        visible = visible & (kp[:, None, None, :] <= qp[:, None, :, None])
    if key_padding_mask is not None:
        visible = visible & key_padding_mask.to(q.device)[:, None, None, :]
    logits = logits.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # rows without keys -> 0
    return probs @ v


def tables(positions, D):
    """fp32 cos/sin tables computed in float64, as callers do."""
    ang = positions.to(torch.float64)[..., None] * _theta(D).to(positions.device)
    return torch.cos(ang).float(), torch.sin(ang).float()


def make_inputs(device, B, H, Hkv, Tq, Tk, D, Dv, dtype=torch.float32, seed=0, zero_delta=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g)
    k = torch.randn(B, Hkv, Tk, D, generator=g)
    v = torch.randn(B, Hkv, Tk, Dv, generator=g)
    delta = torch.zeros(H, D) if zero_delta else -2 * math.pi * torch.rand(H, D, generator=g)
    return [t.to(device, dtype if t is not delta else torch.float32).requires_grad_()
            for t in (q, k, v, delta)]


def run_both(q, k, v, delta, q_positions, k_positions, *, causal, softplus=True, key_padding_mask=None,
             seed=1):
    """Output and (dq, dk, dv, ddelta) of kernel and reference for the same upstream gradient."""
    D = q.shape[-1]
    scale = D ** -0.5
    qc, qs = tables(q_positions, D)
    kc, ks = tables(k_positions, D)
    out = pope_attention_triton(q, k, v, delta, qc, qs, kc, ks, is_causal=causal, scale=scale,
                                q_positions=q_positions, k_positions=k_positions, softplus=softplus,
                                key_padding_mask=key_padding_mask)
    ref = reference(q, k, v, delta, q_positions, k_positions, causal=causal, scale=scale,
                    softplus=softplus, key_padding_mask=key_padding_mask)
    g = torch.Generator().manual_seed(seed)
    dout = torch.randn(out.shape, generator=g).to(out.device)
    grads = torch.autograd.grad(out, (q, k, v, delta), dout.to(out.dtype))
    ref_grads = torch.autograd.grad(ref, (q, k, v, delta), dout.to(torch.float64))
    return out, ref, grads, ref_grads


def assert_close(got, want, rtol, name=""):
    """max-abs error relative to the reference's max magnitude."""
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err = (got - want).abs().max().item()
    mag = max(want.abs().max().item(), 1e-6)
    assert err <= rtol * mag, f"{name}: max abs err {err:.3e} vs max |ref| {mag:.3e} (rtol {rtol})"


def check_all(out, ref, grads, ref_grads, rtol):
    assert_close(out, ref, rtol, "out")
    for name, g, rg in zip(("dq", "dk", "dv", "ddelta"), grads, ref_grads):
        assert_close(g, rg, rtol, name)


def ar(device, start, n):
    return torch.arange(start, start + n, device=device)


# ---------------------------------------------------------------------------
# correctness against the reference
# ---------------------------------------------------------------------------
CASES = {
    # name: (B, H, Hkv, Tq, Tk, D, Dv)
    "square": (2, 2, 2, 50, 50, 32, 32),
    "gqa_odd_dv": (1, 4, 2, 37, 50, 32, 24),
    "mqa_d16": (1, 4, 1, 40, 40, 16, 16),
    "d48_padded_dim": (1, 2, 2, 33, 45, 48, 64),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, causal, triton_device):
    B, H, Hkv, Tq, Tk, D, Dv = CASES[case]
    q, k, v, delta = make_inputs(triton_device, B, H, Hkv, Tq, Tk, D, Dv)
    # queries are the last Tq positions (prefill with a cache when Tq < Tk)
    res = run_both(q, k, v, delta, ar(triton_device, Tk - Tq, Tq), ar(triton_device, 0, Tk), causal=causal)
    check_all(*res, rtol=1e-4)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_large_head_dims(D, triton_device):
    # one head, T=33 (a ragged second block of 1 row/key): forward and every gradient at the head dims
    # models use; the padded BLOCK_D equals D here, unlike the d48 case
    q, k, v, delta = make_inputs(triton_device, 1, 1, 1, 33, 33, D, D, seed=D)
    res = run_both(q, k, v, delta, ar(triton_device, 0, 33), ar(triton_device, 0, 33), causal=True)
    check_all(*res, rtol=1e-4)


@pytest.mark.parametrize("mode", ["loop", "split"])
def test_gqa_dkdv_modes(mode, monkeypatch, triton_device):
    from poskit.attention import triton_pope

    monkeypatch.setattr(triton_pope, "GQA_DKDV_MODE", mode)
    q, k, v, delta = make_inputs(triton_device, 1, 4, 2, 37, 50, 32, 24)
    res = run_both(q, k, v, delta, ar(triton_device, 13, 37), ar(triton_device, 0, 50), causal=True)
    check_all(*res, rtol=1e-4)


def test_no_softplus(triton_device):
    q, k, v, delta = make_inputs(triton_device, 1, 2, 1, 37, 50, 32, 32)
    res = run_both(q, k, v, delta, ar(triton_device, 13, 37), ar(triton_device, 0, 50), causal=True,
                   softplus=False)
    check_all(*res, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask(causal, triton_device):
    B, Tq, Tk = 3, 37, 50  # Tk not a multiple of the block
    q, k, v, delta = make_inputs(triton_device, B, 4, 2, Tq, Tk, 32, 32)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(B, Tk, generator=g) > 0.3
    mask[1, :20] = False  # left padding: early causal rows see nothing
    mask[2] = False  # a sequence with no keys at all
    mask = mask.to(triton_device)
    out, ref, grads, ref_grads = run_both(q, k, v, delta, ar(triton_device, Tk - Tq, Tq), ar(triton_device, 0, Tk),
                                          causal=causal, key_padding_mask=mask)
    check_all(out, ref, grads, ref_grads, rtol=1e-4)
    assert (out[2] == 0).all() and (grads[0][2] == 0).all() and (grads[1][2] == 0).all()
    # padded keys get exactly zero dk, dv
    assert (grads[1][~mask[:, None, :].expand(-1, 2, -1)] == 0).all()
    assert (grads[2][~mask[:, None, :].expand(-1, 2, -1)] == 0).all()


def test_rows_without_visible_keys_are_zero(triton_device):
    # keys start at position 10: causal query rows at positions < 10 see nothing
    q, k, v, delta = make_inputs(triton_device, 1, 2, 2, 40, 45, 32, 32)
    out, ref, grads, ref_grads = run_both(q, k, v, delta, ar(triton_device, 0, 40), ar(triton_device, 10, 45),
                                          causal=True)
    check_all(out, ref, grads, ref_grads, rtol=1e-4)
    assert (out[:, :, :10] == 0).all()
    assert (grads[0][:, :, :10] == 0).all()


@pytest.mark.parametrize("t", [69, 40, 0])
def test_decode_single_query_against_cache(t, triton_device):
    # Tq=1: one query at position t against 70 cached keys at positions 0..69; only keys 0..t are visible
    # (t=69 the usual decode step, t=40 a query in the middle of the cache, t=0 a single visible key)
    q, k, v, delta = make_inputs(triton_device, 2, 4, 2, 1, 70, 32, 32, seed=t)
    out, ref, grads, ref_grads = run_both(q, k, v, delta, ar(triton_device, t, 1), ar(triton_device, 0, 70),
                                          causal=True)
    # keys after the query get exactly no gradient
    assert (grads[1][:, :, t + 1:] == 0).all() and (grads[2][:, :, t + 1:] == 0).all()
    if t > 0:
        check_all(out, ref, grads, ref_grads, rtol=1e-4)
        return
    # one visible key: the output is its value row (for each query head of the kv group), the softmax
    # has no gradient, so dq, dk and ddelta vanish up to fp32 rounding and dv collects dout
    assert_close(out, ref, 1e-4, "out")
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0].repeat_interleave(2, dim=1), rtol=1e-5, atol=1e-6)
    assert_close(grads[2], ref_grads[2], 1e-4, "dv")
    for name, g in zip(("dq", "dk", "ddelta"), (grads[0], grads[1], grads[3])):
        assert g.abs().max() < 1e-5, name


@pytest.mark.parametrize("batched", ["leading_one", "per_batch"])
def test_batched_positions_and_tables(batched, triton_device):
    B, Tq, Tk, D = 2, 37, 50, 32
    q, k, v, delta = make_inputs(triton_device, B, 2, 1, Tq, Tk, D, 16)
    if batched == "per_batch":
        kpos = torch.stack([ar(triton_device, 0, Tk), ar(triton_device, 100, Tk)])  # different offsets per sequence
    else:  # (1, T) positions and (1, T, D) tables broadcast over the batch, as the engine passes them
        kpos = ar(triton_device, 7, Tk)[None]
    qpos = kpos[:, Tk - Tq:]
    res = run_both(q, k, v, delta, qpos, kpos, causal=True)
    assert tables(qpos, D)[0].shape == (kpos.shape[0], Tq, D)
    check_all(*res, rtol=1e-4)


def test_unsorted_positions(triton_device):
    # block skipping must stay exact for any position order
    g = torch.Generator().manual_seed(5)
    q, k, v, delta = make_inputs(triton_device, 1, 2, 2, 45, 70, 32, 32)
    kpos = torch.randperm(70, generator=g).to(triton_device)
    qpos = torch.randperm(70, generator=g)[:45].to(triton_device)
    res = run_both(q, k, v, delta, qpos, kpos, causal=True)
    check_all(*res, rtol=1e-4)


def test_non_contiguous_inputs(triton_device):
    B, T, H, D = 1, 40, 2, 32
    g = torch.Generator().manual_seed(7)
    # (B, T, H, D) projections viewed as (B, H, T, D)
    q = torch.randn(B, T, H, D, generator=g).to(triton_device).transpose(1, 2).requires_grad_()
    k = torch.randn(B, T, H, D, generator=g).to(triton_device).transpose(1, 2).requires_grad_()
    v = torch.randn(B, T, H, D, generator=g).to(triton_device).transpose(1, 2).requires_grad_()
    delta = (-torch.rand(H, D, generator=g)).to(triton_device).requires_grad_()
    assert not q.is_contiguous()
    res = run_both(q, k, v, delta, ar(triton_device, 0, T), ar(triton_device, 0, T), causal=True)
    check_all(*res, rtol=1e-4)


def test_fp16(triton_device):
    q, k, v, delta = make_inputs(triton_device, 1, 4, 2, 37, 50, 32, 32, dtype=torch.float16)
    out, ref, grads, ref_grads = run_both(q, k, v, delta, ar(triton_device, 13, 37), ar(triton_device, 0, 50),
                                          causal=True)
    assert out.dtype == torch.float16
    assert grads[0].dtype == torch.float16 and grads[3].dtype == torch.float32
    check_all(out, ref, grads, ref_grads, rtol=2e-2)


@BF16_NEEDS_CUDA
def test_bf16(triton_device):
    q, k, v, delta = make_inputs(triton_device, 1, 4, 2, 37, 50, 32, 32, dtype=torch.bfloat16)
    out, ref, grads, ref_grads = run_both(q, k, v, delta, ar(triton_device, 13, 37), ar(triton_device, 0, 50),
                                          causal=True)
    assert out.dtype == torch.bfloat16
    assert grads[3].dtype == torch.float32  # delta's gradient stays fp32
    check_all(out, ref, grads, ref_grads, rtol=5e-2)


def test_large_positions_relative(triton_device):
    """Only relative positions matter: an offset of 1e6 gives the same result."""
    Tq = Tk = 40
    q, k, v, delta = make_inputs(triton_device, 1, 2, 2, Tq, Tk, 32, 32)
    D = 32

    def run(offset):
        qpos, kpos = ar(triton_device, offset, Tq), ar(triton_device, offset, Tk)
        qc, qs = tables(qpos, D)
        kc, ks = tables(kpos, D)
        return pope_attention_triton(q, k, v, delta, qc, qs, kc, ks, is_causal=True, scale=D ** -0.5,
                                     q_positions=qpos, k_positions=kpos)

    with torch.no_grad():
        a, b = run(0), run(1_000_000)
    assert (a - b).abs().max().item() < 1e-3


def test_torch_compile(triton_device):
    q, k, v, delta = make_inputs(triton_device, 1, 2, 1, 40, 40, 32, 32)
    pos = ar(triton_device, 0, 40)
    c, s = tables(pos, 32)

    def fn(q, k, v, delta):
        out = pope_attention_triton(q * 1.0, k, v, delta, c, s, c, s, is_causal=True, scale=0.2,
                                    q_positions=pos, k_positions=pos)
        return (out * out).sum()

    loss = fn(q, k, v, delta)
    grads = torch.autograd.grad(loss, (q, k, v, delta))
    torch._dynamo.reset()
    # aot_eager traces through dynamo + AOTAutograd (fake kernels, registered autograd)
    # without compiling C++ for the CPU; inductor on CPU works too but costs ~35 s cold.
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    loss_c = compiled(q, k, v, delta)
    grads_c = torch.autograd.grad(loss_c, (q, k, v, delta))
    torch.testing.assert_close(loss_c, loss)
    for g, gc in zip(grads, grads_c):
        torch.testing.assert_close(gc, g)


# ---------------------------------------------------------------------------
# argument validation
# ---------------------------------------------------------------------------
def _valid_args(device, B=1, H=4, Hkv=2, Tq=8, Tk=8, D=32, Dv=32):
    q = torch.randn(B, H, Tq, D, device=device)
    k = torch.randn(B, Hkv, Tk, D, device=device)
    v = torch.randn(B, Hkv, Tk, Dv, device=device)
    delta = torch.zeros(H, D, device=device)
    qc, qs = tables(ar(device, 0, Tq), D)
    kc, ks = tables(ar(device, 0, Tk), D)
    kw = dict(is_causal=True, scale=0.1, q_positions=ar(device, 0, Tq), k_positions=ar(device, 0, Tk))
    return [q, k, v, delta, qc, qs, kc, ks], kw


@pytest.mark.parametrize("mutate, match", [
    (lambda a, kw: (a.__setitem__(1, torch.randn(1, 3, 8, 32)), a.__setitem__(2, torch.randn(1, 3, 8, 32))),
     "divisible"),
    (lambda a, kw: a.__setitem__(0, torch.randn(1, 4, 8, 8)), "head dim"),
    (lambda a, kw: a.__setitem__(0, a[0].double()), "dtype"),
    (lambda a, kw: a.__setitem__(2, a[2].half()), "share a dtype"),
    (lambda a, kw: a.__setitem__(3, torch.zeros(2, 32)), "delta"),
    (lambda a, kw: a.__setitem__(4, torch.zeros(9, 32)), "q_cos"),
    (lambda a, kw: a.__setitem__(4, torch.zeros(2, 8, 32)), r"q_cos must have shape \(8, 32\), \(1, 8, 32\)"),
    (lambda a, kw: a.__setitem__(7, torch.zeros(8, 16)), "k_sin"),
    (lambda a, kw: kw.__setitem__("q_positions", torch.arange(8.0)), "q_positions"),
    (lambda a, kw: kw.__setitem__("k_positions", torch.arange(5)), "k_positions"),
    (lambda a, kw: kw.__setitem__("k_positions", torch.zeros(3, 8, dtype=torch.long)), r"k_positions .*\(1, 8\)"),
    (lambda a, kw: kw.__setitem__("key_padding_mask", torch.ones(1, 8)), "key_padding_mask"),
    (lambda a, kw: a.__setitem__(0, torch.randn(4, 8, 32)), "4-D"),
])
def test_validation(mutate, match, triton_device):
    args, kw = _valid_args(triton_device)
    mutate(args, kw)
    args = [a.to(triton_device) for a in args]
    kw = {n: a.to(triton_device) if isinstance(a, torch.Tensor) else a for n, a in kw.items()}
    with pytest.raises(ValueError, match=match):
        pope_attention_triton(*args, **kw)


def test_causal_keyword_is_is_causal_and_the_old_spelling_still_works_with_a_warning(triton_device):
    args, kw = _valid_args(triton_device, H=2, Hkv=2, Tq=4, Tk=4, D=16, Dv=16)
    kw.pop("is_causal")
    with torch.no_grad():
        new = pope_attention_triton(*args, is_causal=True, **kw)
        with pytest.warns(DeprecationWarning, match=r"^pope_attention_triton\(\): causal= is deprecated, use is_causal="):
            old = pope_attention_triton(*args, causal=True, **kw)
    assert torch.equal(new, old)
    with pytest.raises(TypeError, match="missing the keyword argument 'is_causal'"):
        pope_attention_triton(*args, **kw)


def test_a_launch_that_needs_more_shared_memory_than_the_gpu_has_is_retried_smaller(monkeypatch):
    # seen on an H100: fp32 tiles at head dim 128 asked for 262656 bytes of its 232448; the launch must shrink
    # (pipeline stages, then key blocks) and remember what fitted, not fail
    from triton.runtime.errors import OutOfResources

    from poskit.attention import triton_pope as tp

    monkeypatch.setattr(tp, "_FITTED", {})
    device = torch.device("cuda", 0)  # the configuration of a GPU; nothing is launched on it here
    tried = []

    def launch(bm, bn, warps, stages):
        tried.append((bm, bn, warps, stages))
        if stages * bn * 128 * 4 * 3 > 120_000:  # a stand-in for the shared memory the tiles need
            raise OutOfResources(300_000, 232_448, "shared memory")
        return "ran"

    assert tp._launch_fitting("fwd", 128, device, 1000, torch.float32, launch) == "ran"
    assert tried == [(128, 64, 8, 2), (128, 64, 8, 1)]
    assert tp._config("fwd", 128, device, 1000, torch.float32) == (128, 64, 8, 1)  # remembered
    assert tp._config("fwd", 128, device, 1000, torch.bfloat16) == (128, 64, 8, 2)  # per dtype
    assert tp._config("fwd", 128, device, 5, torch.float32) == (16, 64, 8, 1)  # few queries: BLOCK_M down to 16

    def never(*config):
        raise OutOfResources(10**9, 232_448, "shared memory")

    with pytest.raises(OutOfResources):
        tp._launch_fitting("bwd_dq", 64, device, 1000, torch.float32, never)
    assert tp._FITTED[("bwd_dq", 64, torch.float32, "cuda:0")] == (16, 16, 4, 1)  # shrunk to the end, then raised
