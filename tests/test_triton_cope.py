"""Tests of the fused CoPE Triton kernels against a float64 reference.

Tensors live on CUDA when a GPU is present (compiled kernels), else on CPU under the Triton
interpreter; tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported when there is no GPU
and provides the `triton_device` fixture.
"""
import pytest
import torch
from extras import need

need("triton", "triton")

from conftest import BF16_NEEDS_CUDA, require_runnable_kernels  # noqa: E402

from poskit.attention.triton_cope import cope_attention_triton, kernels_interpreted  # noqa: E402

require_runnable_kernels(kernels_interpreted(), "poskit.attention.triton_cope")


# ---------------------------------------------------------------------------------
# independent float64 reference: the Appendix B listing, generalised to heads / GQA
# ---------------------------------------------------------------------------------
def cope_reference(q, k, v, pos_emb, *, causal, scale, q_positions, k_positions, p_max,
                   gate_keys=None, key_padding_mask=None, slopes=None):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    rep = H // Hkv
    k = k.repeat_interleave(rep, dim=1)  # HF repeat_kv order: head h -> kv head h // rep
    v = v.repeat_interleave(rep, dim=1)
    mask = torch.ones(B, 1, Tq, Tk, dtype=torch.bool, device=q.device)
    if causal:
        qp = torch.as_tensor(q_positions, device=q.device).reshape(-1, Tq)
        kp = torch.as_tensor(k_positions, device=q.device).reshape(-1, Tk)
        mask = mask & (kp[:, None, None, :] <= qp[:, None, :, None])
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, None, None, :]
    attn_logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    attn_logits = attn_logits + mask.to(q.dtype).log()
    if gate_keys is None:
        gate_logits = attn_logits
    else:
        gk = gate_keys.repeat_interleave(rep, dim=1)
        gate_logits = torch.matmul(q, gk.transpose(-1, -2)) * scale + mask.to(q.dtype).log()
    # --- CoPE.forward (listing lines 9-20) ---
    gates = torch.sigmoid(gate_logits)
    pos = gates.flip(-1).cumsum(dim=-1).flip(-1)
    pos = pos.clamp(max=p_max - 1)
    if slopes is None:
        pos_ceil = pos.ceil().long()
        pos_floor = pos.floor().long()
        logits_int = torch.matmul(q, pos_emb)
        logits_ceil = logits_int.gather(-1, pos_ceil)
        logits_floor = logits_int.gather(-1, pos_floor)
        w = pos - pos_floor
        bias = logits_ceil * w + logits_floor * (1 - w)
    else:
        bias = -slopes[None, :, None, None] * pos
    attn_logits = attn_logits + bias
    # rows with no visible key -> 0 output (avoid softmax NaN)
    row_ok = mask.any(-1, keepdim=True)
    attn = torch.softmax(torch.where(row_ok, attn_logits, torch.zeros_like(attn_logits)), dim=-1)
    attn = attn * row_ok
    return torch.matmul(attn, v)


def _make(B, H, Hkv, Tq, Tk, D, Dv, p_max, dtype, seed, gates="keys", alibi=False, scale_gk=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q = r(B, H, Tq, D)
    k = r(B, Hkv, Tk, D)
    v = r(B, Hkv, Tk, Dv)
    gk = r(B, Hkv, Tk, D) * scale_gk if gates == "separate" else None
    e = None if alibi else r(D, p_max) * 0.5
    slopes = (torch.rand(H, generator=g) + 0.1) if alibi else None
    return [t.to(device, dtype) if t is not None else None for t in (q, k, v, gk, e, slopes)]


def _run_both(q, k, v, gk, e, slopes, *, gates, grad=True, **kw):
    leaves = [t.clone().requires_grad_(grad) if t is not None else None for t in (q, k, v, gk, e, slopes)]
    q1, k1, v1, gk1, e1, s1 = leaves
    gate_keys = {"keys": None, "separate": gk1, "values": v1}[gates]
    kernel_kw = {("is_causal" if n == "causal" else n): a for n, a in kw.items()}  # the reference says causal=
    out = cope_attention_triton(q1, k1, v1, e1, gate_keys=gate_keys, slopes=s1, **kernel_kw)

    ref_leaves = [t.detach().double().requires_grad_(grad) if t is not None else None for t in leaves]
    q2, k2, v2, gk2, e2, s2 = ref_leaves
    gate_keys2 = {"keys": None, "separate": gk2, "values": v2}[gates]
    kw2 = {n: a for n, a in kw.items() if n not in ("block_m", "block_n")}
    if kw2.get("key_padding_mask") is not None:
        kw2["key_padding_mask"] = kw2["key_padding_mask"].bool()
    ref = cope_reference(q2, k2, v2, e2, gate_keys=gate_keys2, slopes=s2, **kw2)
    if not grad:
        return out, ref, [], []
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(123)).to(out.device)
    (out.float() * go).sum().backward()
    (ref * go.double()).sum().backward()
    return out, ref, leaves, ref_leaves


def _check(out, ref, leaves, ref_leaves, atol, rtol):
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref.detach(), atol=atol, rtol=rtol)
    names = ["q", "k", "v", "gate_keys", "pos_emb", "slopes"]
    for name, a, b in zip(names, leaves, ref_leaves):
        if a is None:
            continue
        assert a.grad is not None, name
        assert torch.isfinite(a.grad).all(), name
        torch.testing.assert_close(a.grad.double(), b.grad, atol=atol, rtol=rtol, msg=lambda m: f"d{name}: {m}")


def _pos(Tq, Tk, device="cpu"):
    return torch.arange(Tk - Tq, Tk, device=device), torch.arange(Tk, device=device)


CASES = [
    # id, B, H, Hkv, Tq, Tk, D, Dv, p_max, causal, gates, alibi
    ("causal_self_37", 1, 2, 2, 37, 37, 16, 16, 64, True, "keys", False),
    ("noncausal_45_odd_dims", 1, 2, 1, 45, 45, 24, 20, 64, False, "keys", False),
    ("gqa_clamp", 2, 4, 2, 45, 45, 16, 16, 8, True, "keys", False),
    ("sep_keys_multi_block", 1, 2, 1, 70, 70, 16, 16, 24, True, "separate", False),
    ("value_gates", 1, 2, 2, 37, 37, 24, 24, 16, True, "values", False),
    ("decode_block", 2, 4, 2, 5, 77, 16, 16, 80, True, "keys", False),
    ("alibi_causal", 1, 2, 1, 45, 45, 16, 16, 12, True, "keys", True),
    ("pmax1", 1, 2, 2, 37, 37, 16, 16, 1, True, "keys", False),
    ("alibi_noncausal_sep", 1, 2, 2, 33, 40, 16, 16, 64, False, "separate", True),
    # head dims models use: one tile of 64 / 128 channels, T=33 leaves a ragged second block
    ("d64_gqa", 1, 2, 1, 33, 33, 64, 64, 16, True, "keys", False),
    ("d128", 1, 1, 1, 33, 33, 128, 128, 16, True, "keys", False),
    ("d64_alibi_sep", 1, 1, 1, 33, 33, 64, 48, 16, True, "separate", True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_backward_fp32(case, triton_device):
    _, B, H, Hkv, Tq, Tk, D, Dv, p_max, causal, gates, alibi = case
    q, k, v, gk, e, slopes = _make(B, H, Hkv, Tq, Tk, D, Dv, p_max, torch.float32, seed=CASES.index(case),
                                   gates=gates, alibi=alibi, device=triton_device)
    qp, kp = _pos(Tq, Tk, triton_device)
    out, ref, leaves, ref_leaves = _run_both(
        q, k, v, gk, e, slopes, gates=gates, causal=causal, scale=D ** -0.5,
        q_positions=qp, k_positions=kp, p_max=p_max)
    assert out.shape == (B, H, Tq, Dv)
    _check(out, ref, leaves, ref_leaves, atol=2e-4, rtol=2e-4)


def test_clamp_active_and_saturated_gates(triton_device):
    # large logits -> gates saturate at exactly 0/1, p hits integers and the clamp
    B, H, Tq, Tk, D, p_max = 1, 2, 40, 40, 16, 6
    q, k, v, gk, e, _ = _make(B, H, H, Tq, Tk, D, D, p_max, torch.float32, seed=7, device=triton_device)
    q = q * 3
    qp, kp = _pos(Tq, Tk, triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates="keys", causal=True, scale=1.0,
                                             q_positions=qp, k_positions=kp, p_max=p_max)
    _check(out, ref, leaves, ref_leaves, atol=5e-4, rtol=5e-4)


def test_key_padding_mask_and_empty_rows(triton_device):
    B, H, Tq, Tk, D, p_max = 2, 2, 36, 36, 16, 40
    q, k, v, gk, e, _ = _make(B, H, 1, Tq, Tk, D, D, p_max, torch.float32, seed=3, device=triton_device)
    kpm = torch.ones(B, Tk, dtype=torch.bool, device=triton_device)
    kpm[0, :5] = False   # left padding: queries 0..4 of batch 0 see no key at all
    kpm[1, 17:21] = False
    qp, kp = _pos(Tq, Tk, triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates="keys", causal=True, scale=D ** -0.5,
                                             q_positions=qp, k_positions=kp, p_max=p_max,
                                             key_padding_mask=kpm)
    assert (out[0, :, :5] == 0).all()
    _check(out, ref, leaves, ref_leaves, atol=2e-4, rtol=2e-4)


def test_batched_positions_2d(triton_device):
    # per-batch positions (B, T): batch 1 has queries at arbitrary later positions and
    # keys with repeated positions (non-decreasing)
    B, H, Tq, Tk, D, p_max = 2, 2, 9, 50, 16, 32
    q, k, v, gk, e, _ = _make(B, H, 2, Tq, Tk, D, D, p_max, torch.float32, seed=11, device=triton_device)
    kp = torch.stack([torch.arange(Tk), torch.arange(Tk) // 2]).to(triton_device)
    qp = torch.stack([torch.arange(Tk - Tq, Tk), torch.tensor([0, 3, 3, 7, 10, 12, 18, 24, 30])]).to(triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates="keys", causal=True, scale=D ** -0.5,
                                             q_positions=qp, k_positions=kp, p_max=p_max)
    _check(out, ref, leaves, ref_leaves, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("t", [76, 40, 0])
def test_decode_single_query(t, triton_device):
    # Tq=1: one query at position t against 77 keys at 0..76; keys after t are masked, so the gate sums
    # start at key t (t=76 the usual decode step, t=40 mid-cache, t=0 a single visible key)
    B, H, Hkv, Tk, D, p_max = 2, 4, 2, 77, 16, 20
    q, k, v, gk, e, _ = _make(B, H, Hkv, 1, Tk, D, D, p_max, torch.float32, seed=t, device=triton_device)
    qp, kp = torch.tensor([t], device=triton_device), torch.arange(Tk, device=triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates="keys", causal=True, scale=D ** -0.5,
                                             q_positions=qp, k_positions=kp, p_max=p_max)
    assert out.shape == (B, H, 1, D)
    _check(out, ref, leaves, ref_leaves, atol=2e-4, rtol=2e-4)
    # keys after the query get exactly no gradient
    assert (leaves[1].grad[:, :, t + 1:] == 0).all() and (leaves[2].grad[:, :, t + 1:] == 0).all()


def test_fp16_forward_backward(triton_device):
    B, H, Hkv, Tq, Tk, D, p_max = 1, 2, 1, 37, 37, 16, 20
    q, k, v, gk, e, _ = _make(B, H, Hkv, Tq, Tk, D, D, p_max, torch.float16, seed=5, device=triton_device)
    e = e.float()
    qp, kp = _pos(Tq, Tk, triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates="keys", causal=True, scale=D ** -0.5,
                                             q_positions=qp, k_positions=kp, p_max=p_max)
    assert out.dtype == torch.float16
    _check(out, ref, leaves, ref_leaves, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("gates", ["keys", "separate"])
def test_fp16_head_dim_64(gates, triton_device):
    # fp16 tl.dot operands at D=64 with fp32 accumulation; e kept fp16 too (its gradient comes back fp16)
    B, H, Hkv, T, D, p_max = 1, 2, 1, 33, 64, 16
    q, k, v, gk, e, _ = _make(B, H, Hkv, T, T, D, D, p_max, torch.float16, seed=13, gates=gates,
                              device=triton_device)
    qp, kp = _pos(T, T, triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates=gates, causal=True, scale=D ** -0.5,
                                             q_positions=qp, k_positions=kp, p_max=p_max)
    assert out.dtype == torch.float16 and leaves[0].grad.dtype == torch.float16
    _check(out, ref, leaves, ref_leaves, atol=2e-2, rtol=2e-2)


@BF16_NEEDS_CUDA
@pytest.mark.parametrize("alibi", [False, True])
def test_bf16_forward_backward(alibi, triton_device):
    B, H, Hkv, T, D, p_max = 1, 2, 1, 45, 64, 16
    q, k, v, gk, e, slopes = _make(B, H, Hkv, T, T, D, D, p_max, torch.bfloat16, seed=17, alibi=alibi,
                                   device=triton_device)
    qp, kp = _pos(T, T, triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, slopes, gates="keys", causal=True,
                                             scale=D ** -0.5, q_positions=qp, k_positions=kp, p_max=p_max)
    assert out.dtype == torch.bfloat16
    # bf16 keeps 8 bits: judge the max error against the max magnitude (element-wise tolerances fail on
    # small entries); the interpreter with fp32 dots already gives ~1.3e-2 for dq (bf16 o, dq, de roundings)
    pairs = [("out", out, ref)]
    for name, a, b in zip(["q", "k", "v", "gate_keys", "pos_emb", "slopes"], leaves, ref_leaves):
        if a is not None:
            pairs.append(("d" + name, a.grad, b.grad))
    for name, got, want in pairs:
        err = (got.double() - want.detach()).abs().max().item()
        mag = want.abs().max().item()
        assert torch.isfinite(got).all() and err <= 5e-2 * mag, f"{name}: {err:.3e} vs max |ref| {mag:.3e}"


def test_forward_blocks_differ_from_backward_blocks(triton_device):
    # forward tiles 64x64 (one tile), backward keeps the default 32x32 tiles
    B, H, Tq, Tk, D, p_max = 1, 2, 45, 45, 16, 10
    q, k, v, gk, e, _ = _make(B, H, 1, Tq, Tk, D, D, p_max, torch.float32, seed=21, gates="separate",
                              device=triton_device)
    qp, kp = _pos(Tq, Tk, triton_device)
    out, ref, leaves, ref_leaves = _run_both(q, k, v, gk, e, None, gates="separate", causal=True,
                                             scale=D ** -0.5, q_positions=qp, k_positions=kp, p_max=p_max,
                                             block_m=64, block_n=64)
    _check(out, ref, leaves, ref_leaves, atol=2e-4, rtol=2e-4)


def test_no_grad_forward_matches_and_default_positions(triton_device):
    B, H, Tq, Tk, D, p_max = 1, 2, 6, 40, 16, 64
    q, k, v, gk, e, _ = _make(B, H, 2, Tq, Tk, D, D, p_max, torch.float32, seed=9, device=triton_device)
    with torch.no_grad():
        a = cope_attention_triton(q, k, v, e, is_causal=True, scale=0.25, p_max=p_max)
    qp, kp = _pos(Tq, Tk, triton_device)
    ref = cope_reference(q.double(), k.double(), v.double(), e.double(), causal=True, scale=0.25,
                         q_positions=qp, k_positions=kp, p_max=p_max)
    torch.testing.assert_close(a.double(), ref, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("alibi", [False, True])
def test_torch_compile(alibi, triton_device):
    # registered as a torch.library custom op: dynamo + AOTAutograd trace it whole (fullgraph) and run the
    # registered backward; aot_eager compiles no C++ on the CPU
    B, H, Hkv, T, D, p_max = 1, 2, 1, 40, 16, 12
    q, k, v, gk, e, slopes = _make(B, H, Hkv, T, T, D, D, p_max, torch.float32, seed=23, alibi=alibi,
                                   device=triton_device)
    leaves = [t.requires_grad_() for t in (q, k, v, e if e is not None else slopes)]
    qp, kp = _pos(T, T, triton_device)
    mask = torch.ones(B, T, dtype=torch.bool, device=triton_device)
    mask[:, 3] = False

    def fn(q, k, v, param):
        out = cope_attention_triton(q * 1.0, k, v, None if alibi else param, slopes=param if alibi else None,
                                    is_causal=True, scale=0.25, q_positions=qp, k_positions=kp, p_max=p_max,
                                    key_padding_mask=mask)
        return (out * out).sum()

    loss = fn(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    loss_c = compiled(*leaves)
    grads_c = torch.autograd.grad(loss_c, leaves)
    torch.testing.assert_close(loss_c, loss)
    for g, gc in zip(grads, grads_c):
        assert g.abs().max() > 0
        # dk, dv, de accumulate with atomics in any order: equal up to fp32 rounding
        torch.testing.assert_close(gc, g, rtol=1e-5, atol=1e-6)
    # the compiled function itself is right, not just self-consistent
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    rq, rk, rv, rp = ref_leaves
    ref = cope_reference(rq, rk, rv, None if alibi else rp, slopes=rp if alibi else None, causal=True,
                         scale=0.25, q_positions=qp, k_positions=kp, p_max=p_max, key_padding_mask=mask)
    torch.testing.assert_close(loss_c.double(), (ref * ref).sum(), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_unsorted_key_positions_raise(causal, triton_device):
    # the gate sums run over the key index axis: unsorted keys would be silently wrong, so they raise
    # (the reference's error), with or without the causal mask
    q, k, v, _, e, _ = _make(2, 2, 1, 8, 8, 16, 16, 4, torch.float32, seed=0, device=triton_device)
    kp = torch.stack([torch.arange(8), torch.tensor([0, 1, 2, 4, 3, 5, 6, 7])]).to(triton_device)
    with pytest.raises(ValueError, match="k_positions must be non-decreasing"):
        cope_attention_triton(q, k, v, e, is_causal=causal, scale=0.25, p_max=4, k_positions=kp,
                              q_positions=torch.arange(8, device=triton_device))
    # repeated positions are non-decreasing and accepted
    out = cope_attention_triton(q, k, v, e, is_causal=causal, scale=0.25, p_max=4,
                                k_positions=torch.arange(8, device=triton_device) // 2,
                                q_positions=torch.arange(8, device=triton_device))
    assert torch.isfinite(out).all()


def test_invalid_arguments(triton_device):
    q, k, v, gk, e, _ = _make(1, 3, 2, 8, 8, 16, 8, 4, torch.float32, seed=0, device=triton_device)
    kw = dict(is_causal=True, scale=0.25, p_max=4)
    with pytest.raises(ValueError, match="Hkv"):
        cope_attention_triton(q, k, v, e, **kw)
    q = q[:, :2]
    with pytest.raises(ValueError, match="pos_emb"):
        cope_attention_triton(q, k, v, e[:, :3], **kw)
    with pytest.raises(ValueError, match="gate_keys"):
        cope_attention_triton(q, k, v, e, gate_keys=v, **kw)  # value gates need Dv == D
    with pytest.raises(ValueError, match="p_max"):
        cope_attention_triton(q, k, v, e, is_causal=True, scale=0.25, p_max=0)
    with pytest.raises(ValueError, match="slopes"):
        cope_attention_triton(q, k, v, None, slopes=torch.ones(3, device=triton_device), **kw)
    with pytest.raises(ValueError, match="block_m and block_n must be powers of two >= 16, got block_n=48"):
        cope_attention_triton(q, k, v, e, block_n=48, **kw)
    with pytest.raises(ValueError, match=r"k_positions must have shape \(8,\) or \(1, 8\)"):
        cope_attention_triton(q, k, v, e, k_positions=torch.arange(5, device=triton_device), **kw)


def test_causal_keyword_is_is_causal_and_the_old_spelling_still_works_with_a_warning(triton_device):
    q, k, v, _, e, _ = _make(1, 2, 2, 4, 4, 16, 16, 4, torch.float32, seed=0, device=triton_device)
    with torch.no_grad():
        new = cope_attention_triton(q, k, v, e, is_causal=True, scale=0.25, p_max=4)
        with pytest.warns(DeprecationWarning, match=r"^cope_attention_triton\(\): causal= is deprecated, use is_causal="):
            old = cope_attention_triton(q, k, v, e, causal=True, scale=0.25, p_max=4)
    assert torch.equal(new, old)
    with pytest.raises(TypeError, match="missing the keyword argument 'is_causal'"):
        cope_attention_triton(q, k, v, e, scale=0.25, p_max=4)


def test_the_kernel_benchmark_runs_and_prints_both_implementations(monkeypatch, capsys):
    # benchmarks/triton_cope.py's smoke shape (the interpreter where there is no GPU): a row per implementation
    import sys

    from conftest import load_benchmark

    if torch.cuda.is_available():
        pytest.skip("on a GPU the benchmark times its full grid; this checks the smoke shape")
    monkeypatch.setattr(sys, "argv", ["triton_cope.py", "--smoke"])  # read as the module loads
    bench = load_benchmark("triton_cope")
    bench.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["64"]]
    assert [r[1] for r in rows] == ["triton", "torch"]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
