"""Every fast path equals the reference (forward and backward), whatever the masks, offsets and head groups."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings.base import encoding_class
from poskit.attention.engine import choose_backend
from conftest import build, make_qkv
from extras import need
from memory_helpers import allocated_bytes

# the encodings that enter attention (absolute ones go on the embeddings and are refused: test_absolute.py)
ALL = [n for n in poskit.available_encodings() if encoding_class(n).kind != "absolute"]


def _grads(out, inputs, seed=0):
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out, inputs, g, allow_unused=True)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=10, deadline=None)
@given(
    T=st.integers(1, 80),
    n_new=st.integers(1, 80),
    causal=st.booleans(),
    groups=st.sampled_from([1, 2, 4]),
    padding=st.booleans(),
    offset=st.integers(0, 1000),
    seed=st.integers(0, 2**16),
)
def test_auto_backend_equals_reference(name, T, n_new, causal, groups, padding, offset, seed):
    n_new = min(n_new, T)
    enc = build(name, **({"max_distance": 2000} if name == "relative" else {}), **({"max_positions": 2000} if name == "learned" else {}))
    q, k, v = make_qkv(B=2, H=4, Hkv=4 // groups, Tq=n_new, Tk=T, requires_grad=True, gen_seed=seed)
    kw = dict(is_causal=causal, q_positions=torch.arange(T - n_new, T) + offset, k_positions=torch.arange(T) + offset)
    if padding:
        kw["attn_mask"] = (torch.rand(2, T, generator=torch.Generator().manual_seed(seed)) > 0.3)[:, None, None, :]
    if getattr(enc, "gates", None) == "separate":
        kw["gate_keys"] = k.flip(-1)
    params = [p for p in enc.parameters() if p.requires_grad]
    fast = poskit.attention(q, k, v, enc, **{"is_causal": True, **kw}, enable_gqa=True)
    ref = poskit.attention(q, k, v, enc, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True)
    assert torch.allclose(fast, ref, atol=1e-10), (fast - ref).abs().max()
    for a, b in zip(_grads(fast, [q, k, v, *params], seed), _grads(ref, [q, k, v, *params], seed)):
        if a is None or b is None:
            assert a is None and b is None or (a if a is not None else b).abs().max() == 0
            continue
        assert torch.allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("name", ["rope", "pope", "alibi", "none", "relative"])
def test_fp32_fast_path_matches_float64_reference(name):
    enc = build(name, dtype=torch.float32, head_dim=32, num_heads=4, **({"max_distance": 256} if name == "relative" else {}))
    q, k, v = make_qkv(B=2, H=4, Hkv=2, Tq=150, Tk=150, D=32, dtype=torch.float32)
    out = poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference", is_causal=True, enable_gqa=True)
    assert torch.allclose(out.double(), ref, atol=2e-5)


def test_rows_without_visible_keys_output_zero_on_every_path():
    for name in ("rope", "pope", "alibi", "relative"):
        enc = build(name)
        q, k, v = make_qkv(Tq=3, Tk=3)
        kw = dict(q_positions=torch.tensor([0, 1, 2]), k_positions=torch.tensor([1, 2, 3]))
        out = poskit.attention(q, k, v, enc, **{"is_causal": True, **kw}, enable_gqa=True)
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        assert torch.allclose(out, poskit.attention(q, k, v, enc, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True))


def test_auto_never_picks_triton_on_cpu():
    q = torch.randn(1, 4, 2, 16)
    assert choose_backend(build("pope"), q, "auto") == "sdpa"
    assert choose_backend(build("cope"), q, "auto") == "blocked-contextual"  # the exact blocked CPU path, not triton
    assert choose_backend(build("rope"), q, "auto") == "sdpa"


def _triton_kernels_runnable(name):
    """Skip unless the Triton kernels for this encoding can run here (GPU, or interpreted on CPU)."""
    from conftest import HAS_CUDA

    need("triton", "triton")
    if HAS_CUDA:
        return
    if name == "pope":
        from poskit.attention.triton_pope import kernels_interpreted
    else:
        from poskit.attention.triton_cope import kernels_interpreted
    if not kernels_interpreted():
        pytest.skip("no GPU, and the triton kernels were imported without TRITON_INTERPRET=1")


@pytest.mark.parametrize("name", ["pope", "cope", "cope-alibi"])
def test_triton_backend_through_engine_matches_reference(name, triton_device):
    _triton_kernels_runnable(name)
    enc = build(name, dtype=torch.float32).to(triton_device)
    q, k, v = (t.to(triton_device).requires_grad_() for t in make_qkv(B=1, H=4, Hkv=2, Tq=40, Tk=40,
                                                                        dtype=torch.float32))
    out = poskit.attention(q, k, v, enc, backend="triton", is_causal=True, enable_gqa=True)
    ref = poskit.attention(q, k, v, enc, backend="reference", is_causal=True, enable_gqa=True)
    assert torch.allclose(out, ref, atol=2e-4)
    for a, b in zip(_grads(out, [q, k, v]), _grads(ref, [q, k, v])):
        assert torch.allclose(a, b, atol=5e-4)


@pytest.mark.parametrize("positions", ["shared", "per_batch"])
@pytest.mark.parametrize("name", ["pope", "cope", "cope-alibi"])
def test_triton_engine_batch_cache_block_gqa_padding(name, positions, triton_device):
    # B > 1, a block of 5 new queries against a 45-key cache at explicit positions, GQA (2 query heads per
    # kv head), key padding; forward and the gradients of q, k, v and the encoding's parameters (pope's
    # delta, cope's embeddings, learned cope-alibi slopes) against the float64 reference backend
    import copy

    _triton_kernels_runnable(name)
    B, H, Hkv, Tq, Tk, D = 2, 4, 2, 5, 45, 32
    extra = {"delta_init": "uniform"} if name == "pope" else {"learned_slopes": True} if name == "cope-alibi" else {}
    enc = build(name, head_dim=D, num_heads=H, dtype=torch.float32, **extra).to(triton_device)
    if name == "cope-alibi":
        with torch.no_grad():  # learned slopes start at 0: give them values that matter
            enc.slopes.copy_(torch.linspace(-0.5, 1.0, H))
    enc64 = copy.deepcopy(enc).double()
    q, k, v = (t.to(triton_device) for t in make_qkv(B=B, H=H, Hkv=Hkv, Tq=Tq, Tk=Tk, D=D, dtype=torch.float32,
                                                       gen_seed=3))
    if positions == "shared":  # (T,): the engine turns these into (1, T) positions and (1, T, d) tables
        kp = torch.arange(Tk, device=triton_device) + 100
        qp = kp[-Tq:] - 2  # the last two keys lie after every query: masked by position, not by index
    else:  # (B, T): a different offset per sequence
        kp = torch.stack([torch.arange(Tk), torch.arange(Tk) + 1000]).to(triton_device)
        qp = kp[:, -Tq:] - 2
    mask = torch.ones(B, Tk, dtype=torch.bool, device=triton_device)
    mask[0, :7] = False  # left padding
    mask[1, 20:23] = False
    kw = dict(q_positions=qp, k_positions=kp, attn_mask=mask[:, None, None, :])

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = poskit.attention(*leaves, enc, backend="triton", **{"is_causal": True, **kw}, enable_gqa=True)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = poskit.attention(*leaves64, enc64, backend="reference", **{"is_causal": True, **kw}, enable_gqa=True)
    assert out.shape == (B, H, Tq, D)
    assert (out.double() - ref).abs().max() < 1e-4
    params = [p for p in enc.parameters() if p.requires_grad]
    params64 = [p for p in enc64.parameters() if p.requires_grad]
    assert params, "the encoding should have a trainable parameter to check"
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(triton_device)
    got = torch.autograd.grad(out, leaves + params, g.float())
    want = torch.autograd.grad(ref, leaves64 + params64, g)
    for g, w in zip(got, want):
        assert w.abs().max() > 0
        assert (g.double() - w).abs().max() < 1e-4 * max(1.0, w.abs().max().item())


def test_triton_pope_fp16_delta_stays_fp32(triton_device):
    # fp16 q/k/v with an fp32 encoding: delta is clamped and turned into phases in fp32, and its gradient
    # is accumulated and returned in fp32 (rounding delta to fp16 would move every phase by up to 2e-3 rad
    # and route its gradient through fp16)
    import copy

    from poskit.attention.triton_pope import pope_attention_triton

    _triton_kernels_runnable("pope")
    B, H, Hkv, T, D = 2, 2, 1, 40, 32
    enc = build("pope", head_dim=D, num_heads=H, dtype=torch.float32).to(triton_device)
    with torch.no_grad():
        # in [-2 pi, -4) fp16 is spaced 2^-8: put every entry ~half a spacing off the fp16 grid, so an
        # fp16 delta would be as wrong as it can be
        d = torch.empty(H, D).uniform_(-6.2, -4.0, generator=torch.Generator().manual_seed(4))
        enc.delta.copy_(d.half().float() + 0.45 * 2 ** -8)
    enc64 = copy.deepcopy(enc).double()
    q, k, v = (t.to(triton_device).half() for t in make_qkv(B=B, H=H, Hkv=Hkv, Tq=T, Tk=T, D=D,
                                                              dtype=torch.float32, gen_seed=11))
    out = poskit.attention(q, k, v, enc, backend="triton", is_causal=True, enable_gqa=True)
    ref = poskit.attention(q.double(), k.double(), v.double(), enc64, backend="reference", is_causal=True, enable_gqa=True)

    # the phases: the engine's output is the kernel's with the fp32 delta, not with delta rounded to fp16
    pos = torch.arange(T, device=triton_device)
    c, s = enc.cos_sin(pos, torch.float32)
    kw = dict(is_causal=True, scale=D ** -0.5, q_positions=pos, k_positions=pos)
    with torch.no_grad():
        fp32_delta = pope_attention_triton(q, k, v, enc.delta.clone(), c, s, c, s, **kw)
        fp16_delta = pope_attention_triton(q, k, v, enc.delta.half(), c, s, c, s, **kw)
    assert torch.equal(out, fp32_delta)
    assert not torch.equal(out, fp16_delta)

    # the gradient: fp32 (not fp16 values widened) and within 2e-3 of the float64 reference's maximum,
    # 10x tighter than the fp16 kernel tests (fp16 tl.dot operands leave ~5e-4 here)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(triton_device)
    (ddelta,) = torch.autograd.grad(out, [enc.delta], g.half())
    (ddelta64,) = torch.autograd.grad(ref, [enc64.delta], g.double())
    assert ddelta.dtype == torch.float32
    assert (ddelta != ddelta.half().float()).float().mean() > 0.9
    rel = ((ddelta.double() - ddelta64).abs().max() / ddelta64.abs().max()).item()
    assert rel < 2e-3, rel


@pytest.mark.parametrize("name", ["cope", "cope-alibi"])
@pytest.mark.parametrize("causal", [True, False])
def test_triton_cope_unsorted_key_positions_raise_like_reference(name, causal, triton_device):
    # the fused gate sums run over the key index axis (and the causal key range comes from searchsorted):
    # unsorted keys would give a silently wrong output, so both backends raise the same error
    _triton_kernels_runnable(name)
    enc = build(name, dtype=torch.float32).to(triton_device)
    q, k, v = (t.to(triton_device) for t in make_qkv(B=2, H=4, Hkv=2, Tq=6, Tk=6, dtype=torch.float32))
    kw = dict(is_causal=causal, q_positions=torch.arange(6, device=triton_device),
              k_positions=torch.tensor([[0, 1, 2, 3, 4, 5], [0, 2, 1, 3, 4, 5]], device=triton_device))
    for backend in ("reference", "triton"):
        with pytest.raises(ValueError, match="k_positions must be non-decreasing for cope/cope-alibi"):
            poskit.attention(q, k, v, enc, backend=backend, **{"is_causal": True, **kw}, enable_gqa=True)


def test_choose_backend_triton_needs_cuda_or_the_interpreter(monkeypatch):
    need("triton", "triton")
    q = torch.randn(1, 4, 2, 16)
    # conftest switches the interpreter on without a GPU: off, a CPU tensor cannot be served
    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        else:
            monkeypatch.setenv("TRITON_INTERPRET", value)
        with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors, got q on cpu"):
            choose_backend(build("pope"), q, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_backend(build("cope"), q, "triton") == "triton"


def test_choose_backend_triton_needs_the_triton_package(monkeypatch):
    from types import SimpleNamespace

    from poskit.attention import engine

    cuda_q = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))  # choose_backend reads only these
    monkeypatch.setattr(engine, "triton_available", lambda: True)
    assert choose_backend(build("pope"), cuda_q, "triton") == "triton"
    assert choose_backend(build("cope-alibi"), cuda_q, "auto") == "triton"
    assert choose_backend(build("rope"), cuda_q, "auto") == "sdpa"  # triton serves only pope/cope
    monkeypatch.setattr(engine, "triton_available", lambda: False)
    for name in ("pope", "cope"):
        with pytest.raises(ValueError, match=r"backend='triton' needs the triton package \(pip install 'poskit\[triton\]'\)"):
            choose_backend(build(name), cuda_q, "triton")
    # auto falls back instead of failing
    assert choose_backend(build("pope"), cuda_q, "auto") == "sdpa"
    assert choose_backend(build("cope"), cuda_q, "auto") == "reference"
    with pytest.raises(ValueError, match="backend='triton' serves only pope, cope and cope-alibi, got 'rope'"):
        choose_backend(build("rope"), cuda_q, "triton")


def test_pope_on_cuda_runs_full_sequences_through_sdpa_and_decodes_with_its_kernel(monkeypatch):
    # measured on an H100 (docs/benchmarks.md): SDPA on PoPE's Cartesian q/k beat the fused kernel for full
    # sequences; the encoding declares it, and the engine reads the declaration, not the name
    from types import SimpleNamespace

    from poskit.attention import engine

    cuda_q = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    monkeypatch.setattr(engine, "triton_available", lambda: True)
    pope = build("pope")
    assert not pope.fused_kernel_for_full_sequences and build("cope").fused_kernel_for_full_sequences
    chosen, why = engine._choose(pope, cuda_q, "auto")
    assert chosen == "sdpa" and "fused_kernel_for_full_sequences=False" in why
    assert engine._choose(pope, cuda_q, "auto", keys="magnitude")[0] == "triton"  # decode against the cache
    assert engine._choose(pope, cuda_q, "triton")[0] == "triton"  # asked for: the kernel (less memory)
    assert engine._choose(build("cope"), cuda_q, "auto")[0] == "triton"
    monkeypatch.setattr(type(pope), "fused_kernel_for_full_sequences", True)
    assert engine._choose(pope, cuda_q, "auto")[0] == "triton"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "cache view"])
def test_the_finiteness_check_copies_no_tensor(dtype, layout):
    """all_finite runs on every SDPA and kernel call, over the whole KV cache at each decode step: a bf16 tensor
    summed with an fp32 result was first copied to fp32 (twice its own size, and 20x the time of the sum itself at
    8192 cached keys), and so was a bf16 cache's view into its buffer (heads `capacity` rows apart) summed whole.
    bf16 sums accumulate in fp32 inside and share fp32's exponent range, so nothing is lost."""
    from poskit.attention.inputs import all_finite

    buffer = torch.randn(2, 4, 2048, 64).to(dtype)  # (B, H, capacity, D)
    x = torch.randn(1_000_000).to(dtype) if layout == "contiguous" else buffer[:, :, :1000]
    assert x.is_contiguous() == (layout == "contiguous")
    all_finite(x)  # (a first call may allocate what torch keeps)
    found = []
    allocated = allocated_bytes(lambda: found.append(all_finite(x, x[:10])))
    assert found == [True]
    assert allocated < 1000, f"{allocated} bytes allocated to check {x.numel()} values"
    if layout == "cache view":  # the spare room is not looked at; every value of the view is
        buffer[1, 3, 1000:] = float("nan")
        assert all_finite(x)
        buffer[1, 3, 999, 63] = float("inf")
        assert not all_finite(x)
        return
    y = x.clone()
    y[123_456] = float("nan")
    assert not all_finite(x, y)
    y[123_456] = float("inf")
    assert not all_finite(y)
    # a finite tensor whose sum overflows counts as not finite (the exact path then serves it): never wrong
    assert not all_finite(torch.full((4,), 3e38, dtype=dtype))


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(st.sampled_from([(3,), (2, 5), (1, 2, 8, 16), (1, 2, 129, 128), (2, 1, 64, 300)]),
                       min_size=0, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
       spoil=st.sampled_from([None, float("nan"), float("inf"), float("-inf")]), where=st.integers(0, 10**6),
       with_none=st.booleans(), data=st.data())
def test_the_finiteness_check_agrees_with_isfinite_for_small_and_large_tensors(shapes, dtype, spoil, where,
                                                                                with_none, data):
    # tensors of at most SMALL_SUM elements are summed whole, larger ones over their last two dimensions first;
    # either way the answer is whether every value is finite (values kept small: no sum can overflow here)
    from poskit.attention.inputs import SMALL_SUM, all_finite

    g = torch.Generator().manual_seed(where)
    tensors = [torch.rand(s, generator=g).to(dtype) for s in shapes]
    assert 2 * 8 * 16 <= SMALL_SUM < 2 * 129 * 128  # the shapes drawn take both branches
    if spoil is not None and tensors:
        hit = tensors[data.draw(st.integers(0, len(tensors) - 1))]
        hit.view(-1)[where % hit.numel()] = spoil
    args = [*tensors, None] if with_none else tensors
    expected = all(bool(torch.isfinite(t).all()) for t in tensors)
    assert all_finite(*args) == expected
