"""A refused decode step, and one that fails after appending, leave the KV cache exactly as it was.

`cached_attention` validates everything (shapes, dtypes and widths against the cached ones, positions,
gate keys, the positions the encoding accepts over the whole cache) before it appends. The property test
draws an encoding, a cache state and one fault, checks that the call is refused with a ValueError, that
every cached tensor and length is unchanged, and that decoding then continues exactly.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.attention import KVCache, cached_attention
from conftest import build, make_qkv

T = 12  # tokens generated per example: the prefill, the refused step, then one valid step
ENCODINGS = {  # label: (registry name, extra options)
    "rope": ("rope", {}),
    "rope-dynamic": ("rope-dynamic", {}),
    "pope": ("pope", {}),
    "alibi": ("alibi", {}),
    "relative": ("relative", dict(max_distance=T)),
    "cope": ("cope", {}),
    "cope-separate": ("cope", dict(gates="separate")),
    "cope-alibi-values": ("cope-alibi", dict(gates="values")),
    "none": ("none", {}),
}


def snapshot(cache: KVCache):
    def clone(t):
        return None if t is None else t.detach().clone()

    return [(layer.length, layer.encoded, layer.keys_finite, clone(layer.keys), clone(layer.values),
             clone(layer.positions), clone(layer.gate_keys), clone(layer.angles), clone(layer.key_mask))
            for layer in cache.layers]


def assert_same(before, after):
    assert len(before) == len(after)
    for old, new in zip(before, after):
        assert old[:3] == new[:3]  # length, encoded, keys_finite
        for a, b in zip(old[3:], new[3:]):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def step_args(enc, q, k, v, gk, a, b):
    """The valid arguments of a step over tokens a..b-1."""
    return dict(q=q[:, :, a:b], k=k[:, :, a:b], v=v[:, :, a:b], enc=enc, layer_idx=0,
                q_positions=torch.arange(a, b), gate_keys=None if gk is None else gk[:, :, a:b], backend="auto")


def _with(args, **changes):
    return dict(args, **changes)


# fault name -> (applies to the encoding?, the faulty arguments from the valid ones)
FAULTS = {
    "value width differs from the cached one": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, v=torch.cat((args["v"], args["v"][..., :1]), -1))),
    "key width differs": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, k=torch.cat((args["k"], args["k"]), -1))),
    "dtype differs from the cached one": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, q=args["q"].float(), k=args["k"].float(), v=args["v"].float(),
                                   gate_keys=None if args["gate_keys"] is None else args["gate_keys"].float())),
    "q_positions missing": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, q_positions=None)),
    "float positions": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, q_positions=args["q_positions"].double())),
    "positions of the wrong length": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, q_positions=torch.arange(n, n + 2))),
    "batch differs from the cached one": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, **{key: args[key][:1] for key in ("q", "k", "v")},
                                   gate_keys=None if args["gate_keys"] is None else args["gate_keys"][:1])),
    "kv heads differ from the cached ones": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, k=args["k"][:, :1], v=args["v"][:, :1],
                                   gate_keys=None if args["gate_keys"] is None else args["gate_keys"][:, :1])),
    "gate keys to an encoding that takes none": (
        lambda label, enc: not enc.needs_gate_keys,
        lambda args, enc, n: _with(args, gate_keys=args["k"])),
    "gate keys missing": (
        lambda label, enc: enc.needs_gate_keys,
        lambda args, enc, n: _with(args, gate_keys=None)),
    "gate keys of the wrong shape": (
        lambda label, enc: enc.needs_gate_keys,
        lambda args, enc, n: _with(args, gate_keys=args["gate_keys"][..., :-1])),
    "cope decodes a position earlier than the cache": (
        lambda label, enc: enc.kind == "contextual",
        lambda args, enc, n: _with(args, q_positions=torch.tensor([n - 2]))),
    "relative offset beyond max_distance": (
        lambda label, enc: label == "relative",
        lambda args, enc, n: _with(args, q_positions=torch.tensor([n + 40]))),
    "raw keys into a cache of encoded keys": (
        lambda label, enc: enc.cache_form != "raw",
        lambda args, enc, n: _with(args, backend="reference")),
    "unknown backend": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, backend="fastest")),
    "layer index out of range": (
        lambda label, enc: True,
        lambda args, enc, n: _with(args, layer_idx=2)),
}


@settings(max_examples=120, deadline=None)
@given(label=st.sampled_from(sorted(ENCODINGS)), fault=st.sampled_from(sorted(FAULTS)),
       prefill=st.integers(2, T - 2), groups=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_a_refused_step_leaves_the_cache_exactly_as_it_was(label, fault, prefill, groups, seed):
    name, options = ENCODINGS[label]
    enc = build(name, **options)
    applies, corrupt = FAULTS[fault]
    if not applies(label, enc):
        fault, (applies, corrupt) = "unknown backend", FAULTS["unknown backend"]
    q, k, v = make_qkv(H=4, Hkv=4 // groups, Tq=T, Tk=T, gen_seed=seed)
    gk = k.flip(-1) if enc.needs_gate_keys else None
    cache = KVCache(num_layers=2)
    out = cached_attention(**dict(step_args(enc, q, k, v, gk, 0, prefill), cache=cache))
    before = snapshot(cache)
    bad = corrupt(step_args(enc, q, k, v, gk, prefill, prefill + 1), enc, prefill)
    with pytest.raises(ValueError):
        cached_attention(**dict(bad, cache=cache))
    assert_same(before, snapshot(cache))
    # the cache is intact: the valid step continues the decode exactly
    outs = [out, cached_attention(**dict(step_args(enc, q, k, v, gk, prefill, prefill + 1), cache=cache))]
    n = prefill + 1
    full = poskit.attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], enc, backend="reference",
                            gate_keys=None if gk is None else gk[:, :, :n], is_causal=True, enable_gqa=True)
    assert cache.layer(0).length == n
    if label == "rope-dynamic":  # its base depends on the length seen so far: compare the last step only
        torch.testing.assert_close(outs[1], full[:, :, prefill:], atol=1e-10, rtol=0)
    else:
        torch.testing.assert_close(torch.cat(outs, 2), full, atol=1e-10, rtol=0)


def test_q_positions_is_required_and_named():
    enc = build("rope")
    q, k, v = make_qkv(Tq=3, Tk=3)
    cache = KVCache(num_layers=1)
    cached_attention(q, k, v, enc, cache, 0, torch.arange(3))
    with pytest.raises(ValueError, match="q_positions must be given to cached_attention"):
        cached_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], enc, cache, 0, None)
    assert cache.length == 3


def test_value_width_mismatch_is_refused_before_the_keys_are_written():
    # the reported bug: the keys were appended, then the values' copy failed, leaving the cache one key longer
    enc = build("alibi")
    q, k, v = make_qkv(Tq=4, Tk=4)
    cache = KVCache(num_layers=1)
    cached_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], enc, cache, 0, torch.arange(3))
    wide_v = torch.cat((v[:, :, 3:], v[:, :, 3:]), -1)
    with pytest.raises(ValueError, match="values must have 16 channels to extend the cache"):
        cached_attention(q[:, :, 3:], k[:, :, 3:], wide_v, enc, cache, 0, torch.tensor([3]))
    assert cache.layer(0).length == 3 and cache.layer(0).keys.shape[2] == 3 and cache.layer(0).values.shape[2] == 3


def test_cope_refuses_an_earlier_position_before_appending():
    enc = build("cope")
    q, k, v = make_qkv(Tq=5, Tk=5)
    cache = KVCache(num_layers=1)
    cached_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, cache, 0, torch.arange(4))
    with pytest.raises(ValueError, match="k_positions must be non-decreasing for cope"):
        cached_attention(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], enc, cache, 0, torch.tensor([1]))
    assert cache.length == 4 and torch.equal(cache.layer(0).positions, torch.arange(4)[None])


def test_layer_cache_refuses_a_dtype_change_instead_of_casting():
    cache = KVCache(num_layers=1)
    k = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    cache.append(0, k, k, torch.arange(3))
    with pytest.raises(ValueError, match="keys must have the cached dtype torch.float64"):
        cache.append(0, k[:, :, :1].float(), k[:, :, :1], torch.tensor([3]))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        cache.append(0, k[:, :, :1], k[:, :, :1], torch.tensor([3.0]))
    assert cache.length == 3


def test_a_cache_cropped_to_zero_takes_new_widths():
    # an emptied layer starts afresh: its old allocation (other widths) must not receive the new tokens
    cache = KVCache(num_layers=1)
    k = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    cache.append(0, k, k, torch.arange(3))
    cache.crop(0)
    wide = torch.randn(1, 2, 2, 6, dtype=torch.float64)
    cache.append(0, wide, wide, torch.arange(2))
    assert torch.equal(cache.layer(0).keys, wide) and torch.equal(cache.layer(0).values, wide)


def _failing_after_running(monkeypatch):
    """Every attention the engine plans runs, then raises: a step that fails once its tokens are appended."""
    from types import SimpleNamespace

    from poskit.attention import engine

    real = engine.plan_inputs

    def plan_inputs(*args, **kwargs):
        plan = real(*args, **kwargs)

        def runner(*run_args):
            plan.runner(*run_args)
            raise RuntimeError("injected after the attention ran")
        return SimpleNamespace(runner=runner)

    monkeypatch.setattr(engine, "plan_inputs", plan_inputs)


@settings(max_examples=60, deadline=None)
@given(label=st.sampled_from(sorted(ENCODINGS)), prefill=st.integers(2, T - 3), groups=st.sampled_from([1, 2]),
       padded=st.booleans(), per_batch=st.booleans(), grad=st.booleans(), seed=st.integers(0, 2**16))
def test_a_step_that_fails_after_appending_leaves_the_cache_exactly_as_it_was(label, prefill, groups, padded,
                                                                               per_batch, grad, seed):
    # the failing step may be the first padded one (the layer's key mask is created there), the first with
    # per-sequence positions (the cached positions are widened to the batch there), or one appended out of place
    # (keys that require grad): every change is undone, and the decode then continues exactly
    name, options = ENCODINGS[label]
    enc = build(name, **options)
    q, k, v = make_qkv(H=4, Hkv=4 // groups, Tq=T, Tk=T, gen_seed=seed)
    gk = k.flip(-1) if enc.needs_gate_keys else None
    cache = KVCache(num_layers=1)
    cached_attention(**dict(step_args(enc, q, k, v, gk, 0, prefill), cache=cache))
    before = snapshot(cache)
    args = step_args(enc, q, k, v, gk, prefill, prefill + 2)
    if padded:  # the second new token of sequence 0 is a pad
        args["attention_mask"] = torch.ones(q.shape[0], 2, dtype=torch.bool)
        args["attention_mask"][0, 1] = False
    if per_batch:
        args["q_positions"] = args["q_positions"].expand(q.shape[0], -1)
    if grad:
        args = dict(args, k=args["k"].detach().requires_grad_())
    with pytest.MonkeyPatch.context() as monkeypatch:
        _failing_after_running(monkeypatch)
        with pytest.raises(RuntimeError, match="injected after the attention ran"):
            cached_attention(**dict(args, cache=cache))
    assert_same(before, snapshot(cache))
    out = cached_attention(**dict(step_args(enc, q, k, v, gk, prefill, prefill + 1), cache=cache))
    fresh = KVCache(num_layers=1)
    cached_attention(**dict(step_args(enc, q, k, v, gk, 0, prefill), cache=fresh))
    torch.testing.assert_close(out, cached_attention(**dict(step_args(enc, q, k, v, gk, prefill, prefill + 1),
                                                              cache=fresh)), atol=0, rtol=0)
    assert_same(snapshot(fresh), snapshot(cache))


@pytest.mark.parametrize("encoding", ["rope", "pope", "cope", "alibi"])
def test_a_model_step_that_fails_in_a_later_layer_leaves_every_layer_as_it_was(encoding, monkeypatch):
    # the first layer appended and attended before the second one's feed-forward failed: the model's step is
    # undone as a whole, and generation then continues as if it had never run
    from poskit.models import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=17, d_model=16, n_layers=2, n_heads=2, encoding=encoding)).eval()
    tokens = torch.randint(0, 17, (2, 9))
    cache = KVCache(num_layers=2)
    with torch.no_grad():
        model(tokens[:, :6], cache=cache)
        before = snapshot(cache)
        with monkeypatch.context() as m:
            m.setattr(model.blocks[1].mlp, "forward", lambda x: (_ for _ in ()).throw(RuntimeError("injected")))
            with pytest.raises(RuntimeError, match="injected"):
                model(tokens[:, 6:8], cache=cache)
        assert_same(before, snapshot(cache))
        resumed = model(tokens[:, 6:9], cache=cache)
        fresh = KVCache(num_layers=2)
        model(tokens[:, :6], cache=fresh)
        torch.testing.assert_close(resumed, model(tokens[:, 6:9], cache=fresh), atol=0, rtol=0)
