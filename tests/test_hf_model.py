"""PoskitForCausalLM against poskit's own Transformer and against formulas written here, in float64."""
import pytest
import torch
import torch.nn.functional as F
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: one thread is faster on a busy machine

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import poskit  # noqa: E402
from hf_helpers import VOCAB, hf_config, hf_model, left_padded  # noqa: E402
from poskit.hf import PoskitForCausalLM, from_poskit, to_poskit  # noqa: E402
from poskit.models import ModelConfig, Transformer  # noqa: E402

ENCODINGS = poskit.available_encodings()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_save_load_safetensors_and_back_to_poskit_give_equal_logits(encoding, tmp_path):
    from transformers import AutoModelForCausalLM

    model = hf_model(encoding, dtype=None)
    ids = torch.randint(1, VOCAB, (2, 9))
    expected = model(ids, use_cache=False).logits  # poskit's forward, not the cache's prefill (below)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not list(tmp_path.glob("*.bin"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is PoskitForCausalLM
    assert torch.equal(loaded(ids, use_cache=False).logits, expected)
    # with a cache (the default in eval) PoPE's prefill attends from the cached key magnitudes: the same values
    # to rounding, by another order of operations than the compiled kernel's
    torch.testing.assert_close(loaded(ids).logits, expected, rtol=1e-5, atol=1e-5)
    poskit_model = to_poskit(tmp_path)
    assert type(poskit_model) is Transformer
    assert torch.equal(poskit_model(ids), expected)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_from_poskit_copies_the_model(encoding):
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, mlp="swiglu", encoding=encoding,
                      encoding_options=hf_config(encoding).position_encoding_options, tie_embeddings=True)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 11))
    for ref in (Transformer(cfg).eval(), Transformer(cfg).double().eval()):  # as built, and cast to float64
        hf = from_poskit(ref)
        assert next(hf.parameters()).dtype == next(ref.parameters()).dtype
        assert torch.equal(hf(ids, use_cache=False).logits, ref(ids))
        torch.testing.assert_close(hf(ids).logits, ref(ids), rtol=1e-5, atol=1e-5)  # the cache's prefill
        assert hf.model.head.weight is hf.model.embed.weight  # tied as in poskit
        assert hf.model.embed.weight is not ref.embed.weight  # a copy


def test_tied_embeddings_survive_save_and_load(tmp_path):
    model = hf_model("rope", tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    loaded = PoskitForCausalLM.from_pretrained(tmp_path)
    assert loaded.model.head.weight is loaded.model.embed.weight
    assert torch.equal(loaded.model.embed.weight, model.model.embed.weight.float())


def test_labels_loss_is_the_shifted_next_token_cross_entropy():
    model = hf_model("pope")
    ids = torch.randint(1, VOCAB, (3, 10))
    labels = ids.clone()
    labels[0, :4] = -100  # ignored positions (e.g. a prompt)
    out = model(ids, labels=labels)
    # written out: position t predicts labels[t + 1]; -100 is skipped; mean over the counted tokens
    logp = torch.log_softmax(model.model(ids), -1)
    terms = [-logp[b, t, labels[b, t + 1]] for b in range(3) for t in range(9) if labels[b, t + 1] != -100]
    # transformers' loss upcasts the logits to float32 (even from a float64 model): equal to float32 precision
    assert torch.allclose(out.loss.double(), torch.stack(terms).mean(), rtol=1e-6)
    assert out.loss.requires_grad


def test_return_dict_false_gives_the_tuple():
    model = hf_model("alibi")
    ids = torch.randint(1, VOCAB, (1, 5))
    loss, logits = model(ids, labels=ids, return_dict=False, use_cache=False)
    assert torch.equal(logits, model(ids).logits) and loss.dim() == 0


@pytest.mark.parametrize("encoding", ["none", "rope", "pope", "alibi", "cope", "relative", "sinusoidal", "learned"])
def test_hidden_states_follow_hugging_face_conventions(encoding):
    model = hf_model(encoding)
    ids = torch.randint(1, VOCAB, (2, 7))
    out = model(ids, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == model.config.num_hidden_layers + 1
    inner = model.model
    # first: the embeddings (plus the absolute encoding, for absolute encodings); last: after the final norm
    emb = inner.embed(ids)
    if inner.abs_encoding is not None:
        emb = emb + inner.abs_encoding.embed(torch.arange(7)[None])
    assert torch.allclose(hs[0], emb, atol=1e-12)
    assert torch.allclose(hs[1], inner.blocks[0](hs[0], torch.arange(7)[None]), atol=1e-12)  # block 0's output
    assert torch.allclose(inner.head(hs[-1]), out.logits, atol=1e-12)


def _causal_softmax(q, k, scale):
    T = q.shape[-2]
    logits = scale * q @ k.transpose(-1, -2)
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(logits, -1)


def test_attention_weights_equal_a_hand_written_softmax():
    # encoding "none": softmax(q k^T / sqrt(d)) with a causal mask, written out from the layer's projections
    model = hf_model("none", num_key_value_heads=4)
    ids = torch.randint(1, VOCAB, (2, 6))
    out = model(ids, output_attentions=True, output_hidden_states=True)
    attn = model.model.blocks[0].attn
    x = model.model.blocks[0].norm1(out.hidden_states[0])
    q = attn.q_proj(x).view(2, 6, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(2, 6, 4, 8).transpose(1, 2)
    assert torch.allclose(out.attentions[0], _causal_softmax(q, k, 8 ** -0.5), atol=1e-12)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_attention_weights_reproduce_the_layer_output(encoding):
    # the weights returned, applied to v and o_proj, give what the layer's fast path computed
    model = hf_model(encoding)
    ids, mask = left_padded([torch.randint(1, VOCAB, (n,)) for n in (4, 7)])
    seen = []
    handle = model.model.blocks[1].attn.register_forward_hook(lambda m, args, out: seen.append((args, out)))
    out = model(ids, attention_mask=mask, output_attentions=True)
    handle.remove()
    (x, positions, cache, real), layer_out = seen[0]
    attn = model.model.blocks[1].attn
    w = out.attentions[1]  # (B, H, T, T)
    assert w.shape == (2, 4, 7, 7)
    v = attn._heads(attn.v_proj(x), attn.num_kv_heads).repeat_interleave(2, dim=1)
    recomputed = attn.o_proj((w @ v).transpose(1, 2).reshape(2, 7, -1))
    rows = mask.bool()  # pads' own outputs are meaningless
    assert torch.allclose(recomputed[rows], layer_out[rows], atol=1e-10)
    assert torch.allclose(w.sum(-1)[rows[:, None, :].expand(2, 4, 7)], torch.ones(()).double())
    assert (w[0, :, :, :3] == 0).all()  # row 0's three left pads are hidden from every query


def test_attentions_with_a_filled_cache_are_refused():
    model = hf_model("rope")
    ids = torch.randint(1, VOCAB, (1, 5))
    out = model(ids, use_cache=True)
    with pytest.raises(ValueError, match="output_attentions.*use_cache=False"):
        model(ids[:, :1], past_key_values=out.past_key_values, output_attentions=True)


def test_unknown_keyword_and_foreign_cache_are_refused():
    from transformers import DynamicCache

    model = hf_model("rope")
    ids = torch.randint(1, VOCAB, (1, 5))
    with pytest.raises(TypeError, match="token_type_ids"):
        model(ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="past_key_values must be a poskit.hf.PoskitCache.*DynamicCache"):
        model(ids, past_key_values=DynamicCache())
    with pytest.raises(ValueError, match=r"exactly one of input_ids .* and inputs_embeds .*got neither"):
        model(None)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 8), min_size=1, max_size=4),
       encoding=st.sampled_from(["pope", "rope", "alibi", "cope", "relative", "sinusoidal", "learned", "rope-yarn"]),
       seed=st.integers(0, 2 ** 16))
def test_left_padding_gives_each_row_its_unpadded_logits(lengths, encoding, seed):
    # (not rope-dynamic: its frequencies follow the longest position in the batch by design, as in transformers'
    # dynamic rope, so a row padded to a longer batch is rotated differently past original_max_positions)
    model = _cached_model(encoding)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]
    ids, mask = left_padded(prompts)
    batched = model(ids, attention_mask=mask).logits
    for i, p in enumerate(prompts):
        alone = model(p[None]).logits[0]
        assert torch.allclose(batched[i, ids.shape[1] - len(p):], alone, atol=1e-10)


_MODELS = {}


def _cached_model(encoding):
    if encoding not in _MODELS:
        _MODELS[encoding] = hf_model(encoding)
    return _MODELS[encoding]
