"""polar_pair, PoPE's Cartesian features as one autograd node: equal to the op-by-op formula in float64 (values
and gradients of x, the position tables and the phase-bias rotation), and it keeps nothing for its backward that
is larger than its input."""
from unittest import mock

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings import polar_pair as polar_pair_module
from poskit.encodings.polar_pair import polar_pair

from conftest import load_benchmark
from cpu_kernel_helpers import kernel_off, require_kernel


def _op_by_op(x, ca, sa, cd, sd, scale, softplus):
    mu = F.softplus(x) if softplus else x
    if cd is not None:
        ca, sa = ca * cd + sa * sd, sa * cd - ca * sd
    return torch.cat((mu * ca * scale, mu * sa * scale), dim=-1)


def _inputs(B, H, T, d, per_batch, seed, tables_grad=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    a = torch.randn(B if per_batch else 1, 1, T, d, generator=g, dtype=torch.float64) * 3
    delta = torch.rand(1, H, 1, d, generator=g, dtype=torch.float64) * -6.28
    ca, sa = a.cos().requires_grad_(tables_grad), a.sin().requires_grad_(tables_grad)
    cd, sd = delta.cos().requires_grad_(), delta.sin().requires_grad_()
    return x, ca, sa, cd, sd


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(1, 5), d=st.integers(1, 4),
       per_batch=st.booleans(), rotated=st.booleans(), softplus=st.booleans(), tables_grad=st.booleans(),
       keep_mu=st.booleans(), scale=st.sampled_from([1.0, 0.125, 2.5]), seed=st.integers(0, 2**16))
def test_equals_the_formula_with_its_gradients(B, H, T, d, per_batch, rotated, softplus, tables_grad, keep_mu, scale,
                                               seed):
    # tables_grad False is attention's case: poskit's angle tables need no gradient, the phase bias does
    x, ca, sa, cd, sd = _inputs(B, H, T, d, per_batch, seed, tables_grad)
    if not rotated:
        cd = sd = None
    leaves = [t for t in (x, ca, sa, cd, sd) if t is not None and t.requires_grad]
    # keep_mu: small inputs keep softplus(x) for the backward, large ones recompute it; both must agree
    with mock.patch.object(polar_pair_module, "KEEP_MU_BELOW", 1 << 30 if keep_mu else 0):
        got = polar_pair(x, ca, sa, softplus, rotation=None if cd is None else (cd, sd), scale=scale)
    want = _op_by_op(x, ca, sa, cd, sd, scale, softplus)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, leaves, g)
    want_grads = torch.autograd.grad(want, leaves, g)
    for a, b in zip(got_grads, want_grads):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gradcheck_with_rotation():
    x, ca, sa, cd, sd = _inputs(2, 2, 3, 2, False, 0)
    assert torch.autograd.gradcheck(lambda *t: polar_pair(t[0], t[1], t[2], True, rotation=(t[3], t[4]), scale=0.5),
                                    (x, ca, sa, cd, sd))


def _saved_tensors(fn):
    """Every tensor autograd saves for the backward while fn runs."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_pope_query_keeps_nothing_larger_than_q_for_the_backward(monkeypatch):
    # At B=1 the phase-bias-rotated tables (1, H, T, d) are as large as q: kept for the backward, they and the
    # magnitudes held three q-sized tensors through attention's backward. (Inputs this small keep their
    # magnitudes by design; the threshold is lowered so that this one is treated as a large one.)
    monkeypatch.setattr(polar_pair_module, "KEEP_MU_BELOW", 1024)
    B, H, T, d = 1, 4, 64, 16
    enc = poskit.build_encoding("pope", head_dim=d, num_heads=H)
    with torch.no_grad():
        enc.delta.uniform_(-6.0, -0.1)
    q = torch.randn(B, H, T, d, requires_grad=True)
    positions = torch.arange(T)[None]
    saved = _saved_tensors(lambda: enc.encode_q(q, positions, scale=0.25))
    big = [tuple(t.shape) for t in saved if t.numel() >= q.numel() and t.data_ptr() != q.data_ptr()]
    assert not big, f"encode_q keeps q-sized tensors besides q for its backward: {big}"
    assert any(t.data_ptr() == q.data_ptr() for t in saved)  # the input itself: the backward needs it


# ----------------------------------------------------------------- the compiled library's single-pass ops

def _served(x, ca, sa, cd, sd, grads=(True, False, False, True, True)):
    return polar_pair_module._fused_ops(x, ca, sa, cd, sd, grads) is not None


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(1, 6), d=st.integers(1, 19),
       per_batch=st.booleans(), rotated=st.booleans(), rotation_grad=st.booleans(), softplus=st.booleans(),
       scale=st.sampled_from([1.0, 0.125, 2.5]), large=st.booleans(), seed=st.integers(0, 2**16))
def test_the_compiled_ops_equal_the_formula_in_float64(B, H, T, d, per_batch, rotated, rotation_grad, softplus, scale,
                                                       large, seed):
    # fp32 through the library's ops (d up to 19: vector lanes and their tail; `large`: x beyond softplus'
    # threshold of 20, where softplus is x and its derivative 1) against the formula in float64
    require_kernel()
    x64, ca64, sa64, cd64, sd64 = _inputs(B, H, T, d, per_batch, seed, tables_grad=False)
    if large:
        x64 = (x64.detach() * 15).requires_grad_()
    x = x64.detach().float().requires_grad_()
    ca, sa = ca64.detach().float(), sa64.detach().float()
    cd = sd = None
    if rotated:
        cd, sd = (t.detach().float().requires_grad_(rotation_grad) for t in (cd64, sd64))
        cd64, sd64 = (t.detach().requires_grad_(rotation_grad) for t in (cd64, sd64))
    else:
        cd64 = sd64 = None
    assert _served(x, ca, sa, cd, sd)
    got = polar_pair(x, ca, sa, softplus, rotation=None if cd is None else (cd, sd), scale=scale)
    want = _op_by_op(x64, ca64, sa64, cd64, sd64, scale, softplus)
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6 * scale * (1 + want.abs().max().item()))
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    leaves = [t for t in (x, cd, sd) if t is not None and t.requires_grad]
    leaves64 = [t for t in (x64, cd64, sd64) if t is not None and t.requires_grad]
    for a, b in zip(torch.autograd.grad(got, leaves, g.float()), torch.autograd.grad(want, leaves64, g)):
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * (1 + b.abs().max().item()))


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 3), T=st.integers(1, 6), d=st.integers(1, 19), per_batch=st.booleans(),
       rotated=st.booleans(), softplus=st.booleans(), bf16_tables=st.booleans(), seed=st.integers(0, 2**16))
def test_the_compiled_ops_in_bf16_round_once_from_the_float64_formula(B, H, T, d, per_batch, rotated, softplus,
                                                                    bf16_tables, seed):
    # bf16 x (and gradient) with fp32 or bf16 tables: computed in fp32 inside, so the output and dx are the float64
    # formula on the same bf16 inputs rounded once to bf16 (2^-8 relative), the rotation's gradient summed in fp32
    require_kernel()
    x64, ca64, sa64, cd64, sd64 = _inputs(B, H, T, d, per_batch, seed, tables_grad=False)
    table_dtype = torch.bfloat16 if bf16_tables else torch.float32
    x = x64.detach().bfloat16().requires_grad_()
    ca, sa = (t.detach().to(table_dtype) for t in (ca64, sa64))
    cd = sd = None
    if rotated:
        cd, sd = (t.detach().to(table_dtype).requires_grad_() for t in (cd64, sd64))
    assert _served(x, ca, sa, cd, sd)
    got = polar_pair(x, ca, sa, softplus, rotation=None if cd is None else (cd, sd))
    assert got.dtype == torch.bfloat16
    # the reference: the same (rounded) inputs, in float64
    xr = x.detach().double().requires_grad_()
    cdr, sdr = (None, None) if cd is None else (t.detach().double().requires_grad_() for t in (cd, sd))
    want = _op_by_op(xr, ca.double(), sa.double(), cdr, sdr, 1.0, softplus)
    torch.testing.assert_close(got.double(), want, rtol=2 ** -8, atol=1e-6 * (1 + want.abs().max().item()))
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).bfloat16()
    leaves, leaves64 = [t for t in (x, cd, sd) if t is not None], [t for t in (xr, cdr, sdr) if t is not None]
    grads = torch.autograd.grad(got, leaves, g)
    for a, b, leaf in zip(grads, torch.autograd.grad(want, leaves64, g.double()), leaves):
        assert a.dtype == leaf.dtype and a.shape == b.shape
        scale_b = 1 + b.abs().max().item()
        torch.testing.assert_close(a.double(), b, rtol=2 ** -7, atol=2 ** -8 * scale_b)


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of the fp32 spacing at want (float64 want); below the smallest normal float (where
    the compiled exponential gives 0) in units of that number."""
    tiny = torch.finfo(torch.float32).tiny
    w = want.float().abs().clamp_min(tiny)
    spacing = (torch.nextafter(w, torch.tensor(float("inf"))) - w).double()
    return ((got.double() - want).abs() / spacing).where(want.abs() >= tiny, (got.double() - want).abs() / tiny)


def test_the_compiled_softplus_and_sigmoid_stay_within_a_few_ulp_everywhere():
    # the ops' own softplus (forward) and sigmoid (dx) against float64 on a dense grid over [-100, 100] (both sides
    # of the threshold 20, of 0, and the exponential's clamp near -87.3), each vector lane and the scalar tail: tables
    # cos a = 1, sin a = 0 make out[..., :d] = softplus(x) and, with the gradient (1, 0), dx = sigmoid(x)
    require_kernel()
    d = 19
    x = torch.cat((torch.linspace(-100, 100, 200_003), torch.linspace(-1, 1, 20_001), torch.linspace(19, 21, 2001),
                   torch.linspace(-88, -86, 2001), torch.tensor([0.0, -0.0, 20.0, -87.33654, 1e-30, -1e-30])))
    x = torch.cat((x, torch.zeros(-x.numel() % d))).reshape(1, 1, -1, d).contiguous()
    ones, zeros = torch.ones(1, 1, x.shape[2], d), torch.zeros(1, 1, x.shape[2], d)
    ops = polar_pair_module._fused_ops(x, ones, zeros, None, None, (True, False, False, False, False))
    assert ops is not None
    empty = torch.empty(0)
    x64 = x.double()
    softplus64 = torch.where(x64 > 20, x64, torch.log1p(torch.exp(x64)))
    out = ops.polar_forward(x, ones, zeros, empty, empty, 1.0, True)
    assert _ulps(out[..., :d], softplus64).max() <= 4
    assert torch.equal(out[..., d:], torch.zeros_like(x))
    dx, _ = ops.polar_backward(torch.cat((torch.ones_like(x), torch.zeros_like(x)), -1), x, ones, zeros, empty,
                               empty, 1.0, True, False)
    assert _ulps(dx, torch.sigmoid(x64)).max() <= 3
    # torch's threshold: softplus is x itself above 20 and its derivative 1
    above = x > 20
    assert torch.equal(out[..., :d][above], x[above]) and torch.equal(dx[above], torch.ones_like(x[above]))
    # infinities and NaN as torch's softplus and sigmoid give them (the gradient's rotation part off)
    special = torch.tensor([float("inf"), -float("inf"), float("nan")]).repeat(d)[:d].reshape(1, 1, 1, d)
    one, zero = torch.ones(1, 1, 1, d), torch.zeros(1, 1, 1, d)
    got = ops.polar_forward(special, one, zero, empty, empty, 1.0, True)[..., :d]
    torch.testing.assert_close(got, F.softplus(special), equal_nan=True, rtol=0, atol=0)
    got_dx, _ = ops.polar_backward(torch.cat((one, zero), -1), special, one, zero, empty, empty, 1.0, True, False)
    torch.testing.assert_close(got_dx, torch.sigmoid(special), equal_nan=True, rtol=0, atol=0)


def test_the_compiled_ops_serve_only_their_case(monkeypatch):
    # fp32 on the CPU, tables of one position row per batch row or one for all, the rotation per head
    require_kernel()
    x, ca, sa, cd, sd = (t.detach().float() for t in _inputs(2, 3, 4, 5, False, 0))
    assert _served(x, ca, sa, cd, sd) and _served(x, ca, sa, None, None)
    assert not _served(x.double(), ca, sa, cd, sd)  # float64 keeps the exact path
    assert not _served(x.half(), ca, sa, cd, sd)
    assert _served(x.bfloat16(), ca, sa, cd, sd) and _served(x.bfloat16(), *(t.bfloat16() for t in (ca, sa, cd, sd)))
    assert not _served(x, ca, sa, cd, sd, grads=(True, True, False, False, False))  # tables with a gradient
    assert not _served(x, ca.expand(2, 3, 4, 5), sa.expand(2, 3, 4, 5), cd, sd)  # tables per head
    assert not _served(x, ca, sa, cd.expand(2, 3, 1, 5), sd.expand(2, 3, 1, 5))  # a rotation per batch row
    # switched off (POSKIT_CPU_KERNEL=0) it serves nothing, as attention's kernel
    kernel_off(monkeypatch)
    assert not _served(x, ca, sa, cd, sd)


def test_the_transform_benchmark_times_the_kernel_against_torch_s_path(monkeypatch, capsys, tmp_path):
    # each path is the one its row names: the kernel's ops only in the one-pass rows, torch's elementwise path
    # (the kernel switched off) in the others; every row's ratio is against torch's path, whose own is 1
    require_kernel()
    bench = load_benchmark("polar_transform")
    real, calls = polar_pair_module._fused_ops, []

    def spy(*args):
        ops = real(*args)
        calls.append(ops is not None)
        return ops

    monkeypatch.setattr(polar_pair_module, "_fused_ops", spy)
    out = tmp_path / "bench.json"
    bench.main(["--shapes", "2x2x8x4", "--dtypes", "fp32", "--rounds", "2", "--calls", "1", "--threads", "1",
                "--json", str(out)])
    # per mode: warm-up + 2 rounds of each transform path, one call each
    assert calls.count(True) == calls.count(False) == 6
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 2x2x8x4")]
    assert [(r[2].strip(), r[3].strip()) for r in rows] == [(m, p) for m in ("fwd", "fwdbwd") for p in bench.PATHS]
    assert all(r[5].strip() == "1.00" for r in rows if r[3].strip() == bench.PATHS[1])
    import json
    doc = json.loads(out.read_text())
    assert len(doc["parts"]["polar_transform"]["rows"]) == 6


def test_the_transform_benchmark_refuses_an_unknown_dtype_before_measuring(capsys):
    bench = load_benchmark("polar_transform")
    try:
        bench.main(["--dtypes", "fp16"])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("fp16 was accepted")
    assert "--dtypes must be among fp32,bf16, got fp16" in capsys.readouterr().err
