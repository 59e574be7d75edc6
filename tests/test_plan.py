"""One dispatch: the path that `plan()` and `route()` report is the path `attention()` executes.

The executed path is observed independently of the engine, by spying on what each path finally calls (SDPA,
the blocked autograd Functions, the compiled CPU kernel, the Triton entry points), over random encodings
(every registered one), dtypes, shapes, masks, grouped kv heads, positions, backends and the CPU-kernel switch.
"""
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

import poskit
from conftest import ENCODING_OPTIONS
from cpu_kernel_helpers import kernel_off
from poskit.attention import Plan, blocked, blocked_bias, blocked_cope, cpu_flash, plan, route, sdpa
from poskit.attention import engine, triton_cope, triton_pope
from poskit.encodings.base import encoding_class
from poskit.encodings.registration import UntrainedEncodingWarning

NAMES = poskit.available_encodings()
PATHS = ("reference", "sdpa", "blocked", "blocked-bias", "blocked-contextual", "cpu-flash", "triton")
D = 16


def _spies(mp: pytest.MonkeyPatch, seen: list) -> None:
    """Record the path of every final call: SDPA (or its materialised stand-in for NaN inputs), the blocked
    Functions, the CPU kernel and the Triton entry points (these two stubbed: a kernel build or the Triton
    interpreter is not what this test is about; their numbers are tested in their own files)."""
    def through(path, original):
        return lambda *a, **kw: (seen.append(path), original(*a, **kw))[1]

    def stub(path, out):
        return lambda *a, **kw: (seen.append(path), out(*a, **kw))[1]

    def zeros(ctx, q, k, v, *rest):
        return q.new_zeros(*q.shape[:3], v.shape[-1])

    mp.setattr(F, "scaled_dot_product_attention", through("sdpa", F.scaled_dot_product_attention))
    mp.setattr(sdpa, "_materialised", through("sdpa", sdpa._materialised))
    # the autograd Functions are spied on at their forward, which runs whether they are applied (a gradient may
    # follow) or called alone (util.function_call: none can)
    mp.setattr(blocked.BlockedAttention, "forward", staticmethod(through("blocked", blocked.BlockedAttention.forward)))
    mp.setattr(blocked_bias.BlockedBiasAttention, "forward",
               staticmethod(through("blocked-bias", blocked_bias.BlockedBiasAttention.forward)))
    mp.setattr(blocked_cope.BlockedCoPE, "forward",
               staticmethod(through("blocked-contextual", blocked_cope.BlockedCoPE.forward)))
    mp.setattr(cpu_flash.CpuFlashAttention, "forward", staticmethod(stub("cpu-flash", zeros)))
    # CoPE with gates from the keys has the kernel's own pass
    mp.setattr(cpu_flash.CpuFlashContextual, "forward", staticmethod(stub("cpu-flash", zeros)))
    mp.setattr(triton_pope, "pope_attention_for",
               stub("triton", lambda enc, q, k, v, **kw: q.new_zeros(*q.shape[:3], v.shape[-1])))
    mp.setattr(triton_cope, "cope_attention_triton",
               stub("triton", lambda q, k, v, *a, **kw: q.new_zeros(*q.shape[:3], v.shape[-1])))


@st.composite
def calls(draw):
    """(encoding, q, k, v, keywords, cpu-kernel switch, kernel builds) for one attention() call."""
    # every registered encoding, with the ones whose paths depend most on the inputs drawn more often
    name = draw(st.one_of(st.sampled_from(NAMES), st.sampled_from(["pope", "alibi", "relative", "cope", "rope"])))
    cls = encoding_class(name)
    options = dict(ENCODING_OPTIONS.get(name, {}))
    if name in ("relative", "relative-capped"):
        options["max_distance"] = 64  # every offset drawn below has its embedding (relative refuses others)
    if cls.kind == "contextual":
        options["gates"] = draw(st.sampled_from(["keys", "values", "separate"]))
    axial = name in ("rope", "pope") and draw(st.booleans())
    if axial:
        options["axial_dims"] = [D // 2, D // 2]
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.bfloat16]))
    H = draw(st.sampled_from([2, 4]))
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H, dim=H * D, **options).to(dtype)
    if draw(st.booleans()):
        enc.requires_grad_(False)  # a frozen bias can be a static one (built once and reused)
    B, groups = draw(st.integers(1, 2)), draw(st.sampled_from([1, H]))
    Tq, Tk = (draw(st.integers(1, 9)) if draw(st.integers(0, 7)) else 0 for _ in range(2))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(B, H, Tq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, H // groups, Tk, D, generator=g).to(dtype) for _ in range(2))
    backend = draw(st.sampled_from(engine.BACKENDS + ("auto", "auto")))
    if backend != "triton" and Tq and draw(st.integers(0, 5)) == 0:
        q[0, 0, 0, 0] = float("nan")  # non-finite inputs change some choices (the CPU kernel, the sdpa path)
    # (axial positions refuse is_causal: drawn rarely there)
    kw = dict(backend=backend, enable_gqa=groups > 1, is_causal=draw(st.integers(0, 5 if axial else 1)) == 1)
    if axial:
        kw["q_positions"] = torch.randint(0, 5, (Tq, 2), generator=g)
        kw["k_positions"] = torch.randint(0, 5, (Tk, 2), generator=g)
    elif draw(st.booleans()):  # explicit positions, keys non-decreasing (CoPE refuses others in every path)
        offset = draw(st.integers(0, 20))
        kw["k_positions"] = offset + torch.randint(0, 3, (Tk,), generator=g).cumsum(0)
        kw["q_positions"] = offset + torch.randint(0, 3, (Tq,), generator=g).cumsum(0) + draw(st.integers(0, 5))
    mask = draw(st.sampled_from(["none", "none", "none", "padding", "float-padding", "general", "float-general"]))
    if mask != "none":
        shape = (B, 1, 1, Tk) if "padding" in mask else (B, 1, Tq, Tk)
        keep = torch.rand(shape, generator=g) > 0.3
        kw["attn_mask"] = keep if not mask.startswith("float") else torch.zeros(shape, dtype=dtype).masked_fill(
            ~keep, float("-inf") if mask == "float-padding" else -1e4)
    if getattr(enc, "needs_gate_keys", False):
        kw["gate_keys"] = k.flip(-1)
    # the CPU kernel's switch and whether it builds; small limits of the blocked path (its key limit, its
    # query block) so that these short sequences cross them
    switches = dict(cpu_kernel=draw(st.integers(0, 3)) > 0, kernel_builds=draw(st.integers(0, 3)) > 0,
                    max_keys=draw(st.sampled_from([sdpa.BLOCKED_MAX_KEYS, 4])),
                    block=draw(st.sampled_from([blocked.DEFAULT_BLOCK, 4])))
    return enc, q, k, v, kw, switches


def _cope_on_the_kernel():
    """A call drawn once and missed by the spies then: CoPE with gates from the keys, the CPU kernel on."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1, 16, generator=g) for _ in range(3))
    enc = poskit.build_encoding("cope", head_dim=16, num_heads=2)
    return (enc, q, k, v, {"backend": "auto", "enable_gqa": False, "is_causal": False},
            {"cpu_kernel": True, "kernel_builds": True, "max_keys": 4096, "block": 64})


@settings(max_examples=150, deadline=None)
@given(call=calls())
@example(call=_cope_on_the_kernel())
def test_the_reported_path_is_the_executed_path(call):
    enc, q, k, v, kw, switches = call
    seen = []
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrainedEncodingWarning)
        mp.setenv(cpu_flash.ENV_SWITCH, "1" if switches["cpu_kernel"] else "0")
        mp.setattr(cpu_flash, "available", lambda: switches["kernel_builds"])
        mp.setattr(sdpa, "BLOCKED_MAX_KEYS", switches["max_keys"])
        mp.setattr(blocked, "DEFAULT_BLOCK", switches["block"])
        try:
            planned = plan(q, k, v, enc, **kw)
        except (ValueError, TypeError) as refused:  # refused before any path: attention() says the same
            event("refused")
            with pytest.raises(type(refused), match=re.escape(str(refused))):
                poskit.attention(q, k, v, enc, **kw)
            with pytest.raises(type(refused), match=re.escape(str(refused))):
                route(enc, q, k, kw.pop("backend"), v=v, **kw)
            return
        assert isinstance(planned, Plan) and planned.path in PATHS and planned.reasons
        event(planned.path)
        assert route(enc, q, k, kw["backend"], v=v, **{n: a for n, a in kw.items() if n != "backend"}) == planned.path
        _spies(mp, seen)
        with torch.no_grad():
            out = poskit.attention(q, k, v, enc, **kw)
    assert out.shape == (*q.shape[:3], v.shape[-1])
    executed = set(seen) or {"reference"}
    assert executed == {planned.path}, (str(planned), seen)


def _executed(enc, q, k, v, cpu_kernel=False, **kw):
    seen = []
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrainedEncodingWarning)
        mp.setenv(cpu_flash.ENV_SWITCH, "1" if cpu_kernel else "0")
        mp.setattr(cpu_flash, "available", lambda: True)
        reported = route(enc, q, k, v=v, **kw)
        _spies(mp, seen)
        poskit.attention(q, k, v, enc, **kw)
    return reported, set(seen) or {"reference"}


@pytest.mark.parametrize("name, kw, path", [
    ("rope", {}, "sdpa"),
    ("rope", dict(backend="reference"), "reference"),
    ("pope", {}, "blocked"),
    ("pope", dict(cpu_kernel=True), "cpu-flash"),
    ("pope", dict(backend="triton"), "triton"),
    ("alibi", {}, "blocked"),
    ("alibi", dict(attn_mask=torch.ones(4, 4, dtype=torch.bool).tril()), "sdpa"),
    ("relative", {}, "blocked-bias"),
    ("cope", {}, "blocked-contextual"),
    ("cope", dict(backend="triton"), "triton"),
    ("cope", dict(attn_mask=torch.ones(4, 4, dtype=torch.bool).tril()), "reference"),
])
def test_every_path_is_reported_as_executed(name, kw, path):
    pytest.importorskip("triton") if kw.get("backend") == "triton" else None
    enc = poskit.build_encoding(name, head_dim=16, num_heads=2)
    q, k, v = (torch.randn(1, 2, 4, 16) for _ in range(3))
    assert _executed(enc, q, k, v, is_causal=True, **kw) == (path, {path})


def test_plan_says_why(monkeypatch):
    kernel_off(monkeypatch)  # (the kernel's plan: test_cpu_flash.py)
    q = torch.zeros(1, 2, 4, 16)
    pope = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    planned = plan(q, q, q, pope)
    assert planned.path == "blocked" and planned.backend == "sdpa"
    assert str(planned) == ("blocked (backend sdpa): auto: the sdpa backend serves an encoding of kind 'qk'; "
                            "q/k 2x wider than v on CPU, at most 4096 keys or a few queries")
    assert planned.runner is engine.runners.run_blocked_qk
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()  # a general mask: the blocked path does not serve it
    assert plan(q, q, q, pope, attn_mask=keep).path == "sdpa"
    cope = poskit.build_encoding("cope", head_dim=16, num_heads=2)
    assert plan(q, q, q, cope, attn_mask=keep).reasons[-1] == (
        "a general attn_mask (not a key padding mask): the reference backend is exact with it")


def test_route_keeps_its_positional_signature_and_reads_masks_as_attention_does(monkeypatch):
    kernel_off(monkeypatch)  # (with the kernel: "cpu-flash" for the plain call, test_cpu_flash.py)
    q = torch.zeros(1, 2, 4, 16)
    alibi = poskit.build_encoding("alibi", head_dim=16, num_heads=2)
    assert route(alibi, q) == route(alibi, q, q) == route(alibi, q, q, "auto") == "blocked"
    # a general mask sends a static bias to SDPA with the mask merged in: route() sees the mask now
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    assert route(alibi, q, attn_mask=keep) == "sdpa"
    assert route(alibi, q, backend="reference") == "reference"


def test_no_module_of_the_attention_package_branches_on_an_encoding_name():
    import pathlib

    package = pathlib.Path(engine.__file__).parent
    for path in sorted(package.glob("*.py")):
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())  # comments aside
        code = re.sub(r'f?"(?:[^"\\]|\\.)*"', '""', code)  # and messages
        assert not re.search(r"\.name\s*(==|!=|in\b)|\bname\s*(==|!=)\s*['\"]", code), path.name
        assert not re.findall(r"getattr\((self\.)?enc", code), path.name
