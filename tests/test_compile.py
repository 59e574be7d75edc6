"""torch.compile: `poskit.attention` and the encodings' `transform_qk` trace with fullgraph=True (no graph
break: no data-dependent Python value on the path), and the compiled numbers and gradients equal eager ones.

Dynamo alone (backend="eager") checks the tracing in seconds; the inductor tests compile C++ kernels
(20-60 s each on 2 cores) and are marked slow."""
import inspect
import types

import pytest
import torch

import poskit

OPTIONS = {
    "rope": {}, "pope": {"delta_init": "uniform"}, "alibi": {},
    "rope-yarn": {"factor": 4.0, "original_max_positions": 16},
    "rope-dynamic": {"factor": 2.0, "original_max_positions": 16},  # its base depends on the longest position
}
QK = [n for n in OPTIONS if n != "alibi"]


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


def test_poskit_attention_is_a_traceable_function_that_still_reads_as_the_package():
    import poskit.attention.kv_cache
    from poskit.attention import KVCache, attention, attention_scores, cached_attention

    assert not isinstance(poskit.attention, types.ModuleType)  # Dynamo cannot trace a call to a module object
    assert inspect.signature(poskit.attention) == inspect.signature(attention)
    assert poskit.attention.__doc__ == attention.__doc__
    assert poskit.attention.kv_cache.KVCache is KVCache is poskit.attention.KVCache
    assert poskit.attention.cached_attention is cached_attention
    assert poskit.attention.attention_scores is attention_scores is poskit.attention_scores
    enc = poskit.build_encoding("rope", head_dim=16, num_heads=4)
    q, k, v = _inputs(torch.float32, requires_grad=False)
    assert torch.equal(poskit.attention(q, k, v, enc, enable_gqa=True), attention(q, k, v, enc, enable_gqa=True))


def test_the_function_object_survives_a_copy():
    import copy

    # as a function is: the object itself (a module, its package, cannot be copied)
    assert copy.copy(poskit.attention) is poskit.attention is copy.deepcopy(poskit.attention)
    assert copy.deepcopy({"attend": poskit.attention})["attend"].KVCache is poskit.attention.KVCache


def test_setting_an_attribute_through_the_function_sets_it_on_the_package(monkeypatch):
    import sys

    monkeypatch.setattr(poskit.attention, "BACKENDS", ("auto",))
    assert sys.modules["poskit.attention"].BACKENDS == ("auto",)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rope", "pope", "alibi"])
def test_inductor_fullgraph_forward_and_backward_equal_eager(name):
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **OPTIONS[name])
    _assert_compiled_equals_eager(lambda q, k, v: poskit.attention(q, k, v, enc, is_causal=True, enable_gqa=True),
                                  _inputs(torch.float32), "inductor", 2e-5)
