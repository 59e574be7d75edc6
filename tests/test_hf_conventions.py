"""Hugging Face conventions a PoskitForCausalLM follows: gradient checkpointing (the same gradients with less
memory) and attn_implementation ("sdpa": the engine's fastest exact path, "eager": poskit's reference path with
materialised scores; anything else refused naming the two)."""
import warnings

import pytest

from extras import need
import torch

need("transformers", "hf", "transformers (for poskit.hf)")
pytestmark = pytest.mark.usefixtures("one_thread")

from hf_helpers import VOCAB, hf_model  # noqa: E402
from poskit.hf import PoskitForCausalLM  # noqa: E402

CHECKPOINTED = ["rope", "pope", "cope", "alibi"]


def _grads(model, ids, mask):
    model.zero_grad(set_to_none=True)
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch():
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the mask reaches every recomputed block
    return ids, mask


@pytest.mark.parametrize("encoding", CHECKPOINTED)
def test_gradient_checkpointing_gives_the_gradients_of_the_plain_backward(encoding):
    ids, mask = _batch()
    model = hf_model(encoding, dtype=None, hidden_dropout=0.1).train()  # dropout: the same masks in the recompute
    torch.manual_seed(3)
    plain = _grads(model, ids, mask)
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing and model.model.gradient_checkpointing
    calls = []
    # a pre-hook: the recompute stops once it has what backward needs, before a forward hook would run
    handle = model.model.blocks[0].attn.register_forward_pre_hook(lambda *a: calls.append(1))
    torch.manual_seed(3)
    checkpointed = _grads(model, ids, mask)
    handle.remove()
    assert len(calls) == 2  # the block ran twice: forward, then recomputed in backward
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(model.parameters()))
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=0, msg=name)
    model.activation_checkpointing_disable()
    assert not model.model.gradient_checkpointing


def test_the_deprecated_gradient_checkpointing_enable_works_too():
    model = hf_model("rope", dtype=None).train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 names it deprecated in favour of activation_*
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.model.gradient_checkpointing
    ids, mask = _batch()
    model(ids, attention_mask=mask, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_every_n_layers_other_than_one_is_refused_and_changes_nothing():
    model = hf_model("rope", dtype=None).train()
    with pytest.raises(ValueError, match="every_n_layers must be 1 for a poskit model"):
        model.activation_checkpointing_enable(every_n_layers=2)
    assert not model.model.gradient_checkpointing


def test_no_recompute_in_eval_or_under_no_grad():
    model = hf_model("rope", dtype=None)
    model.activation_checkpointing_enable()
    calls = []
    model.model.blocks[0].attn.register_forward_pre_hook(lambda *a: calls.append(1))
    ids, mask = _batch()
    model.eval()(ids, attention_mask=mask, labels=ids).loss.backward()
    with torch.no_grad():
        model.train()(ids, attention_mask=mask)
    assert len(calls) == 2  # once per call: nothing was checkpointed


@pytest.mark.parametrize("encoding", ["rope", "pope", "cope", "alibi", "sinusoidal"])
def test_eager_is_the_reference_path_and_sdpa_the_default(encoding, monkeypatch):
    import poskit.attention.engine as engine

    ids, mask = _batch()
    model = hf_model(encoding)
    assert model.config._attn_implementation == "sdpa"  # the default: the engine's fastest exact path
    fast = model(ids, attention_mask=mask).logits
    backends = []
    real = engine.choose_backend  # every engine entry (attention, cached_attention) asks it for the backend

    def spy(enc, q, backend):
        backends.append(backend)
        return real(enc, q, backend)

    monkeypatch.setattr(engine, "choose_backend", spy)
    eager = hf_model(encoding, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    out = eager(ids, attention_mask=mask).logits
    assert backends and set(backends) == {"reference"}
    rows = mask.bool()
    torch.testing.assert_close(out[rows], fast[rows], rtol=1e-10, atol=1e-10)
    backends.clear()
    eager.set_attn_implementation("sdpa")
    eager(ids, attention_mask=mask)
    assert set(backends) == {"auto"}


def test_output_attentions_with_eager_reproduce_the_layer_output():
    model = hf_model("pope", attn_implementation="eager")
    ids, mask = _batch()
    seen = []
    handle = model.model.blocks[1].attn.register_forward_hook(lambda m, args, out: seen.append((args, out)))
    out = model(ids, attention_mask=mask, output_attentions=True)
    handle.remove()
    (x, positions, cache, real), layer_out = seen[0]
    attn = model.model.blocks[1].attn
    w = out.attentions[1]
    assert w.shape == (2, 4, 9, 9)
    v = attn._heads(attn.v_proj(x), attn.num_kv_heads).repeat_interleave(2, dim=1)
    recomputed = attn.o_proj((w @ v).transpose(1, 2).reshape(2, 9, -1))
    rows = mask.bool()
    torch.testing.assert_close(recomputed[rows], layer_out[rows], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("value", ["flash_attention_2", "flex_attention", "paged|eager", "bogus"])
def test_other_attn_implementations_are_refused_naming_the_allowed_ones(value, tmp_path):
    with pytest.raises(ValueError, match=r"attn_implementation must be one of \['eager', 'sdpa'\]"):
        hf_model("rope", attn_implementation=value)
    model = hf_model("rope", dtype=None)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"attn_implementation must be one of \['eager', 'sdpa'\]"):
        PoskitForCausalLM.from_pretrained(tmp_path, attn_implementation=value)
    with pytest.raises(ValueError, match=r"attn_implementation must be one of \['eager', 'sdpa'\]"):
        model.set_attn_implementation(value)
    assert model.config._attn_implementation == "sdpa"  # a refused call changes nothing
