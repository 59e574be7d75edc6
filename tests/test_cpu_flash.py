"""The compiled CPU attention kernel (attention/cpu_flash.py + .cpp, built by attention/kernel_build.py).

- Its switch (POSKIT_CPU_KERNEL: on unless "0") and its build: a cache keyed by source, torch, compiler and
  instruction set; a machine without a compiler keeps the usual paths with one warning (faked here).
- Its numbers: the kernel called directly against a float64 formula written out here (property test over shapes,
  grouped kv heads, tiles, positions, masks and both bias forms), and every encoding it serves through
  poskit.attention against the float64 reference path, values and gradients (q, k, v and the encoding's
  parameters: the bias table's gradient), with causal and key padding masks, grouped kv heads, odd lengths,
  Tq != Tk, decode against a KV cache, bf16.
- Its routes: what takes it by default, what keeps its path (general masks, float64, NaN, FIRE past its
  threshold, equal-width q/k, contextual encodings), and plan()'s reason.

Tests that need the library skip with the reason where it cannot be built; the library is compiled once per
machine (a disk cache), so only the first session on a machine pays for the build (the `kernel` fixture).
"""
import copy
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from cpu_kernel_helpers import require_kernel
from memory_helpers import allocated_bytes
from poskit.attention import KVCache, cached_attention, cpu_flash, kernel_build, plan
from poskit.attention.engine import route
from poskit.encodings.kernel_bias import MAX_TABLE_DISTANCES, KernelBias, declared, distance_span
from poskit.encodings.registration import UntrainedEncodingWarning

SRC = Path(poskit.__file__).resolve().parents[1]
# every encoding the kernel serves by default, with options that make each one's bias interesting at small sizes
SERVED = {
    "pope": dict(delta_init="uniform"),
    "alibi": {},
    "t5": dict(num_buckets=8, max_distance=20),
    "t5-causal": dict(num_buckets=8, max_distance=20, bidirectional=False),
    "kerple-log": {},
    "kerple-power": {},
    "dynamic": dict(hidden=8),
    "fire": dict(threshold_init=64.0),
    "relative": dict(max_distance=80, init_std=0.5),
    "relative-capped": dict(max_distance=5, init_std=0.5),
    # contextual positions with gates from the keys; p_max small, so that the positions clamp in these lengths
    "cope": dict(p_max=8, init_std=0.5),
    "cope-alibi": dict(p_max=8),
}


def build(label, D=8, H=4):
    name = "t5" if label == "t5-causal" else label
    return poskit.build_encoding(name, head_dim=D, num_heads=H, **SERVED[label])


@pytest.fixture(scope="session")
def kernel():
    """The library, built (or found in the cache) once per test session; skips where it cannot be built."""
    require_kernel()
    return cpu_flash.kernel()


@pytest.fixture(autouse=True)
def _reading_calibrations(monkeypatch):
    """This module's tests read calibrations as users do (from temporary files; the machine's own stays hidden by
    tests/conftest.py), where the rest of the suite routes by the defaults."""
    from poskit.attention import kernel_calibration as kc

    monkeypatch.delenv(kc.ENV_SWITCH)


@pytest.fixture(autouse=True)
def _quiet_untrained():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrainedEncodingWarning)
        yield


# --- the switch and the build (no compiler needed) --------------------------------------------------------
@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("", True), ("0", False), ("off", False)])
def test_switch_values(monkeypatch, value, expected):
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, value)
    assert cpu_flash.enabled() is expected


def test_switch_unset_is_on(monkeypatch):
    """The kernel is the default CPU path: only POSKIT_CPU_KERNEL=0 turns it off."""
    monkeypatch.delenv(cpu_flash.ENV_SWITCH, raising=False)
    assert cpu_flash.enabled() is True


def test_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match="POSKIT_CPU_KERNEL.*'maybe'"):
        cpu_flash.enabled()


def test_switched_off_routes_as_without_the_kernel(monkeypatch):
    monkeypatch.setenv(cpu_flash.ENV_SWITCH, "0")
    q = torch.randn(1, 2, 70, 8)
    assert route(build("pope", H=2), q) == "blocked"
    assert route(build("alibi", H=2), q) == "blocked"
    assert route(build("relative", H=2), q) == "blocked-bias"


def test_the_cache_key_follows_source_torch_compiler_and_instruction_set(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_build, "compiler_version", lambda compiler: "c++ 1.0")
    key = kernel_build.build_key("c++")
    here = kernel_build.key_directory(key)
    assert here.parent == tmp_path and here.name.startswith(f"cpu_flash-{key['isa'].lower()}-")
    other_isa = "AVX2" if key["isa"] == "AVX512" else "AVX512"  # a level this machine does not have
    for field, other in (("torch", "0.0"), ("compiler", "c++ 2.0"), ("isa", other_isa), ("source_sha256", "0" * 64)):
        assert kernel_build.key_directory({**key, field: other}) != here, field
    assert key["isa"] in ("AVX512", "AVX2", "DEFAULT")
    # a portable instruction-set level, never -march=native (a library built on one CPU runs on its peers)
    assert not any("native" in flag for flag in key["flags"])


def test_the_cache_key_does_not_depend_on_where_the_source_or_torch_lies(monkeypatch, tmp_path):
    # two checkouts of one commit (a clone, a worktree, an installed copy) or two environments with one torch
    # build the same binary: they share its cache directory and its calibration
    monkeypatch.setattr(kernel_build, "compiler_version", lambda compiler: "c++ 1.0")
    here = kernel_build.key_directory(kernel_build.build_key("c++"))
    copy = tmp_path / "elsewhere" / kernel_build.SOURCE.name
    copy.parent.mkdir()
    copy.write_bytes(kernel_build.SOURCE.read_bytes())
    monkeypatch.setattr(kernel_build, "SOURCE", copy)
    torch_root = tmp_path / "other-env" / "torch"
    monkeypatch.setattr(kernel_build, "_torch_dirs", lambda: (torch_root / "include", torch_root / "lib"))
    assert kernel_build.key_directory(kernel_build.build_key("c++")) == here
    copy.write_bytes(kernel_build.SOURCE.read_bytes() + b"\n// changed\n")
    assert kernel_build.key_directory(kernel_build.build_key("c++")) != here  # the source's bytes do count


def test_the_cache_directory_follows_its_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_build.CACHE_ENV, str(tmp_path / "k"))
    assert kernel_build.cache_root() == tmp_path / "k"
    monkeypatch.delenv(kernel_build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_build.cache_root() == tmp_path / "poskit" / "kernels"


def test_no_compiler_is_one_line_and_builds_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert kernel_build.find_compiler() is None
    with pytest.raises(kernel_build.KernelUnavailable, match=r"no C\+\+ compiler found \(looked for \$CXX="):
        kernel_build.build()
    assert not any(tmp_path.iterdir())


def test_a_build_on_first_use_says_how_to_calibrate(kernel, monkeypatch):
    # a library built by the first call that needs it (not by `poskit kernel build`, which calibrates after
    # building) routes the rope family to SDPA until calibrated: the build's messages say so, and how
    library = kernel_build.cached_library()
    monkeypatch.setattr(kernel_build, "cached_library", lambda: None)
    monkeypatch.setattr(kernel_build, "build", lambda progress: progress("built") or library)
    lines = []
    assert kernel_build.load(progress=lines.append) == library
    assert lines == ["built", kernel_build.NOT_CALIBRATED] and "`poskit kernel calibrate`" in lines[1]
    with pytest.raises(kernel_build.KernelUnavailable, match="not built yet"):
        kernel_build.load(build_if_missing=False, progress=lines.append)
    assert len(lines) == 2


def test_a_missing_prebuilt_library_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_build.PREBUILT_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(kernel_build.KernelUnavailable, match="POSKIT_CPU_KERNEL_LIB names .*missing.so"):
        kernel_build.load()


def test_without_a_compiler_attention_keeps_its_paths_with_one_warning(tmp_path):
    """A fresh process on a machine without a compiler (faked: $CXX names no program, an empty kernel cache):
    one one-line RuntimeWarning, the usual paths, the reference's numbers, for every call of the process."""
    code = (
        "import warnings, torch, poskit\n"
        "from poskit.attention.engine import route\n"
        "warnings.simplefilter('always')\n"
        "enc = poskit.build_encoding('alibi', head_dim=8, num_heads=2)\n"
        "q, k, v = (torch.randn(1, 2, 70, 8) for _ in range(3))\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    paths = {route(enc, q, k) for _ in range(3)}\n"
        "    outs = [poskit.attention(q, k, v, enc, is_causal=True) for _ in range(2)]\n"
        "want = poskit.attention(q, k, v, enc, is_causal=True, backend='reference')\n"
        "torch.testing.assert_close(outs[0], want)\n"
        "import json\n"
        "print(json.dumps([sorted(paths), [[w.category.__name__, str(w.message)] for w in seen]]))\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), kernel_build.CACHE_ENV: str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.pop(cpu_flash.ENV_SWITCH, None)
    env.pop(kernel_build.PREBUILT_ENV, None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    paths, seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert paths == ["blocked"] and len(seen) == 1 and seen[0][0] == "RuntimeWarning", run.stdout
    assert "compiled CPU attention kernel is unavailable (no C++ compiler found" in seen[0][1]
    assert "\n" not in seen[0][1] and "compiling" not in run.stderr  # one line, and nothing was compiled


def test_an_unbuildable_kernel_warns_once_in_process(monkeypatch, tmp_path):
    monkeypatch.setenv(kernel_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_build, "find_compiler", lambda: None)
    monkeypatch.delenv(kernel_build.PREBUILT_ENV, raising=False)
    monkeypatch.delenv(cpu_flash.ENV_SWITCH, raising=False)
    cpu_flash.kernel.cache_clear()
    try:
        enc = build("pope", H=2)
        q, k, v = (torch.randn(1, 2, 80, 8) for _ in range(3))
        with pytest.warns(RuntimeWarning, match="unavailable .no C.. compiler found"):
            assert route(enc, q, k) == "blocked"
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # warned once per process, not per call
            got = poskit.attention(q, k, v, enc, is_causal=True)
        torch.testing.assert_close(got, poskit.attention(q, k, v, enc, is_causal=True, backend="reference"))
    finally:
        cpu_flash.kernel.cache_clear()  # the next test finds the real library again


def test_the_cli_builds_and_reports(kernel, capsys):
    from poskit.cli import main

    assert main(["kernel", "build", "--no-calibrate"]) == 0
    out = capsys.readouterr().out
    assert "ready: " in out and "calibrating" not in out
    assert main(["kernel", "info"]) == 0
    out = capsys.readouterr().out
    assert "isa:" in out and "compiler:" in out and "library:" in out and "not built" not in out
    assert "calibration: " in out


def test_the_cli_calibrates_after_building_and_says_what_it_decided(kernel, capsys, monkeypatch):
    from poskit.cli import kernel as kernel_cli
    from poskit.cli import main

    seen = []

    def calibrate(library, **kwargs):  # the measuring itself is tested above, on a temporary library path
        seen.append(library)
        return {"results": {"qk/float32": {"kernel": True}, "qk/bfloat16": {"kernel": False}}}

    monkeypatch.setattr(kernel_cli, "calibrate", calibrate)
    assert main(["kernel", "build"]) == 0 and main(["kernel", "calibrate"]) == 0
    out = capsys.readouterr().out
    assert len(seen) == 2 and seen[0] == seen[1] == kernel_build.cached_library()
    assert out.count("the kernel serves all but qk/bfloat16") == 2


def test_the_cli_without_a_compiler_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    from poskit.cli import main

    monkeypatch.setattr(kernel_build, "find_compiler", lambda: None)
    with pytest.raises(SystemExit) as exit_:
        main(["kernel", "build"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot build the CPU attention kernel: no C++ compiler found" in err


# --- the declarations ---------------------------------------------------------------------------------------
def test_each_bias_encoding_declares_the_bias_it_computes():
    """A declared table equals the encoding's own bias on every pair (so the kernel adds the same numbers)."""
    qp, kp = torch.arange(30, 45)[None], torch.arange(40)[None]
    q = torch.randn(1, 4, 15, 8)
    for label in ("t5", "t5-causal", "kerple-log", "kerple-power", "dynamic", "fire", "alibi"):
        enc = build(label)
        found = cpu_flash.as_table(declared(enc, qp, kp), qp, kp)
        lo = found.offset
        d = qp[0][:, None] - kp[0][None, :]
        table_bias = found.values[:, d - lo]  # (H, Tq, Tk)
        # (the same elementwise ops: equal up to the last bit of a vectorised pow or log on another shape)
        torch.testing.assert_close(table_bias, enc.bias(q, qp, kp, 0.3)[0].expand_as(table_bias), atol=0, rtol=3e-7,
                                   msg=lambda m: f"{label}: {m}")


def test_declarations_that_decline():
    fire = build("fire")  # threshold 64: past it the normaliser depends on the query
    assert declared(fire, torch.arange(64)[None], torch.arange(64)[None]) is not None
    assert declared(fire, torch.arange(66)[None], torch.arange(66)[None]) is None
    assert declared(poskit.build_encoding("cope", head_dim=8, num_heads=4), torch.arange(4)[None],
                    torch.arange(4)[None]) is None  # no declaration: the default
    far = torch.tensor([[0, MAX_TABLE_DISTANCES * 2]])
    assert distance_span(far, far) is None and declared(build("t5"), far, far) is None

    class Reshaped(type(build("alibi"))):  # redefines the bias below the class that declared it
        def bias(self, q, q_positions, k_positions, scale):
            return 2 * super().bias(q, q_positions, k_positions, scale)

    assert declared(Reshaped(head_dim=8, num_heads=4), torch.arange(4)[None], torch.arange(4)[None]) is None


# --- the kernel against a float64 formula ----------------------------------------------------------------------
def formula(q, k, v, scale, qp, kp, causal, pad, bias):
    """softmax(scale q k^T + bias, masked) v in float64, written out; rows that see no key are zeros."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    logits = scale * q @ k.transpose(-1, -2)
    B, H, Tq, Tk = logits.shape
    visible = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if causal:
        visible = visible & (kp[:, None, None, :] <= qp[:, None, :, None])
    if pad is not None:
        visible = visible & pad[:, None, None, :]
    if bias is not None:
        d = (qp[:, :, None] - kp[:, None, :]).expand(B, Tq, Tk)  # (B, Tq, Tk)
        if bias.form == "distance_table":
            logits = logits + bias.values.double()[:, d - bias.offset].permute(1, 0, 2, 3)
        else:
            M = bias.offset
            e = bias.values.double()[d.clamp(-M, M) + M]  # (B, Tq, Tk, E)
            logits = logits + scale * torch.einsum("bhte,btse->bhts", q, e)
    logits = logits.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(logits, -1).nan_to_num(0.0)
    return torch.where(visible.any(-1, keepdim=True), weights, 0.0) @ v


@st.composite
def problems(draw, widths=st.sampled_from([4, 8, 12]), lengths=st.integers(1, 40),
             blocks=st.tuples(st.integers(1, 17), st.integers(1, 17)), value_widths=None, query_lengths=None):
    B, Hkv = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 3))
    Tq, Tk = draw(lengths if query_lengths is None else query_lengths), draw(lengths)
    E, Dv = draw(widths), draw(widths if value_widths is None else value_widths)
    causal = draw(st.booleans())
    gaps = draw(st.booleans())  # positions with gaps: the kernel's general (not consecutive) key path
    per_batch = draw(st.booleans())
    rows = B if per_batch else 1
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    step = (lambda n: torch.randint(1, 3, (rows, n), generator=g).cumsum(1)) if gaps else (
        lambda n: torch.arange(n).expand(rows, n) + 1)
    kp = step(Tk) + draw(st.integers(-3, 3))
    qp = step(Tq) + draw(st.integers(-10, 40))
    pad = None
    if draw(st.booleans()):
        pad = torch.rand(B, Tk, generator=g) > 0.3
    form = draw(st.sampled_from([None, "distance_table", "offset_embeddings"]))
    bias = None
    if form == "distance_table":
        lo, hi = distance_span(qp, kp)
        bias = KernelBias(form, torch.randn(H, hi - lo + 1, generator=g).requires_grad_(), lo)
    elif form == "offset_embeddings":
        M = draw(st.integers(0, 12))
        bias = KernelBias(form, torch.randn(2 * M + 1, E, generator=g).requires_grad_(), M)
    q = torch.randn(B, H, Tq, E, generator=g).requires_grad_()
    k = torch.randn(B, Hkv, Tk, E, generator=g).requires_grad_()
    v = torch.randn(B, Hkv, Tk, Dv, generator=g).requires_grad_()
    return q, k, v, draw(st.floats(0.1, 1.0)), qp, kp, causal, pad, bias, draw(blocks)


def check_against_formula(q, k, v, scale, qp, kp, causal, pad, bias, blocks, atol=2e-5, bias_atol=None, **kw):
    kw.setdefault("tiled_rows", 1)  # the tiles, unless a test asks for the decode form
    got = cpu_flash.cpu_flash_attention(q, k, v, scale=scale, q_positions=qp, k_positions=kp, causal=causal,
                                        key_padding_mask=pad, bias=bias, block_q=blocks[0], block_k=blocks[1], **kw)
    leaves = [q, k, v] + ([bias.values] if bias is not None else [])
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    bias64 = None if bias is None else bias._replace(values=leaves64[3])
    want = formula(*leaves64[:3], scale, qp, kp, causal, pad, bias64)
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)
    # the incoming gradient as the kernel gets it (rounded to its dtype), so that only the kernel's own rounding
    # separates the two
    w = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).to(got.dtype)
    grads = torch.autograd.grad(got, leaves, w)
    wants = torch.autograd.grad(want, leaves64, w.double(), allow_unused=True)
    for name, a, b in zip(("q", "k", "v", "bias"), grads, wants):
        b = torch.zeros_like(a, dtype=torch.float64) if b is None else b
        tol = bias_atol if name == "bias" and bias_atol is not None else atol
        torch.testing.assert_close(a.double(), b, atol=tol * max(1.0, b.abs().max().item()), rtol=0,
                                   msg=lambda m: f"gradient of {name}: {m}")


@settings(max_examples=30, deadline=None)
@given(problem=problems())
def test_the_kernel_equals_the_float64_formula(kernel, problem):
    """Tiles of 1-17 queries/keys (ragged everywhere), Tq != Tk, q/k wider or narrower than v, grouped kv heads,
    causal by position with queries anywhere against the keys (early ones may see no key: zeros), positions with
    gaps or per batch row, key padding, and both bias forms with their gradients."""
    check_against_formula(*problem)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(problem=problems())
def test_the_kernel_equals_the_float64_formula_at_length(kernel, problem):
    check_against_formula(*problem)


DECODE_FORM = 10**9  # tiled_rows past every call's query rows per kv head: the forward takes the decode form
# a few new queries against caches of up to two and a half of the decode form's 512-key blocks, widths below,
# at and past its register forms' 128 (odd ones too)
decode_problems = problems(widths=st.integers(1, 150), value_widths=st.integers(1, 150),
                           query_lengths=st.integers(1, 5), lengths=st.integers(1, 1300))


@settings(max_examples=30, deadline=None)
@given(problem=decode_problems)
def test_the_decode_form_equals_the_float64_formula(kernel, problem):
    """The decode form (all of a kv head's query rows at once, its keys and values read where they lie in blocks
    of 512, split among the threads where there are fewer (batch, kv head) pairs than threads): grouped kv heads,
    causal by position with queries anywhere against the keys, gaps, per-batch positions, padding and both bias
    forms. The backward takes the tiles with the decode form's logsumexp, so its gradients check that too. The
    offset embeddings' gradient sums over every key: at these lengths and widths (up to 1300 keys, 150 wide) its
    rounding reached 2.8e-5 of its largest entry through the tiles alone and 4.2e-5 with the decode form's
    logsumexp (the worst of 300 drawn problems each), past the 2e-5 of the short problems above."""
    check_against_formula(*problem, bias_atol=1e-4, tiled_rows=DECODE_FORM)


@settings(max_examples=20, deadline=None)
@given(problem=decode_problems)
def test_bf16_through_the_decode_form_is_within_a_few_roundings_of_the_float64_formula(kernel, problem):
    """bf16 read in place by the register forms (widths up to 128) or widened (past it); bounds as the tiles'
    bf16 tests (the scale shrinks with q/k's width as there)."""
    q, k, v, scale, *rest = _bf16(problem)
    scale *= min(1.0, (16 / q.shape[-1]) ** 0.5)
    check_against_formula(q, k, v, scale, *rest, atol=4e-2, bias_atol=0.25, tiled_rows=DECODE_FORM)


def _kernel_ops_run(call) -> set[str]:
    """Which of the kernel's forward operators `call()` ran ("forward": the tiles, "decode"), as torch's profiler
    records them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    return {e.name for e in prof.events()} & {"poskit_cpu_flash::forward", "poskit_cpu_flash::decode"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_query_rows_per_kv_head_take_the_decode_form_as_this_machine_measured(kernel, tmp_path, monkeypatch,
                                                                                  dtype):
    # below the threshold (new queries x query heads per kv head) the decode form, from it the tiles; the threshold
    # is this machine's calibration's for the dtype, else the default; an explicit tiled_rows overrides both
    from poskit.attention import kernel_calibration as kc

    library = tmp_path / kernel_build.LIBRARY_NAME
    monkeypatch.setattr(cpu_flash, "_library", library)
    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(2, 2, 700, 16, generator=g).to(dtype) for _ in range(2))

    def ran(queries, heads=2, **kw):
        q = torch.randn(2, heads, queries, 16, generator=g).to(dtype)
        return _kernel_ops_run(lambda: cpu_flash.cpu_flash_attention(q, k, v, scale=0.25, **kw))
    default = cpu_flash.FLASH_DECODE_TILED_ROWS
    assert cpu_flash.flash_decode_tiled_rows(dtype) == default
    decode, tiles = {"poskit_cpu_flash::decode"}, {"poskit_cpu_flash::forward"}
    assert ran(1) == decode and ran(default - 1) == decode and ran(default) == tiles
    assert ran(1, heads=2 * default) == tiles  # default query heads per kv head: as many rows
    assert ran(1, tiled_rows=1) == tiles and ran(default, tiled_rows=default + 1) == decode
    kc.write(library, {"results": {}, "flash_decode_rows": {"tiled_rows": {kc._dtype_name(dtype): 3}}})
    assert cpu_flash.flash_decode_tiled_rows(dtype) == 3
    assert ran(2) == decode and ran(3) == tiles
    with pytest.raises(ValueError, match="tiled_rows must be a positive int or None"):
        ran(1, tiled_rows=0)


@pytest.mark.parametrize("rows", [{"float32": 0}, {"bfloat16": 2.5}, {"float16": 4}])
def test_a_malformed_flash_decode_threshold_is_named(tmp_path, rows):
    from poskit.attention import kernel_calibration as kc

    path = tmp_path / kc.FILE_NAME
    path.write_text(json.dumps({"results": {}, "flash_decode_rows": {"tiled_rows": rows}}))
    with pytest.raises(kc.CalibrationError, match=r"flash_decode_rows\.tiled_rows.*not a positive integer"):
        kc.read(path)


@pytest.fixture(scope="module", params=[False, True], ids=["widened", "bf16-products"])
def products(request, kernel):
    """bf16 widened to fp32 per tile, and (where the CPU has AVX512_BF16) the kernel's bf16 products."""
    if request.param and not cpu_flash.bf16_products_available():
        pytest.skip("bf16 products need a CPU with AVX512_BF16 and an AVX-512 build of the kernel; this machine "
                    "widens bf16 to fp32 (the other case)")
    return request.param


def _bf16(problem):
    """A drawn problem with q, k, v in bf16 (leaves again); positions, masks, bias and tiles as drawn."""
    q, k, v, *rest = problem
    return (*(t.detach().bfloat16().requires_grad_() for t in (q, k, v)), *rest)


@settings(max_examples=30, deadline=None)
@given(problem=problems(widths=st.integers(1, 19)))
def test_bf16_either_way_is_within_a_few_roundings_of_the_float64_formula(products, problem):
    """bf16 inputs with odd and even widths (the products pair up the inner dimension: an odd one ends in a half
    pair), ragged tiles, grouped kv heads, masks and both bias forms, widened or through the bf16 products,
    against the formula in float64 on the same bf16 inputs. The bias parameters' gradient sums dS = P (dP - D)
    over many logits, where D = rowsum(dO * O) comes from the output rounded to bf16 (as in FlashAttention's
    backward and torch's): each row's dS then sums to dO . (O - O rounded), not 0, and the parameter's gradient
    adds that over the rows. Over 150 drawn problems it stayed within 0.025 of the largest entry either way; the
    worst found, 0.123, is an exact gradient of 0 (one embedding for every offset: a bias constant along each row)
    summed over 21 rows, hence its wider bound."""
    check_against_formula(*_bf16(problem), atol=4e-2, bias_atol=0.25, bf16_products=products)


@settings(max_examples=12, deadline=None)
@given(problem=problems(widths=st.integers(1, 150), value_widths=st.integers(1, 19), lengths=st.integers(1, 200),
                        blocks=st.tuples(st.integers(1, 70), st.sampled_from([64, 128]))))
def test_bf16_products_on_heads_packed_once_are_within_a_few_roundings_of_the_float64_formula(products, problem):
    """Key tiles of whole column blocks (64, 128 keys), where the bf16 products pack each kv head once and read
    views of it: q/k widths past one block of columns and odd, tiles of up to 70 queries (the backward's
    transposed products), more keys than one tile, masks and both bias forms. v stays as narrow as in the test
    above, whose bound it shares: dQ's error from D = rowsum(dO * O rounded) grows with v's width (at 150 it
    reached 0.066 on 2 keys, widened as well as with the products). The bias parameters' gradient sums that
    error over the query rows: its bound, the test above's for up to 40 rows, grows in proportion past them (over
    300 drawn problems the largest was 0.26, widened and with the products alike, at 0.25 fixed). The scale
    shrinks with q/k's width so that the logits are no sharper than at the widths those bounds were set for."""
    q, k, v, scale, *rest = _bf16(problem)
    E, rows = q.shape[-1], q.shape[2]
    scale *= min(1.0, (16 / E) ** 0.5)  # logits as large as at the widths the bound was set for, not sharper
    check_against_formula(q, k, v, scale, *rest, atol=4e-2, bias_atol=0.25 * max(1.0, rows / 40),
                          bf16_products=products)


def test_bf16_is_within_a_few_roundings_of_the_float64_formula(kernel):
    """bf16 in and out, fp32 inside; long enough for several default tiles each way, ragged."""
    T = 2 * cpu_flash.BLOCK_K + 37
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, T, 32, generator=g).bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(1, 2, T, 16, generator=g).bfloat16().requires_grad_()
    pos = torch.arange(T)[None]
    lo, hi = distance_span(pos, pos)
    table = KernelBias("distance_table", torch.randn(2, hi - lo + 1, generator=g).requires_grad_(), lo)
    for causal, bias in ((True, None), (False, None), (True, table)):
        check_against_formula(q, k, v, 0.25, pos, pos, causal, None, bias, (cpu_flash.BLOCK_Q, cpu_flash.BLOCK_K),
                              atol=4e-2)


# --- every encoding it serves, through poskit.attention ---------------------------------------------------------
def _against_reference(enc, q, k, v, dtype=torch.float32, atol=2e-5, **kw):
    """poskit.attention on the kernel against backend='reference' in float64: values, q/k/v and parameter grads."""
    enc = enc.to(dtype)
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    assert route(enc, *leaves[:2], v=leaves[2], **kw) == "cpu-flash"
    got = poskit.attention(*leaves, enc, **kw)
    params = [p for p in enc.parameters() if p.requires_grad]
    # a copy: .double() in place would give the parameters new gradient accumulators, cut off from the graph above
    enc64 = copy.deepcopy(enc).double()
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    want = poskit.attention(*leaves64, enc64, backend="reference", **kw)
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)
    w = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad(got, leaves + params, w.to(dtype), allow_unused=True)
    wants = torch.autograd.grad(want, leaves64 + list(p for p in enc64.parameters() if p.requires_grad), w,
                                allow_unused=True)
    for n, (a, b) in enumerate(zip(grads, wants)):
        if b is None:
            assert a is None or not a.any()
            continue
        assert a is not None, n
        torch.testing.assert_close(a.double(), b, atol=atol * max(1.0, b.abs().max().item()), rtol=0,
                                   msg=lambda m: f"gradient {n}: {m}")
    return got


@pytest.mark.parametrize("label", list(SERVED))
@pytest.mark.parametrize("case", ["causal", "padded", "gqa-cross", "plain"])
def test_every_served_encoding_equals_the_float64_reference(kernel, label, case, monkeypatch):
    monkeypatch.setattr(cpu_flash, "BLOCK_Q", 8)  # several tiles each way at these sizes
    monkeypatch.setattr(cpu_flash, "BLOCK_K", 16)
    monkeypatch.setattr(cpu_flash, "BLOCK_Q_BACKWARD", 16)  # the backward tiles the queries otherwise
    monkeypatch.setattr(cpu_flash, "LONG_KEYS", 30)  # (at 30 keys or more)
    B, H, Hkv, Tq, Tk = {"causal": (2, 4, 4, 37, 37), "padded": (2, 4, 2, 29, 29), "gqa-cross": (1, 4, 1, 13, 41),
                         "plain": (2, 4, 4, 21, 33)}[case]
    if label.startswith("relative") and case != "gqa-cross":
        Tq = min(Tq, Tk)
    enc = build(label, H=H)
    g = torch.Generator().manual_seed(list(SERVED).index(label))
    q = torch.randn(B, H, Tq, 8, generator=g)
    k, v = (torch.randn(B, Hkv, Tk, 8, generator=g) for _ in range(2))
    kw = dict(enable_gqa=Hkv != H, is_causal=case != "plain")
    if case == "padded":
        keep = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        keep[0, ..., :5] = False  # left padding: early queries of row 0 see no key
        keep[1, ..., -4:] = False
        kw["attn_mask"] = keep
    if case == "gqa-cross":  # a few new queries at the end of longer keys
        kw.update(q_positions=torch.arange(Tk - Tq, Tk), k_positions=torch.arange(Tk))
    # CoPE's gradients pass through the gates' running sums and q . e: a few more fp32 roundings
    _against_reference(enc, q, k, v, atol=5e-5 if label.startswith("cope") else 2e-5, **kw)


@pytest.mark.parametrize("label", ["pope", "alibi", "t5-causal", "relative-capped", "dynamic", "cope", "cope-alibi"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_bf16_through_attention_is_close_to_the_float64_reference(products, label, kv_heads, monkeypatch):
    # kv_heads 4: the gradients are written in bf16 by the kernel; 2 (grouped): in fp32, summed over each group
    # before the one rounding. The engine takes the machine's default: products where available (made unavailable
    # here for the widened case)
    if not products:
        monkeypatch.setattr(cpu_flash, "bf16_products_available", lambda: False)
    enc = build(label)
    q = torch.randn(2, 4, 50, 8, generator=torch.Generator().manual_seed(0))
    k, v = (torch.randn(2, kv_heads, 50, 8, generator=torch.Generator().manual_seed(n)) for n in (1, 2))
    # grouped, dynamic's parameter gradient (a sum over every logit) differs by 0.059 from float64 in one
    # entry, with the kernel's gradients in fp32 as before: bf16's rounding of its inputs, hence the wider bound
    atol = 5e-2 if kv_heads == 4 else 8e-2
    _against_reference(enc, q, k, v, dtype=torch.bfloat16, atol=atol, is_causal=True, enable_gqa=kv_heads != 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_dot_is_the_rowsum_of_the_product(kernel, dtype):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, 2, 37, 19, generator=g).to(dtype) for _ in range(2))
    want = (a.double() * b.double()).sum(-1)
    got = cpu_flash.kernel().row_dot(a, b)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("label", ["alibi", "t5-causal", "kerple-log", "relative-capped", "fire", "cope", "cope-alibi"])
def test_decode_against_a_cache_equals_the_full_forward(kernel, label):
    """One token at a time against a KV cache (raw keys: cached_attention calls attention() with the cache's key
    mask), left padding included: each step takes the kernel and equals the full forward's row."""
    enc = build(label)
    B, H, Hkv, T = 2, 4, 2, 11
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, T, 8, generator=g)
    k, v = (torch.randn(B, Hkv, T, 8, generator=g) for _ in range(2))
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, :3] = False
    pos = (torch.arange(T) - torch.tensor([[3], [0]])).clamp(min=0)  # row 0's real tokens at 0, 1, 2, ...
    full = poskit.attention(q, k, v, enc, q_positions=pos, k_positions=pos, is_causal=True, enable_gqa=True,
                            attn_mask=real[:, None, None, :], backend="reference")
    cache = KVCache(1)
    cached_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache, 0, pos[:, :4], attention_mask=real[:, :4])
    for t in range(4, T):
        layer = cache.layer(0)
        one = q[:, :, t:t + 1]
        assert route(enc, one, layer.keys, v=layer.values, is_causal=True, enable_gqa=True, q_positions=pos[:, t:t + 1],
                     k_positions=layer.positions, attn_mask=layer.key_mask[:, None, None, :]) == "cpu-flash"
        step = cached_attention(one, k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0, pos[:, t:t + 1],
                                attention_mask=real[:, t:t + 1])
        torch.testing.assert_close(step, full[:, :, t:t + 1], atol=2e-6, rtol=0)


def test_axial_pope_takes_the_kernel_without_causal_masking(kernel):
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, axial_dims=[4, 4], delta_init="uniform")
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")
    pos = torch.stack((rows.flatten(), cols.flatten()), -1)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=torch.Generator().manual_seed(n)) for n in range(3))
    _against_reference(enc, q, k, v, q_positions=pos, k_positions=pos)


# --- routes ------------------------------------------------------------------------------------------------
def test_what_takes_the_kernel_by_default(kernel, monkeypatch):
    monkeypatch.delenv(cpu_flash.ENV_SWITCH, raising=False)
    long = torch.randn(1, 4, 4097, 8)
    for label in SERVED:
        enc = build(label)
        if label == "relative":
            enc = poskit.build_encoding("relative", head_dim=8, num_heads=4, max_distance=5000)
        if label == "fire":
            continue  # below its threshold only (test_declarations_that_decline)
        for q in (long, long[:, :, :64], long[:, :, :1]):  # every length, decode included
            assert route(enc, q, long, is_causal=True) == "cpu-flash", (label, q.shape)
        assert route(enc.to(torch.bfloat16), long.bfloat16()) == "cpu-flash", label


def test_what_keeps_its_path(kernel):
    q = torch.randn(1, 4, 70, 8)
    general = torch.rand(1, 1, 70, 70) > 0.5
    assert route(build("alibi"), q, attn_mask=general) == "sdpa"  # a general mask: SDPA with it merged, exact
    assert route(build("pope"), q, attn_mask=general) == "sdpa"
    assert route(build("relative"), q, attn_mask=general) == "sdpa"
    assert route(build("alibi").double(), q.double()) == "blocked"  # float64: the exact paths
    assert route(build("pope").half(), q.half()) == "blocked"  # float16 too
    nan = q.clone()
    nan[0, 0, 0, 0] = float("nan")
    assert route(build("alibi"), nan, q) == "blocked"  # NaN rows stay NaN on the materialised paths
    assert route(build("fire"), torch.randn(1, 4, 70, 8), is_causal=True, q_positions=torch.arange(100, 170),
                 k_positions=torch.arange(100, 170)) == "blocked-bias"  # past FIRE's threshold (64 here)
    for name, options in (("rope", {}), ("rope-ntk", dict(factor=4.0)), ("xpos", {}), ("none", {})):
        # equal widths: SDPA's own flash kernel
        assert route(poskit.build_encoding(name, head_dim=8, num_heads=4, **options), q) == "sdpa", name
    for gates in ("values", "separate"):  # CoPE's gates from another source than the keys: its blocked path
        enc = poskit.build_encoding("cope", head_dim=8, num_heads=4, gates=gates)
        assert route(enc, q, q, v=torch.randn(1, 4, 70, 8)) == "blocked-contextual"
    cope = build("cope")
    assert route(cope, nan, q) == "blocked-contextual"  # NaN: the gates would index with NaN positions
    assert route(cope.half(), q.half()) == "blocked-contextual"


def test_tiny_gates_never_index_below_position_zero(kernel, monkeypatch):
    # the backward rebuilds a key's position as (all gates) - (gates before it), summed in the other order than
    # the forward: with gates near 0 that rounds below 0, which once indexed z[-1] (a crash, or garbage)
    monkeypatch.setattr(cpu_flash, "BLOCK_Q", 8)
    monkeypatch.setattr(cpu_flash, "BLOCK_K", 16)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 37, 8, generator=g) * 3
    k = -q[:, :2].repeat_interleave(1, 2).abs() * 3  # q . k strongly negative for many pairs: gates ~ 0
    k = torch.randn(2, 2, 37, 8, generator=g) * 3 + k
    v = torch.randn(2, 2, 37, 8, generator=g)
    for causal in (True, False):
        _against_reference(build("cope"), q, k, v, is_causal=causal, enable_gqa=True, atol=5e-5)


@pytest.mark.parametrize("name", ["cope", "cope-alibi"])
def test_cope_keys_out_of_order_are_refused_as_on_its_blocked_path(kernel, name):
    q, k, v = (torch.randn(1, 4, 6, 8) for _ in range(3))
    with pytest.raises(ValueError, match="k_positions must be non-decreasing for cope/cope-alibi"):
        poskit.attention(q, k, v, build(name), is_causal=True, q_positions=torch.arange(6),
                         k_positions=torch.tensor([0, 2, 1, 3, 4, 5]))


def test_a_general_mask_falls_back_exactly(kernel):
    enc = build("relative-capped")
    q, k, v = (torch.randn(2, 4, 19, 8, generator=torch.Generator().manual_seed(n)) for n in range(3))
    keep = torch.rand(2, 1, 19, 19, generator=torch.Generator().manual_seed(9)) > 0.4
    got = poskit.attention(q, k, v, enc, attn_mask=keep, is_causal=True)
    torch.testing.assert_close(got, poskit.attention(q, k, v, enc, attn_mask=keep, is_causal=True,
                                                     backend="reference"))


def test_plan_says_why(kernel):
    q = torch.zeros(1, 2, 4, 16)
    pope = poskit.build_encoding("pope", head_dim=16, num_heads=2)
    assert str(plan(q, q, q, pope)) == ("cpu-flash (backend sdpa): auto: the sdpa backend serves an encoding of kind "
                                        "'qk'; q/k 2x wider than v on CPU: the compiled kernel")
    alibi = poskit.build_encoding("alibi", head_dim=16, num_heads=2)
    assert plan(q, q, q, alibi).reasons[-1] == ("a bias declared as a distance table, computed per tile from the "
                                                "positions on CPU: the compiled kernel")


def test_relative_without_cap_still_refuses_offsets_past_its_table(kernel):
    enc = poskit.build_encoding("relative", head_dim=8, num_heads=2, max_distance=4)
    q = torch.randn(1, 2, 9, 8)
    with pytest.raises(ValueError, match="max_distance=4"):
        poskit.attention(q, q, q, enc, is_causal=True)


def test_scale_and_odd_widths_through_the_engine(kernel):
    """A non-default scale and a head_dim that fills no vector register exactly."""
    enc = poskit.build_encoding("alibi", head_dim=5, num_heads=3)
    q, k, v = (torch.randn(1, 3, 23, 5, generator=torch.Generator().manual_seed(n)) for n in range(3))
    _against_reference(enc, q, k, v, is_causal=True, scale=0.7)


# --- calibration: routing from this machine's measurements (attention/kernel_calibration.py) ---------------------

def _encoding(name):
    return poskit.build_encoding(name, head_dim=16, num_heads=4, dim=64)


def test_the_kernel_gives_way_only_to_a_fallback_faster_by_the_margin():
    from poskit.attention import kernel_calibration as kc

    assert kc.decide(100.0, 100.0) and kc.decide(109.0, 100.0)  # within the margin: noise keeps the default
    assert not kc.decide(120.0, 100.0)


def test_a_calibration_that_measured_the_fallback_faster_routes_that_form_and_dtype_off_the_kernel(
        kernel, tmp_path, monkeypatch):
    from poskit.attention import kernel_calibration as kc

    library = tmp_path / kernel_build.LIBRARY_NAME
    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    results["qk/float32"] = {"kernel": False}
    results["distance_table/bfloat16"] = {"kernel": False}
    (tmp_path / kc.FILE_NAME).write_text(json.dumps({"results": results}))
    monkeypatch.setattr(cpu_flash, "_library", library)
    q32, q16 = torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16).bfloat16()
    pope, alibi = _encoding("pope"), _encoding("alibi")
    assert route(pope, q32, is_causal=True) != "cpu-flash"
    assert route(pope.to(torch.bfloat16), q16, is_causal=True) == "cpu-flash"
    assert route(alibi, q32, is_causal=True) == "cpu-flash"
    assert route(alibi.to(torch.bfloat16), q16, is_causal=True) != "cpu-flash"
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / "elsewhere" / kernel_build.LIBRARY_NAME)
    assert route(pope, q32, is_causal=True) == "cpu-flash"  # no calibration: the kernel serves


def test_an_unreadable_calibration_names_its_file_and_leaves_the_kernel_on(kernel, tmp_path, monkeypatch):
    from poskit.attention import kernel_calibration as kc

    (tmp_path / kc.FILE_NAME).write_text('{"results": {"qk/float32": {"kernel": "maybe"}}}')
    with pytest.raises(kc.CalibrationError, match=re.escape(str(tmp_path / kc.FILE_NAME)) + ": not a readable kernel"):
        kc.read(tmp_path / kc.FILE_NAME)
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    with pytest.warns(RuntimeWarning, match="not a readable kernel calibration"):
        assert route(_encoding("pope"), torch.randn(1, 4, 8, 16), is_causal=True) == "cpu-flash"


def test_the_suite_reads_no_calibration_from_the_kernel_cache(kernel, tmp_path, monkeypatch):
    # a user's `poskit kernel calibrate` saved beside the cached library once failed this suite's routing tests
    # (tests/conftest.py keeps it out); a calibration elsewhere is read as before
    from poskit.attention import kernel_calibration as kc

    monkeypatch.setattr(kernel_build, "cache_root", lambda: tmp_path / "cache")
    results = {f"{form}/{dtype}": {"kernel": False} for form in kc.FORMS for dtype in kc.DTYPES}
    q = torch.randn(1, 4, 8, 16)
    for library, kernel_serves in ((tmp_path / "cache" / "cpu_flash-x" / kernel_build.LIBRARY_NAME, True),
                                   (tmp_path / "elsewhere" / kernel_build.LIBRARY_NAME, False)):
        library.parent.mkdir(parents=True)
        kc.write(library, {"results": results, "backward_tile": {"block_q": 64}})
        monkeypatch.setattr(cpu_flash, "_library", library)
        assert (route(_encoding("pope"), q, is_causal=True) == "cpu-flash") is kernel_serves
        assert (cpu_flash.backward_block_q(cpu_flash.LONG_KEYS) == cpu_flash.BLOCK_Q_BACKWARD) is kernel_serves


def test_the_backward_takes_the_tile_this_machine_measured_at_long_sequences(kernel, tmp_path, monkeypatch):
    from poskit.attention import kernel_calibration as kc

    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    assert cpu_flash.backward_block_q(cpu_flash.LONG_KEYS) == cpu_flash.BLOCK_Q_BACKWARD  # nothing measured
    for measured in kc.TILE_CHOICES:
        kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results, "backward_tile": {"block_q": measured}})
        assert cpu_flash.backward_block_q(cpu_flash.LONG_KEYS) == measured
        assert cpu_flash.backward_block_q(2 * cpu_flash.LONG_KEYS) == measured
        assert cpu_flash.backward_block_q(cpu_flash.LONG_KEYS - 1) == cpu_flash.BLOCK_Q  # short: not the choice
    assert kc.choose_tile({64: 10.0, 128: 9.0}) == 128 and kc.choose_tile({64: 9.0, 128: 10.0}) == 64
    # a tile the kernel was never measured with is refused by name, and routing keeps its defaults
    kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results, "backward_tile": {"block_q": 96}})
    with pytest.raises(kc.CalibrationError, match="backward_tile.block_q 96 is not one of"):
        kc.read(tmp_path / kc.FILE_NAME)
    with pytest.warns(RuntimeWarning, match="not a readable kernel calibration"):
        assert cpu_flash.backward_block_q(cpu_flash.LONG_KEYS) == cpu_flash.BLOCK_Q_BACKWARD


def test_the_backward_tile_can_be_given_apart_from_the_forwards(kernel, monkeypatch):
    ops, used = cpu_flash.kernel(), []

    class Spy:
        def __getattr__(self, name):
            return getattr(ops, name)

        def forward(self, *args):
            used.append(("forward", args[-3]))  # (the query tile, before the key tile and bf16_products)
            return ops.forward(*args)

        def backward(self, *args):
            used.append(("backward", args[-3]))
            return ops.backward(*args)

    monkeypatch.setattr(cpu_flash, "kernel", lambda: Spy())
    q, k, v = (torch.randn(1, 2, 40, 8, requires_grad=True) for _ in range(3))
    pos = torch.arange(40)[None]
    out = cpu_flash.cpu_flash_attention(q, k, v, scale=0.5, q_positions=pos, k_positions=pos, causal=True,
                                        block_q_backward=16)
    out.sum().backward()
    assert used == [("forward", cpu_flash.BLOCK_Q), ("backward", 16)]
    with pytest.raises(ValueError, match="block_q_backward must be a positive int, got 0"):
        cpu_flash.cpu_flash_attention(q, k, v, scale=0.5, block_q_backward=0)


def test_bf16_calls_take_the_products_where_the_cpu_has_them_unless_measured_slower(kernel, tmp_path, monkeypatch):
    from poskit.attention import kernel_calibration as kc

    ops, used = cpu_flash.kernel(), []

    class Spy:
        def __getattr__(self, name):
            return getattr(ops, name)

        def forward(self, *args):
            used.append(args[-1])  # what routing asked for; run with what this CPU can
            return ops.forward(*args[:-1], args[-1] and ops.bf16_products_available())

    monkeypatch.setattr(cpu_flash, "kernel", lambda: Spy())
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    q, k, v = (torch.randn(1, 2, 20, 8).bfloat16() for _ in range(3))

    def default_call():
        used.clear()
        cpu_flash.cpu_flash_attention(q, k, v, scale=0.3)
        cpu_flash.cpu_flash_attention(q.float(), k.float(), v.float(), scale=0.3)
        return used[:]

    assert default_call() == [ops.bf16_products_available(), False]  # fp32 never; bf16 where the CPU can
    monkeypatch.setattr(cpu_flash, "bf16_products_available", lambda: True)
    assert default_call() == [True, False]  # nothing measured: taken
    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results, "bf16_products": {"use": False}})
    assert default_call() == [False, False]  # measured slower here: widened
    kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results, "bf16_products": {"use": "sometimes"}})
    with pytest.raises(kc.CalibrationError, match="bf16_products.use 'sometimes' is not true or false"):
        kc.read(tmp_path / kc.FILE_NAME)


def test_bf16_products_follow_torchs_onednn_switch(kernel):
    """The products run on oneDNN's micro-kernel: with torch.backends.mkldnn off they are not available (asked for,
    the operator refuses them by name), and a default bf16 call widens instead, with the widened path's result."""
    if not cpu_flash.bf16_products_available():
        pytest.skip("this CPU or build has no bf16 products")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 70, 24, generator=g).bfloat16() for _ in range(3))
    widened = cpu_flash.cpu_flash_attention(q, k, v, scale=0.2, bf16_products=False)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not cpu_flash.bf16_products_available()
        assert torch.equal(cpu_flash.cpu_flash_attention(q, k, v, scale=0.2), widened)
        empty, pos = torch.empty(0), torch.empty(0, 0, dtype=torch.int64)
        with pytest.raises(RuntimeError, match="with torch's oneDNN enabled"):
            cpu_flash.kernel().forward(q, k, v, 0.2, False, pos, pos, torch.empty(0, dtype=torch.bool), 0, empty, 0,
                                       0, 0.0, 64, 512, True)
    assert cpu_flash.bf16_products_available()


def test_bf16_products_asked_for_where_they_cannot_be_had_are_refused_by_name(kernel, monkeypatch):
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"bf16_products=True needs bf16 inputs \(got torch.float32\)"):
        cpu_flash.cpu_flash_attention(q, q, q, scale=0.5, bf16_products=True)
    with pytest.raises(ValueError, match="bf16_products must be True, False or None"):
        cpu_flash.cpu_flash_attention(q, q, q, scale=0.5, bf16_products=1)
    monkeypatch.setattr(cpu_flash, "bf16_products_available", lambda: False)
    with pytest.raises(ValueError, match="a CPU with AVX512_BF16 under an AVX-512 build of the kernel and "
                                         "torch.backends.mkldnn enabled .here: False."):
        cpu_flash.cpu_flash_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), scale=0.5, bf16_products=True)
    # the operator itself refuses them for fp32 (and wherever the CPU lacks the instructions)
    empty, pos = torch.empty(0), torch.empty(0, 0, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="bf16_products needs bf16 inputs and a CPU with AVX512_BF16"):
        cpu_flash.kernel().forward(q, q, q, 0.5, False, pos, pos, torch.empty(0, dtype=torch.bool), 0, empty, 0, 0,
                                   0.0, 64, 512, True)


def test_a_growing_decode_gives_brgemm_a_bounded_set_of_shapes(kernel):
    # oneDNN generates code for each new shape brgemm meets and torch keeps it: a decode step's last key tile grows
    # by one key per step, which made a new shape at nearly every step (hundreds of MB over 512 steps of a bf16
    # decode); 150 steps of the attention and of PoPE's decode in the products form now meet a handful, and equal
    # the float64 formula at every length
    if not cpu_flash.bf16_products_available():
        pytest.skip("bf16 products need a CPU with AVX512_BF16 and an AVX-512 build of the kernel")
    ops = cpu_flash.kernel()
    g = torch.Generator().manual_seed(0)
    start, steps = 1000, 150
    q = torch.randn(1, 2, 1, 64, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, start + steps, 64, generator=g).bfloat16() for _ in range(2))
    q_rows = (torch.randn(1, 1, 16, 128, generator=g) / 8)
    mu = torch.rand(1, 1, start + steps, 64, generator=g).bfloat16()
    angles = torch.rand(1, start + steps, 128, generator=g) * 2 - 1
    ops.brgemm_shapes(True)
    for L in range(start, start + steps):
        out = cpu_flash.cpu_flash_attention(q, k[:, :, :L], v[:, :, :L], scale=0.125, bf16_products=True,
                                            tiled_rows=1)
        if L % 37 == 0:
            want = torch.softmax(0.125 * q.double() @ k[:, :, :L].double().transpose(-1, -2), -1) @ v[:, :, :L].double()
            torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    attention_shapes = ops.brgemm_shapes(True)
    for L in range(start, start + steps):
        out = cpu_flash.magnitude_decode(q_rows, mu[:, :, :L], v[:, :1, :L], angles[:, :L], bf16_products=True,
                                         tiled_rows=1)
        if L % 37 == 0:
            cos, sin = angles[:, None, :L, :64].double(), angles[:, None, :L, 64:].double()
            keys = torch.cat((mu[:, :, :L].double() * cos, mu[:, :, :L].double() * sin), -1)
            want = torch.softmax(q_rows.double() @ keys.transpose(-1, -2), -1) @ v[:, :1, :L].double()
            torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    decode_shapes = ops.brgemm_shapes(False)
    assert 1 <= attention_shapes <= 10 and 1 <= decode_shapes <= 20, (attention_shapes, decode_shapes)


def test_calibrate_times_every_form_and_dtype_and_writes_its_decisions(kernel, tmp_path, monkeypatch):
    from poskit.attention import kernel_calibration as kc
    from poskit.cli.kernel import calibrate

    monkeypatch.setattr(kc, "SHAPE", {"B": 1, "H": 2, "T": 64, "D": 16})  # small: this checks the mechanics
    monkeypatch.setattr(kc, "TILE_SHAPE", {"B": 1, "H": 2, "T": 256, "E": 32, "Dv": 16})
    monkeypatch.setattr(kc, "DECODE_SHAPE", {"B": 2, "H": 2, "T": 300, "D": 16})
    monkeypatch.setattr(kc, "DECODE_ROWS_SHAPE", {"B": 1, "Hkv": 2, "T": 600, "D": 16})
    monkeypatch.setattr(kc, "FLASH_DECODE_ROWS_SHAPE", {"B": 1, "Hkv": 2, "T": 600, "D": 16})
    lines = []
    doc = calibrate(tmp_path / kernel_build.LIBRARY_NAME, rounds=1, progress=lines.append)
    # a line per form and dtype, the tile's, the bf16 products' and the two decode thresholds' per dtype
    assert set(doc["results"]) == {f"{f}/{d}" for f in kc.FORMS for d in kc.DTYPES}
    assert len(lines) == len(kc.FORMS) * len(kc.DTYPES) + 2 + 2 * len(kc.DTYPES)
    for entry in doc["results"].values():
        assert entry["kernel_ms"] > 0 and entry["fallback_ms"] > 0
    for key, entry in doc["results"].items():
        assert entry["kernel"] == kc.decide(entry["kernel_ms"], entry["fallback_ms"], key.split("/")[0])
    tile = doc["backward_tile"]
    assert set(tile["ms"]) == {str(t) for t in kc.TILE_CHOICES} and all(m > 0 for m in tile["ms"].values())
    assert tile["block_q"] == kc.choose_tile({int(t): m for t, m in tile["ms"].items()})
    products = doc.get("bf16_products")
    assert (products is not None) == cpu_flash.bf16_products_available()  # measured where there is a choice
    if products is not None:
        assert products["products_ms"] > 0 and products["widened_ms"] > 0
        assert products["use"] == kc.decide(products["products_ms"], products["widened_ms"])
    # a decode step against cached encoded keys, at each of DECODE_QUERY_COUNTS new queries; the form's own
    # decision is the one-query step's
    by_queries = {}
    for dtype in kc.DTYPES:
        entry = doc["results"][f"qk_equal_decode/{dtype}"]
        assert set(entry["queries"]) == {str(n) for n in kc.DECODE_QUERY_COUNTS}
        for n, timed in entry["queries"].items():
            assert timed["kernel_ms"] > 0 and timed["fallback_ms"] > 0
            assert timed["kernel"] == kc.decide(timed["kernel_ms"], timed["fallback_ms"], "qk_equal_decode")
        assert {k: entry["queries"]["1"][k] for k in ("kernel_ms", "fallback_ms", "kernel")} == {
            k: entry[k] for k in ("kernel_ms", "fallback_ms", "kernel")}
        by_queries[dtype] = tuple((int(n), timed["kernel"]) for n, timed in sorted(
            entry["queries"].items(), key=lambda item: int(item[0])))
    # PoPE's decode through the loops and the products at each count of rows, and the flash forms' decode form
    # against their tiles from one query row: the thresholds chosen from the times
    rows, flash = doc["pope_decode_rows"], doc["flash_decode_rows"]
    for section, counts, paths in ((rows, kc.DECODE_ROW_COUNTS, ("loops_ms", "products_ms")),
                                   (flash, kc.FLASH_DECODE_ROW_COUNTS, ("decode_ms", "tiles_ms"))):
        for dtype in kc.DTYPES:
            timed = section["ms"][dtype]
            assert set(timed) == {str(n) for n in counts}
            assert all(t[p] > 0 for t in timed.values() for p in paths)
            assert section["tiled_rows"][dtype] == kc.choose_tiled_rows(
                {int(n): (t[paths[0]], t[paths[1]]) for n, t in timed.items()})
    assert kc.read(tmp_path / kc.FILE_NAME) == kc.Calibration(
        {tuple(k.split("/")): e["kernel"] for k, e in doc["results"].items()}, tile["block_q"],
        products["use"] if products else None, by_queries, rows["tiled_rows"], flash["tiled_rows"])
    assert doc["threads"] == torch.get_num_threads() and doc["machine"]["cpu"]


def test_calibration_decode_timers_make_one_cache_per_dtype(kernel, monkeypatch):
    """The decode thresholds' timers run every row count against one cache per dtype, not a fresh one each time
    (at the calibration's shape each is 2 x 67 MB in fp32)."""
    from poskit.attention import kernel_calibration as kc
    from poskit.cli import kernel as kernel_cli

    monkeypatch.setattr(kc, "DECODE_ROWS_SHAPE", {"B": 1, "Hkv": 2, "T": 300, "D": 16})
    monkeypatch.setattr(kc, "FLASH_DECODE_ROWS_SHAPE", {"B": 1, "Hkv": 2, "T": 300, "D": 16})
    seen = []  # the caches each call was given, kept alive so that distinct objects keep distinct ids

    def recording(fn):
        def call(q, k, v, *args, **kwargs):
            seen.append((k, v))
            return fn(q, k, v, *args, **kwargs)
        return call
    monkeypatch.setattr(cpu_flash, "magnitude_decode", recording(cpu_flash.magnitude_decode))
    monkeypatch.setattr(cpu_flash, "cpu_flash_attention", recording(cpu_flash.cpu_flash_attention))
    for measure, counts in ((kernel_cli._measured_decode_rows, kc.DECODE_ROW_COUNTS),
                            (kernel_cli._measured_flash_decode_rows, kc.FLASH_DECODE_ROW_COUNTS)):
        seen.clear()
        measure(1, lambda line: None)
        assert len(seen) >= 2 * len(counts) * len(kc.DTYPES)  # both paths at every count and dtype
        assert len({id(k) for k, _ in seen}) == len({id(v) for _, v in seen}) == len(kc.DTYPES), measure.__name__
        assert {k.dtype for k, _ in seen} == set(kc.DTYPES.values())


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 2), heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]), Tq=st.integers(1, 40),
       extra_keys=st.integers(0, 30), p_max=st.sampled_from([1, 2, 5, 16]), causal=st.booleans(),
       alibi=st.booleans(), pad=st.booleans(), blocks=st.sampled_from([(8, 16), (16, 8), (64, 512)]),
       seed=st.integers(0, 10**6))
def test_cope_through_the_kernel_equals_the_float64_reference(kernel, B, heads, Tq, extra_keys, p_max, causal, alibi,
                                                             pad, blocks, seed):
    # any shape, clamp (p_max 1 clamps every key), mask, grouping and tile size: the same function as the reference
    H, Hkv = heads
    Tk = Tq + extra_keys
    g = torch.Generator().manual_seed(seed)
    if alibi:
        enc = poskit.build_encoding("cope-alibi", head_dim=8, num_heads=H, p_max=p_max)
    else:
        enc = poskit.build_encoding("cope", head_dim=8, num_heads=H, p_max=p_max, init_std=0.5)
    q = torch.randn(B, H, Tq, 8, generator=g) * 2
    k, v = (torch.randn(B, Hkv, Tk, 8, generator=g) * 2 for _ in range(2))
    kw = dict(is_causal=causal, enable_gqa=Hkv != H, q_positions=torch.arange(Tk - Tq, Tk),
              k_positions=torch.arange(Tk))
    if pad:
        keep = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        keep[0, ..., : Tk // 3] = False
        kw["attn_mask"] = keep
    saved = cpu_flash.BLOCK_Q, cpu_flash.BLOCK_K
    cpu_flash.BLOCK_Q, cpu_flash.BLOCK_K = blocks
    try:
        _against_reference(enc, q, k, v, atol=1e-4, **kw)
    finally:
        cpu_flash.BLOCK_Q, cpu_flash.BLOCK_K = saved


def test_cope_beyond_the_kernels_key_limit_keeps_its_blocked_path(kernel, monkeypatch):
    # the kernel keeps key indices as floats (exact below 2^24): longer calls must not reach it
    q = torch.randn(1, 4, 9, 8)
    assert route(build("cope"), q, is_causal=True) == "cpu-flash"
    monkeypatch.setattr(cpu_flash, "MAX_CONTEXTUAL_KEYS", 8)
    assert route(build("cope"), q, is_causal=True) == "blocked-contextual"


def test_the_tile_benchmark_times_the_backward_tile_it_names(kernel, monkeypatch, capsys):
    # the backward's tile is fixed when the forward runs: a benchmark that switched it later would time the
    # default tile under every name
    from conftest import load_benchmark

    bench = load_benchmark("kernel_tiles")
    ops, used = cpu_flash.kernel(), []

    class Spy:
        def __getattr__(self, name):
            return getattr(ops, name)

        def backward(self, *args):
            used.append(args[-3])  # (..., block_q, block_k, bf16_products)
            return ops.backward(*args)

    monkeypatch.setattr(cpu_flash, "kernel", lambda: Spy())
    bench.main(["--shapes", "1x40", "--widths", "8", "--tiles", "8,16", "--rounds", "2", "--threads", "1"])
    assert sorted(set(used)) == [8, 16] and used.count(8) == used.count(16) == 3  # warm-up + 2 rounds each
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 ")]
    assert [r.split("|")[4].strip() for r in rows] == ["8", "16"] and rows[0].split("|")[6].strip() == "1.000"


# --- equal-width q/k (the rope family): the kernel where this machine measured it faster than SDPA -------------
EQUAL_WIDTH = ["rope", "rope-linear", "rope-ntk", "rope-yarn", "rope-llama3", "rope-longrope", "rope-dynamic", "xpos",
               "irope", "mrope"]


def _equal_width(label, H=4):
    from conftest import ENCODING_OPTIONS

    return poskit.build_encoding(label, head_dim=8, num_heads=H, **ENCODING_OPTIONS.get(label, {}))


@pytest.fixture
def equal_widths_measured_faster(kernel, tmp_path, monkeypatch):
    """A calibration of this (pretend) machine that measured the kernel faster than SDPA for equal widths."""
    from poskit.attention import kernel_calibration as kc

    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results})
    return tmp_path / kernel_build.LIBRARY_NAME


def test_equal_widths_stay_on_sdpa_unless_measured_faster(kernel, tmp_path, monkeypatch):
    from poskit.attention import kernel_calibration as kc

    enc, q = _equal_width("rope"), torch.randn(1, 4, 12, 8)
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    assert route(enc, q, is_causal=True) == "sdpa"  # no calibration: SDPA's own flash kernel, as before
    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    results["qk_equal/float32"]["kernel"] = False
    kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results})
    assert route(enc, q, is_causal=True) == "sdpa"  # measured slower in fp32
    assert route(enc.to(torch.bfloat16), q.bfloat16(), is_causal=True) == "cpu-flash"  # faster in bf16
    q16 = q.bfloat16()
    assert "q/k as wide as v" in str(plan(q16, q16, q16, enc.to(torch.bfloat16), is_causal=True))
    # the decision: SDPA keeps equal widths unless the kernel is faster by the margin; the others the reverse
    assert kc.decide(9.0, 10.0, "qk_equal") and not kc.decide(9.5, 10.0, "qk_equal")
    assert kc.decide(10.5, 10.0, "qk") and not kc.decide(11.5, 10.0, "qk")


@pytest.mark.parametrize("label", EQUAL_WIDTH)
@pytest.mark.parametrize("case", ["causal", "padded", "gqa-cross", "plain"])
def test_equal_widths_through_the_kernel_equal_the_float64_reference(equal_widths_measured_faster, label, case,
                                                                      monkeypatch):
    monkeypatch.setattr(cpu_flash, "BLOCK_Q", 8)
    monkeypatch.setattr(cpu_flash, "BLOCK_K", 16)
    B, H, Hkv, Tq, Tk = {"causal": (2, 4, 4, 37, 37), "padded": (2, 4, 2, 29, 29), "gqa-cross": (1, 4, 1, 13, 41),
                         "plain": (2, 4, 4, 21, 33)}[case]
    enc = _equal_width(label, H=H)
    g = torch.Generator().manual_seed(EQUAL_WIDTH.index(label))
    q = torch.randn(B, H, Tq, 8, generator=g)
    k, v = (torch.randn(B, Hkv, Tk, 8, generator=g) for _ in range(2))
    kw = dict(enable_gqa=Hkv != H, is_causal=case != "plain")
    if case == "padded":
        keep = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        keep[0, ..., :5] = False
        keep[1, ..., -4:] = False
        kw["attn_mask"] = keep
    if case == "gqa-cross":
        kw.update(q_positions=torch.arange(Tk - Tq, Tk), k_positions=torch.arange(Tk))
    _against_reference(enc, q, k, v, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label", ["rope", "rope-yarn", "mrope"])
def test_decode_against_encoded_keys_takes_the_kernel_and_equals_the_full_forward(equal_widths_measured_faster,
                                                                                label, dtype):
    """The rope family caches rotated keys: each decode step encodes its query alone and attends the cache through
    the kernel (left padding included), equal to the full forward's row."""
    from poskit.attention.engine import plan_inputs, prepare

    enc = _equal_width(label).to(dtype)
    B, H, Hkv, T = 2, 4, 2, 11
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, H, T, 8, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, T, 8, generator=g).to(dtype) for _ in range(2))
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, :3] = False
    pos = (torch.arange(T) - torch.tensor([[3], [0]])).clamp(min=0)
    full = poskit.attention(q.double(), k.double(), v.double(), copy.deepcopy(enc).double(), q_positions=pos,
                            k_positions=pos, is_causal=True, enable_gqa=True, attn_mask=real[:, None, None, :],
                            backend="reference")
    cache = KVCache(1)
    cached_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache, 0, pos[:, :4], attention_mask=real[:, :4])
    for t in range(4, T):
        layer = cache.layer(0)
        one = q[:, :, t:t + 1]
        inp = prepare(one, layer.keys, layer.values, enc, causal=True, q_positions=pos[:, t:t + 1],
                      k_positions=layer.positions, scale=None, key_padding_mask=layer.key_mask)
        assert plan_inputs(inp, enc, keys="encoded").path == "cpu-flash"
        step = cached_attention(one, k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0, pos[:, t:t + 1],
                                attention_mask=real[:, t:t + 1])
        torch.testing.assert_close(step.double(), full[:, :, t:t + 1], atol=2e-6 if dtype == torch.float32 else 3e-2,
                                   rtol=0)


def test_routing_can_ignore_this_machines_calibration(equal_widths_measured_faster, monkeypatch):
    # POSKIT_KERNEL_CALIBRATION=off: the defaults, as on a machine that measured nothing (the same paths everywhere)
    from poskit.attention import kernel_calibration as kc

    enc, q = _equal_width("rope"), torch.randn(1, 4, 12, 8)
    assert route(enc, q, is_causal=True) == "cpu-flash"  # measured faster here
    monkeypatch.setenv(kc.ENV_SWITCH, "off")
    assert route(enc, q, is_causal=True) == "sdpa"
    monkeypatch.setenv(kc.ENV_SWITCH, "sometimes")
    with pytest.raises(ValueError, match="POSKIT_KERNEL_CALIBRATION must be one of .* got 'sometimes'"):
        route(enc, q, is_causal=True)


def test_equal_widths_never_build_the_kernel_to_stay_on_sdpa(monkeypatch):
    # a RoPE call in a process that has not loaded the kernel, on a machine where it is not built yet: no
    # calibration can exist, so SDPA, without compiling the kernel first (tens of seconds for nothing)
    built = []
    monkeypatch.setattr(kernel_build, "cached_library", lambda: None)
    monkeypatch.setattr(kernel_build, "build", lambda **kw: built.append(1) or pytest.fail("built for a RoPE call"))
    cpu_flash.kernel.cache_clear()
    try:
        enc, q = _equal_width("rope"), torch.randn(1, 4, 12, 8)
        assert route(enc, q, is_causal=True) == "sdpa"
        cache = KVCache(1)
        out = cached_attention(q, q, q, enc, cache, 0, torch.arange(12))
        want = poskit.attention(q, q, q, enc, is_causal=True, backend="reference")
        assert not built and cpu_flash.kernel.cache_info().currsize == 0  # never even loaded
        torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    finally:
        cpu_flash.kernel.cache_clear()  # the next test finds the real library again


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label", ["alibi", "relative-capped", "cope", "rope", "pope"])
def test_a_decode_step_reads_the_cache_in_place(equal_widths_measured_faster, label, dtype):
    """A KV cache keeps room to grow, so its keys and values are views whose heads lie `capacity` rows apart: the
    kernel reads them there. (It took contiguous inputs only, and each decode step copied the whole cache: at 8192
    cached keys, B=8, fp32, a RoPE step took 5.6x SDPA's time.) A step allocates a small fraction of the cache
    (the positions' tables, and with the bf16 products one kv head packed per thread: one thread here, 16 heads),
    and equals the same step against a cache without spare room."""
    from conftest import ENCODING_OPTIONS

    options = {**ENCODING_OPTIONS.get(label, {}), **SERVED.get(label, {})}
    enc = poskit.build_encoding(label, head_dim=64, num_heads=8, **options).to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _decode_against_caches(enc, dtype)
    finally:
        torch.set_num_threads(threads)


def _decode_against_caches(enc, dtype):
    B, H, T, capacity = 2, 8, 512, 1024
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T + 2, 64, generator=g).to(dtype) for _ in range(3))
    steps = []
    for room in (capacity, T + 2):
        cache = KVCache(1, max_length=room)
        cached_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], enc, cache, 0, torch.arange(T))
        warm, new = ([t[:, :, i:i + 1] for t in (q, k, v)] for i in (T, T + 1))
        cached_attention(*warm, enc, cache, 0, torch.tensor([T]))  # (the first step builds the tables it keeps)
        if room == capacity:
            assert not cache.layer(0).values.is_contiguous()  # (the case this is about)
            cache_bytes = 2 * k[:, :, :T].nbytes
            allocated = allocated_bytes(
                lambda: steps.append(cached_attention(*new, enc, cache, 0, torch.tensor([T + 1]))))
            assert allocated < cache_bytes / 8, f"{allocated} bytes allocated for a step against {cache_bytes}"
        else:
            steps.append(cached_attention(*new, enc, cache, 0, torch.tensor([T + 1])))
    # (the same up to the GEMM's blocking, which may follow the rows' alignment in memory)
    torch.testing.assert_close(steps[0], steps[1], atol=1e-6 if dtype == torch.float32 else 8e-3, rtol=0)


@pytest.mark.parametrize("dtype, products", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_keys_and_values_with_gaps_between_heads_are_read_in_place(kernel, dtype, products):
    """k and v as a KV cache holds them, views into buffers with room after their rows (grouped kv heads, two
    sequences, padding, a bias): the same values and gradients as contiguous copies, and both equal the float64
    formula. The gradients of the views land in their buffers' rows."""
    if products and not cpu_flash.bf16_products_available():
        pytest.skip("this CPU or build has no bf16 products")
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, Tq, Tk, room = 2, 4, 2, 9, 45, 19
    q = torch.randn(B, H, Tq, 12, generator=g).to(dtype).requires_grad_()
    k_buffer = torch.randn(B, Hkv, Tk + room, 12, generator=g).to(dtype).requires_grad_()
    v_buffer = torch.randn(B, Hkv, Tk + room, 7, generator=g).to(dtype).requires_grad_()
    k, v = k_buffer[:, :, :Tk], v_buffer[:, :, :Tk]
    assert not k.is_contiguous() and cpu_flash.rows_contiguous(k) is k
    qp, kp = torch.arange(Tk - Tq, Tk)[None], torch.arange(Tk)[None]
    pad = torch.ones(B, Tk, dtype=torch.bool)
    pad[1, :6] = False
    lo, hi = distance_span(qp, kp)
    bias = KernelBias("distance_table", (torch.randn(H, hi - lo + 1, generator=g) * 0.1).requires_grad_(), lo)
    kw = dict(scale=0.3, q_positions=qp, k_positions=kp, causal=True, key_padding_mask=pad, bias=bias,
              block_q=4, block_k=16, bf16_products=products)
    got = cpu_flash.cpu_flash_attention(q, k, v, **kw)
    copies = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    want = cpu_flash.cpu_flash_attention(*copies, **kw)
    # (not bit for bit: the GEMM's blocking may follow the rows' alignment in memory, which the room changes)
    same = dict(atol=1e-6, rtol=0) if dtype == torch.float32 else dict(atol=8e-3, rtol=0)  # (bf16: 2 roundings)
    torch.testing.assert_close(got, want, **same)
    w = torch.randn(got.shape, generator=g).to(dtype)
    grads = torch.autograd.grad(got, (q, k_buffer, v_buffer), w)
    wants = torch.autograd.grad(want, copies, w)
    torch.testing.assert_close(grads[0], wants[0], **same)
    for buffer_grad, want_grad in zip(grads[1:], wants[1:]):
        torch.testing.assert_close(buffer_grad[:, :, :Tk], want_grad, **same)
        assert not buffer_grad[:, :, Tk:].any()
    atol = 2e-5 if dtype == torch.float32 else 3e-2
    check_against_formula(q, k, v, 0.3, qp, kp, True, pad, bias, (4, 16), atol=atol, bias_atol=atol * 10,
                          bf16_products=products)


def _calibration_with_decode_queries(directory, queries, full_sequences):
    """A calibration whose fp32 decode step against cached encoded keys was measured at these query counts
    ({count: kernel faster}); full sequences (qk_equal) as given; every other form on the kernel."""
    from poskit.attention import kernel_calibration as kc

    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    results["qk_equal/float32"]["kernel"] = full_sequences
    timed = {str(n): {"kernel_ms": 1.0, "fallback_ms": 1.0, "kernel": use} for n, use in queries.items()}
    results["qk_equal_decode/float32"] = {"kernel": queries[min(queries)], "queries": timed}
    kc.write(directory / kernel_build.LIBRARY_NAME, {"results": results})


def _served_with_queries(enc, n):
    from poskit.attention.engine import prepare

    q, k = torch.randn(1, 4, n, 8), torch.randn(1, 4, 50, 8)
    inp = prepare(q, k, k, enc, causal=True, q_positions=torch.arange(50 - n, 50), k_positions=torch.arange(50),
                  scale=None)
    return cpu_flash.serves_encoded_keys(inp, enc)


def test_calls_against_cached_keys_follow_the_decision_measured_at_the_next_query_count(kernel, tmp_path,
                                                                                       monkeypatch):
    # where the kernel starts to beat SDPA against cached keys depends on the CPU: each call takes the decision
    # measured at the smallest measured count of new queries at or above its own, and past the largest, the
    # full-sequence decision
    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    enc = _equal_width("rope")
    _calibration_with_decode_queries(tmp_path, {1: False, 4: True, 16: False, 64: True}, full_sequences=False)
    served = {n: _served_with_queries(enc, n) for n in (1, 2, 4, 5, 16, 17, 40, 64, 65)}
    assert served == {1: False, 2: True, 4: True, 5: False, 16: False, 17: True, 40: True, 64: True, 65: False}
    _calibration_with_decode_queries(tmp_path, {1: True, 4: False, 16: False, 64: False}, full_sequences=True)
    assert [_served_with_queries(enc, n) for n in (1, 3, 64, 65)] == [True, False, False, True]


@pytest.mark.parametrize("label", ["rope-dynamic", "xpos"])
def test_raw_keys_against_more_keys_follow_the_decision_at_their_query_count(kernel, tmp_path, monkeypatch, label):
    # the encodings that cache raw keys and re-encode them every step (serves(), not serves_encoded_keys) take
    # the same per-count decision for a few queries against more keys as the encoded-keys path; calls with as
    # many queries as keys take the full-sequence one
    from poskit.attention.engine import prepare

    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    enc = _equal_width(label)

    def served(n, keys=50):
        q, k = torch.randn(1, 4, n, 8), torch.randn(1, 4, keys, 8)
        inp = prepare(q, k, k, enc, causal=True, q_positions=torch.arange(keys - n, keys),
                      k_positions=torch.arange(keys), scale=None)
        return cpu_flash.serves(inp, enc) == cpu_flash.QK_EQUAL

    _calibration_with_decode_queries(tmp_path, {1: False, 4: True, 16: False, 64: True}, full_sequences=False)
    assert {n: served(n) for n in (1, 4, 16, 40, 50)} == {1: False, 4: True, 16: False, 40: True, 50: False}
    assert not served(80, keys=100)  # past the largest count: the full-sequence decision
    _calibration_with_decode_queries(tmp_path, {1: True, 4: False, 16: False, 64: False}, full_sequences=True)
    assert {n: served(n) for n in (1, 4, 40, 50)} == {1: True, 4: False, 40: False, 50: True}


def test_a_calibration_without_decode_query_counts_keeps_the_one_step_rule(kernel, tmp_path, monkeypatch):
    # written before the counts were measured: up to DECODE_QUERIES queries take the one-query decision
    from poskit.attention import kernel_calibration as kc

    monkeypatch.setattr(cpu_flash, "_library", tmp_path / kernel_build.LIBRARY_NAME)
    results = {f"{form}/{dtype}": {"kernel": True} for form in kc.FORMS for dtype in kc.DTYPES}
    results["qk_equal/float32"]["kernel"] = False
    kc.write(tmp_path / kernel_build.LIBRARY_NAME, {"results": results})
    enc = _equal_width("rope")
    assert [_served_with_queries(enc, n) for n in (1, kc.DECODE_QUERIES, kc.DECODE_QUERIES + 1)] == [
        True, True, False]


@pytest.mark.parametrize("form, queries, why", [
    ("qk_equal_decode", {"0": True}, "query count"), ("qk_equal_decode", {"4": "yes"}, "true or false"),
    ("qk_equal_decode", {"x": True}, "query count"), ("qk", {"4": True}, "only qk_equal_decode")])
def test_a_malformed_decode_query_count_is_named(tmp_path, form, queries, why):
    from poskit.attention import kernel_calibration as kc

    results = {f"{form}/float32": {"kernel": True, "queries": {
        n: {"kernel_ms": 1.0, "fallback_ms": 1.0, "kernel": use} for n, use in queries.items()}}}
    path = tmp_path / kc.FILE_NAME
    path.write_text(json.dumps({"results": results}))
    with pytest.raises(kc.CalibrationError, match=re.escape(str(path)) + ".*" + why):
        kc.read(path)


def test_kernel_info_names_the_query_counts_that_stay_on_sdpa(kernel, tmp_path, monkeypatch):
    from poskit.cli.kernel import _calibration_line

    _calibration_with_decode_queries(tmp_path, {1: False, 4: False, 16: True, 64: True}, full_sequences=True)
    (tmp_path / kernel_build.LIBRARY_NAME).write_bytes(b"")  # (the line reads a calibration beside a library)
    line = _calibration_line(tmp_path / kernel_build.LIBRARY_NAME)
    assert line.endswith("without the kernel for qk_equal_decode/float32 at 1, 4 new queries; backward tile not "
                         "measured; PoPE's decode rows not measured; the decode form's rows not measured"), line
    from poskit.attention import kernel_calibration as kc

    doc = __import__("json").loads(kc.path_for(tmp_path / kernel_build.LIBRARY_NAME).read_text())
    kc.write(tmp_path / kernel_build.LIBRARY_NAME,
             {**doc, "pope_decode_rows": {"tiled_rows": {"float32": 8, "bfloat16": 32}},
              "flash_decode_rows": {"tiled_rows": {"float32": 16, "bfloat16": 4}}})
    line = _calibration_line(tmp_path / kernel_build.LIBRARY_NAME)
    assert line.endswith("; PoPE's decode multiplies tiles from 32 (bfloat16), 8 (float32) rows per kv head; other "
                         "calls take the tiles from 4 (bfloat16), 16 (float32) query rows per kv head"), line
