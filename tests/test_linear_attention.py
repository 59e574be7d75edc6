"""Linear attention (RoFormer eq. 19) against the T x T formula computed the slow obvious way in float64,
the recurrent decode form against the parallel one, and its refusals."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import poskit
from poskit.attention.linear import LinearAttentionState, linear_attention, linear_attention_step


def elu1(x):
    return torch.where(x > 0, x + 1.0, torch.exp(x))  # elu(x) + 1 written out


def rotation(pos, d, base=10000.0):
    """R_{Theta, pos} of RoFormer eq. 15 (interleaved pairs), as a d x d matrix."""
    R = torch.eye(d, dtype=torch.float64)
    for i in range(d // 2):
        a = pos * base ** (-2 * i / d)
        R[2 * i, 2 * i], R[2 * i, 2 * i + 1] = math.cos(a), -math.sin(a)
        R[2 * i + 1, 2 * i], R[2 * i + 1, 2 * i + 1] = math.sin(a), math.cos(a)
    return R


def reference(q, k, v, weight, norm, causal, eps=1e-6):
    """out[b, h, t] = sum_s weight(b, h, t, s) v_s / (sum_s norm(b, h, t, s) + eps), pair by pair."""
    B, H, T, _ = q.shape
    groups = H // k.shape[1]
    out = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                num, den = torch.zeros(v.shape[-1], dtype=torch.float64), 0.0
                for s in range(k.shape[2]):
                    if causal and s > t:
                        continue
                    num += weight(b, h, t, s) * v[b, h // groups, s]
                    den += norm(b, h, t, s)
                out[b, h, t] = num / (den + eps)
    return out


def rope_reference(q, k, v, qp, kp, causal, base=10000.0):
    d, g = q.shape[-1], q.shape[1] // k.shape[1]
    fq, fk = elu1(q), elu1(k)
    Rq = [rotation(int(p), d, base) for p in qp]
    Rk = [rotation(int(p), d, base) for p in kp]
    return reference(q, k, v, lambda b, h, t, s: (Rq[t] @ fq[b, h, t]) @ (Rk[s] @ fk[b, h // g, s]),
                     lambda b, h, t, s: fq[b, h, t] @ fk[b, h // g, s], causal)


def pope_reference(q, k, v, qp, kp, delta, causal, base=10000.0):
    """PoPE in linear attention: numerator sum_c mu_q mu_k cos((s - t) theta_c + delta_c), normaliser
    sum_c mu_q mu_k, mu = softplus (the PoPE paper's eq. 2-5 without the softmax)."""
    d, g = q.shape[-1], q.shape[1] // k.shape[1]
    theta = base ** (-torch.arange(d, dtype=torch.float64) / d)
    mq, mk = F.softplus(q), F.softplus(k)
    return reference(
        q, k, v,
        lambda b, h, t, s: (mq[b, h, t] * mk[b, h // g, s] * torch.cos((kp[s] - qp[t]) * theta + delta[h])).sum(),
        lambda b, h, t, s: (mq[b, h, t] * mk[b, h // g, s]).sum(), causal)


def qkv(B=2, H=2, Hkv=1, T=9, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, T, D, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv)]


@pytest.mark.parametrize("causal", [True, False])
def test_rope_equals_eq19(causal):
    q, k, v = qkv()
    enc = poskit.build_encoding("rope", head_dim=8, num_heads=2)
    pos = torch.tensor([0, 3, 4, 9, 10, 11, 20, 21, 40])
    got = linear_attention(q, k, v, enc, is_causal=causal, q_positions=pos, k_positions=pos, chunk_size=4)
    assert torch.allclose(got, rope_reference(q, k, v, pos, pos, causal), atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_pope_equals_polar_formula(causal):
    q, k, v = qkv(seed=1)
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, delta_init="uniform").double()
    pos = torch.arange(9) * 3
    got = linear_attention(q, k, v, enc, is_causal=causal, q_positions=pos, k_positions=pos, chunk_size=2)
    want = pope_reference(q, k, v, pos, pos, enc.delta.detach().double(), causal)
    assert torch.allclose(got, want, atol=1e-12)


def test_none_is_plain_linear_attention():
    q, k, v = qkv(seed=2)
    enc = poskit.build_encoding("none", head_dim=8, num_heads=2)
    fq, fk = elu1(q), elu1(k)
    want = reference(q, k, v, lambda b, h, t, s: fq[b, h, t] @ fk[b, h // 2, s],
                     lambda b, h, t, s: fq[b, h, t] @ fk[b, h // 2, s], True)
    assert torch.allclose(linear_attention(q, k, v, enc), want, atol=1e-12)


def test_relu_feature_map():
    q, k, v = qkv(seed=3)
    enc = poskit.build_encoding("rope", head_dim=8, num_heads=2)
    fq, fk = q.clamp(min=0), k.clamp(min=0)
    R = [rotation(t, 8) for t in range(9)]
    want = reference(q, k, v, lambda b, h, t, s: (R[t] @ fq[b, h, t]) @ (R[s] @ fk[b, h // 2, s]),
                     lambda b, h, t, s: fq[b, h, t] @ fk[b, h // 2, s], True)
    assert torch.allclose(linear_attention(q, k, v, enc, feature_map="relu"), want, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 12), chunk=st.integers(1, 8), groups=st.sampled_from([1, 2]), causal=st.booleans(),
       name=st.sampled_from(["rope", "pope", "none"]), seed=st.integers(0, 2**16))
def test_chunking_never_changes_the_result(T, chunk, groups, causal, name, seed):
    q, k, v = qkv(B=1, H=2, Hkv=2 // groups, T=T, D=4, seed=seed)
    enc = poskit.build_encoding(name, head_dim=4, num_heads=2)
    one = linear_attention(q, k, v, enc, is_causal=causal, chunk_size=T)  # a single chunk: direct pairs
    assert torch.allclose(linear_attention(q, k, v, enc, is_causal=causal, chunk_size=chunk), one, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(shift=st.integers(0, 10**5), name=st.sampled_from(["rope", "pope"]), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_relative_invariance(shift, name, causal, seed):
    # the numerator depends on positions only through s - t and the normaliser not at all
    q, k, v = qkv(B=1, T=6, D=8, seed=seed)
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2)
    pos = torch.tensor([0, 1, 5, 6, 9, 30])
    a = linear_attention(q, k, v, enc, is_causal=causal, q_positions=pos, k_positions=pos)
    b = linear_attention(q, k, v, enc, is_causal=causal, q_positions=pos + shift, k_positions=pos + shift)
    assert torch.allclose(a, b, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(splits=st.lists(st.integers(1, 4), min_size=1, max_size=4), name=st.sampled_from(["rope", "pope", "none"]),
       seed=st.integers(0, 2**16))
def test_recurrent_equals_parallel(splits, name, seed):
    T = sum(splits)
    q, k, v = qkv(B=2, H=2, Hkv=1, T=T, D=4, seed=seed)
    enc = poskit.build_encoding(name, head_dim=4, num_heads=2)
    parallel = linear_attention(q, k, v, enc, is_causal=True, chunk_size=3)
    state, outs, i = None, [], 0
    for n in splits:  # decode in pieces of n tokens, the state carried across calls
        out, state = linear_attention_step(q[:, :, i:i + n], k[:, :, i:i + n], v[:, :, i:i + n], enc, state)
        outs.append(out)
        i += n
    assert state.length == T
    assert torch.allclose(torch.cat(outs, 2), parallel, atol=1e-12)


def test_step_does_not_modify_the_state_passed_in():
    q, k, v = qkv(T=2, D=4)
    enc = poskit.build_encoding("rope", head_dim=4, num_heads=2)
    _, s1 = linear_attention_step(q[:, :, :1], k[:, :, :1], v[:, :, :1], enc)
    before = s1.numerator.clone()
    linear_attention_step(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], enc, s1)
    assert torch.equal(s1.numerator, before) and s1.length == 1


def test_gradients_match_the_reference():
    q, k, v = (t.requires_grad_() for t in qkv(B=1, T=5, D=4))
    enc = poskit.build_encoding("rope", head_dim=4, num_heads=2)
    linear_attention(q, k, v, enc, chunk_size=2).pow(2).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    pos = torch.arange(5)
    rope_reference(q, k, v, pos, pos, True).pow(2).sum().backward()
    for got, t in zip(grads, (q, k, v)):
        assert torch.allclose(got, t.grad, atol=1e-10)


@pytest.mark.parametrize("name", ["alibi", "cope", "relative"])
def test_encodings_without_a_linear_form_are_refused(name):
    q, k, v = qkv(T=4, D=8, Hkv=2)
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2)
    with pytest.raises(ValueError, match=r"^enc: .*cannot be used in linear attention"):
        linear_attention(q, k, v, enc)


@pytest.mark.parametrize("name, options", [("rope-dynamic", {"factor": 2.0, "original_max_positions": 8}),
                                           ("pope", {"softplus": False})])
def test_options_without_a_linear_form_are_refused(name, options):
    q, k, v = qkv(T=4, D=8, Hkv=2)
    enc = poskit.build_encoding(name, head_dim=8, num_heads=2, **options)
    assert enc.linear_form is None
    with pytest.raises(ValueError, match="^enc: "):
        linear_attention(q, k, v, enc)


def test_bad_arguments_name_themselves():
    q, k, v = qkv(T=4, D=8, Hkv=2)
    rope = poskit.build_encoding("rope", head_dim=8, num_heads=2)
    pope = poskit.build_encoding("pope", head_dim=8, num_heads=2)
    with pytest.raises(ValueError, match="feature_map must be None for the polar"):
        linear_attention(q, k, v, pope, feature_map="elu1")
    with pytest.raises(ValueError, match="feature_map must be one of"):
        linear_attention(q, k, v, rope, feature_map="softmax")
    with pytest.raises(ValueError, match="causal=True needs as many queries as keys"):
        linear_attention(q[:, :, :2], k, v, rope)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(q, k, v, rope, chunk_size=0)
    with pytest.raises(ValueError, match="eps"):
        linear_attention(q, k, v, rope, eps=-1.0)
    with pytest.raises(ValueError, match="state must come from the same batch"):
        _, s = linear_attention_step(q[:1], k[:1], v[:1], rope)
        linear_attention_step(q, k, v, rope, s)
    with pytest.raises(ValueError, match="state must be a LinearAttentionState"):
        linear_attention_step(q, k, v, rope, state={"numerator": 0})
    assert isinstance(LinearAttentionState(torch.zeros(1), torch.zeros(1)), LinearAttentionState)


def test_transformer_with_linear_attention_learns():
    # a few steps on a fixed batch lower the loss: gradients reach every layer through the chunked form
    from poskit.models import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=2, attention="linear",
                                    encoding="rope"))
    tokens = torch.randint(0, 16, (4, 24))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_transformer_linear_attention_is_causal():
    # changing a later token leaves the logits of every earlier position unchanged
    from poskit.models import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=2, attention="linear",
                                    encoding="pope"))
    a = torch.randint(0, 16, (1, 12))
    b = a.clone()
    b[0, 8] = (a[0, 8] + 1) % 16
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert torch.allclose(la[:, :8], lb[:, :8], atol=1e-6) and not torch.allclose(la[:, 8:], lb[:, 8:])


def test_model_config_refuses_linear_with_a_bias_encoding():
    from poskit.models import ModelConfig

    with pytest.raises(ValueError, match="^encoding must be an encoding that declares a linear_form"):
        ModelConfig(attention="linear", encoding="alibi")
    with pytest.raises(ValueError, match="^attention must be one of"):
        ModelConfig(attention="performer")


def test_causal_keyword_is_is_causal_and_the_old_spelling_still_works_with_a_warning():
    q, k, v = qkv(T=6, D=8, Hkv=2)
    rope = poskit.build_encoding("rope", head_dim=8, num_heads=2)
    for causal in (True, False):
        with pytest.warns(DeprecationWarning, match=r"^linear_attention\(\): causal= is deprecated, use is_causal="):
            old = linear_attention(q, k, v, rope, causal=causal)
        assert torch.equal(old, linear_attention(q, k, v, rope, is_causal=causal))
    assert not torch.equal(linear_attention(q, k, v, rope, is_causal=True), linear_attention(q, k, v, rope, is_causal=False))
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="give is_causal= only"):
        linear_attention(q, k, v, rope, is_causal=False, causal=True)
    with pytest.raises(ValueError, match="is_causal must be true or false"):
        linear_attention(q, k, v, rope, is_causal=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'casual'"):
        linear_attention(q, k, v, rope, casual=True)
