"""torch.compile: `poskit.attention` and the encodings' `transform_qk` trace with fullgraph=True (no graph
break: no data-dependent Python value on the path), and the compiled numbers and gradients equal eager ones.

Dynamo alone (backend="eager") checks the tracing in seconds; the inductor tests compile C++ kernels
(20-60 s each on 2 cores) and are marked slow."""
import copy
import inspect
import types

import pytest
import torch

import poskit

OPTIONS = {
    "rope": {}, "pope": {"delta_init": "uniform"}, "alibi": {},
    "rope-yarn": {"factor": 4.0, "original_max_positions": 16},
    "rope-dynamic": {"factor": 2.0, "original_max_positions": 16},  # its base depends on the longest position
    # contextual: traced, the materialised formula (the blocked CPU path plans its blocks from tensor values)
    "cope": {"p_max": 6, "init_std": 0.5}, "cope-alibi": {"p_max": 6, "learned_slopes": True},
}
QK = [n for n in OPTIONS if poskit.build_encoding(n, head_dim=16, num_heads=4, **OPTIONS[n]).kind == "qk"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # every test compiles its own graphs: no recompile limit carried over
    yield
    torch._dynamo.reset()


def _inputs(dtype, Tq=24, Tk=24, hkv=2, requires_grad=True):
    torch.manual_seed(0)
    q = torch.randn(2, 4, Tq, 16, dtype=dtype, requires_grad=requires_grad)
    k, v = (torch.randn(2, hkv, Tk, 16, dtype=dtype, requires_grad=requires_grad) for _ in range(2))
    return q, k, v


def _value_and_grads(f, q, k, v):
    out = f(q, k, v)
    grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
    return out, grads


def _assert_compiled_equals_eager(f, inputs, backend, atol):
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    out, grads = _value_and_grads(compiled, *inputs)
    ref, ref_grads = _value_and_grads(f, *inputs)
    torch.testing.assert_close(out, ref, atol=atol, rtol=atol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=atol, rtol=atol)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_attention_traces_with_fullgraph_default_positions(name):
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **OPTIONS[name]).double()
    _assert_compiled_equals_eager(lambda q, k, v: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True),
                                  _inputs(torch.float64), "eager", 1e-12)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_attention_traces_with_fullgraph_explicit_positions_and_cached_keys(name):
    # a decode-like call: 3 queries at positions 30..32 against 20 keys at per-row positions, one row shifted
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **OPTIONS[name]).double()
    qp = torch.arange(30, 33)
    kp = torch.stack((torch.arange(20) * 2, torch.arange(20) + 13))

    def f(q, k, v):
        return poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True, q_positions=qp, k_positions=kp)

    _assert_compiled_equals_eager(f, _inputs(torch.float64, Tq=3, Tk=20), "eager", 1e-12)


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float64])
def test_attention_traces_with_fullgraph_and_an_attn_mask(name, mask_dtype):
    # padding (the last keys of row 1 hidden) as a bool or an additive float mask, with the causal mask
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **OPTIONS[name]).double()
    keep = torch.ones(2, 1, 1, 24, dtype=torch.bool)
    keep[1, ..., 18:] = False
    mask = keep if mask_dtype == torch.bool else torch.zeros(keep.shape, dtype=mask_dtype).masked_fill(~keep, -1e4)

    def f(q, k, v):
        return poskit.attention(q, k, v, enc, attn_mask=mask, is_causal=True, enable_gqa=True)

    _assert_compiled_equals_eager(f, _inputs(torch.float64), "eager", 1e-12)


@pytest.mark.parametrize("name", QK)
def test_transform_qk_traces_with_fullgraph(name):
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **OPTIONS[name]).double()
    pos = torch.arange(40, 64)[None]

    def f(q, k, v):
        qe, ke = enc.transform_qk(q, k, pos, pos)
        return torch.cat((qe.flatten(), ke.flatten(), v.flatten()))  # v: every input reaches the output

    _assert_compiled_equals_eager(f, _inputs(torch.float64), "eager", 1e-12)


def test_rope_dynamic_compiled_picks_its_base_from_the_longest_position():
    # traced, the length is a tensor: below and above original_max_positions take the two branches of the formula
    enc = poskit.build_encoding("rope-dynamic", head_dim=16, num_heads=4, factor=2.0, original_max_positions=16)
    compiled = torch.compile(lambda q, k, v: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True),
                             fullgraph=True, backend="eager")
    for T in (8, 40):
        q, k, v = _inputs(torch.float64, Tq=T, Tk=T, requires_grad=False)
        enc_ref = poskit.build_encoding("rope-dynamic", head_dim=16, num_heads=4, factor=2.0, original_max_positions=16)
        scores = poskit.attention_scores(q, k, enc_ref.double(), is_causal=True, enable_gqa=True)
        ref = torch.softmax(scores, -1) @ v.repeat_interleave(2, 1)
        torch.testing.assert_close(compiled(q, k, v), ref, atol=1e-12, rtol=1e-12)


def test_poskit_attention_is_a_plain_function():
    # a plain function, which Dynamo traces (the tests above: fullgraph=True), is what poskit.attention is
    from poskit.attention.engine import attention

    assert inspect.isfunction(poskit.attention) and poskit.attention is attention
    assert not isinstance(poskit.attention, types.ModuleType)  # Dynamo cannot trace a call to a module object
    enc = poskit.build_encoding("rope", head_dim=16, num_heads=4)
    q, k, v = _inputs(torch.float32, requires_grad=False)
    assert torch.equal(poskit.attention(q, k, v, enc, enable_gqa=True), attention(q, k, v, enc, enable_gqa=True))
    # a function copies as itself
    assert copy.copy(poskit.attention) is poskit.attention is copy.deepcopy(poskit.attention)


def test_the_attention_package_and_its_modules_still_import_by_their_dotted_names():
    import sys

    import poskit.attention.engine
    import poskit.attention.kv_cache as kv_cache_module
    from poskit.attention import KVCache, attention_scores, cached_attention, linear_attention
    from poskit.attention.kv_cache import KVCache as KVCacheFromModule

    package = sys.modules["poskit.attention"]
    assert isinstance(package, types.ModuleType) and package.KVCache is KVCache is KVCacheFromModule
    assert kv_cache_module.KVCache is KVCache and kv_cache_module is sys.modules["poskit.attention.kv_cache"]
    assert package.cached_attention is cached_attention is sys.modules["poskit.attention.engine"].cached_attention
    assert package.linear_attention is linear_attention
    assert attention_scores is poskit.attention_scores and poskit.KVCache is KVCache  # the top-level conveniences


def test_a_fresh_interpreter_imports_the_modules_before_or_after_the_package():
    # `import poskit.attention.engine` first, before anything of poskit, binds poskit.attention to the function
    import subprocess
    import sys

    code = ("import inspect, poskit.attention.engine as engine, poskit.attention.kv_cache; import poskit; "
            "from poskit.attention.kv_cache import KVCache; "
            "assert inspect.isfunction(poskit.attention) and engine.attention is poskit.attention; "
            "assert KVCache is poskit.KVCache; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_patching_an_attribute_of_the_package_reaches_the_engine(monkeypatch):
    # what monkeypatch.setattr(poskit.attention, ...) reached through the former wrapper object: the package's
    # modules are patched through their module objects
    import poskit.attention.engine as engine

    monkeypatch.setattr(engine, "BACKENDS", ("auto",))
    enc = poskit.build_encoding("rope", head_dim=16, num_heads=4)
    q, k, v = _inputs(torch.float32, requires_grad=False)
    with pytest.raises(ValueError, match=r"backend must be one of \['auto'\], got 'sdpa'"):
        poskit.attention(q, k, v, enc, enable_gqa=True, backend="sdpa")


def _cope_model(name="cope"):
    from poskit.models import ModelConfig, Transformer

    torch.manual_seed(0)
    options = OPTIONS[name] | ({"gates": "separate"} if name == "cope" else {})
    return Transformer(ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2, encoding=name,
                                   encoding_options=options)).double()


def _model_value_and_grads(model, tokens, mask):
    logits = model(tokens, attention_mask=mask)
    params = [p for p in model.parameters() if p.requires_grad]
    return logits, torch.autograd.grad(logits.pow(2).sum(), params)


@pytest.mark.parametrize("name, fullgraph", [("cope", True), ("cope-alibi", True), ("cope", False)])
def test_a_cope_model_compiles_forward_and_backward(name, fullgraph):
    # a padded batch (left padding in row 1): positions from the mask, the pads hidden as keys. In one graph,
    # AOTAutograd traces the backward too; with graph breaks allowed, Dynamo alone is checked
    model = _cope_model(name)
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :3] = False
    compiled = torch.compile(model, fullgraph=fullgraph, backend="aot_eager" if fullgraph else "eager")
    out, grads = _model_value_and_grads(compiled, tokens, mask)
    ref, ref_grads = _model_value_and_grads(model, tokens, mask)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    assert all(g.abs().max() > 0 for g in grads[-3:])  # the encoding's parameters get gradients
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-10, rtol=1e-10)


def test_compiled_cope_still_refuses_unordered_keys():
    # traced, the check runs inside the graph: the same message, raised as a RuntimeError by the graph
    enc = poskit.build_encoding("cope", head_dim=16, num_heads=4, **OPTIONS["cope"]).double()
    kp = torch.tensor([0, 1, 2, 4, 3, 5])

    def f(q, k, v):
        return poskit.attention(q, k, v, enc, enable_gqa=True, k_positions=kp, q_positions=torch.arange(6))

    q, k, v = _inputs(torch.float64, Tq=6, Tk=6, requires_grad=False)
    with pytest.raises(ValueError, match="k_positions must be non-decreasing for cope/cope-alibi"):
        f(q, k, v)
    with pytest.raises(RuntimeError, match="k_positions must be non-decreasing for cope/cope-alibi"):
        torch.compile(f, fullgraph=True, backend="eager")(q, k, v)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rope", "pope", "alibi"])
def test_inductor_fullgraph_forward_and_backward_equal_eager(name):
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **OPTIONS[name])
    _assert_compiled_equals_eager(lambda q, k, v: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True),
                                  _inputs(torch.float32), "inductor", 2e-5)


@pytest.mark.slow
def test_a_cope_model_compiles_with_inductor():
    model = _cope_model().float()
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :3] = False
    out, grads = _model_value_and_grads(torch.compile(model, fullgraph=True), tokens, mask)
    ref, ref_grads = _model_value_and_grads(model, tokens, mask)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=2e-5)
