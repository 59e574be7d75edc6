"""What the models share (poskit/models): one block skeleton, one batch built at each model's entry, activation
checkpointing in the block loop, cross-attention through poskit.nn.Attention, clear errors for inputs of the wrong
width, weights saved under the blocks' earlier names, and the ViT placing an encoding by its declarations."""
import pytest
import torch

import poskit
import poskit.nn
from conftest import ENCODING_OPTIONS
from poskit.attention.kv_cache import KVCache
from poskit.models import EncoderDecoder, EncoderDecoderConfig, ModelConfig, Transformer, ViT
from poskit.models.block import Block

pytestmark = pytest.mark.usefixtures("one_thread")


def _decoder(encoding="rope", **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=13, d_model=16, n_layers=2, n_heads=2, encoding=encoding,
               encoding_options=dict(ENCODING_OPTIONS.get(encoding, {})))
    return Transformer(ModelConfig(**{**cfg, **kw}))


def _seq2seq(encoding="rope", **kw):
    torch.manual_seed(0)
    cfg = dict(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2,
               d_ff=24, dropout=0.0, encoding=encoding, encoding_options=dict(ENCODING_OPTIONS.get(encoding, {})))
    cfg.update(kw)
    return EncoderDecoder(EncoderDecoderConfig(**cfg))


# ------------------------------------------------------------------------------------------ one skeleton
def test_every_model_is_built_from_the_one_block_with_poskit_nn_attention():
    vit = ViT(encoding="rope", dim=16, heads=2)
    for blocks in (_decoder().blocks, _seq2seq().encoder, _seq2seq().decoder, vit.blocks):
        assert all(type(b) is Block and isinstance(b.attn, poskit.nn.Attention) for b in blocks)
    assert all(type(b.cross_attn) is poskit.nn.Attention for b in _seq2seq().decoder)  # cross-attention too


# ------------------------------------------------------------------------------ clear errors for bad widths
def test_attention_on_input_of_the_wrong_width_names_both_widths():
    layer = poskit.nn.Attention(32, num_heads=2)
    with pytest.raises(ValueError, match=r"x has width 31 but this attention layer takes dim=32"):
        layer(torch.randn(1, 4, 31))
    cache = KVCache(1)
    layer(torch.randn(1, 4, 32), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"x has width 16 but this attention layer takes dim=32"):
        layer(torch.randn(1, 1, 16), is_causal=True, cache=cache)  # a decode step of the wrong width
    assert cache.length == 4  # refused before anything was appended
    with pytest.raises(ValueError, match=r"context has width 8 but this attention layer takes dim=32"):
        layer(torch.randn(1, 4, 32), context=torch.randn(1, 3, 8))


def test_model_entry_points_refuse_ids_outside_the_vocabulary_naming_the_argument():
    model = _decoder()
    with pytest.raises(ValueError, match=r"tokens ids must be in \[0, 12\] \(vocab_size 13\), got ids in \[0, 13\]"):
        model(torch.tensor([[0, 13]]))
    with pytest.raises(ValueError, match=r"tokens must be a \(B, T\) integer tensor, got a torch.float32 tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"inputs_embeds must be a floating \(B, T, 16\) tensor"):
        model(None, inputs_embeds=torch.zeros(1, 3, 15))
    s2s = _seq2seq()
    with pytest.raises(ValueError, match=r"tgt ids must be in \[0, 10\]"):
        s2s(torch.tensor([[1, 2]]), torch.tensor([[11]]))
    other = _seq2seq(d_model=24, n_heads=2)
    with pytest.raises(ValueError, match=r"memory must come from an encoder of this model \(d_model 16"):
        s2s.decode(torch.tensor([[1]]), other.encode(torch.tensor([[1, 2]])))


# ------------------------------------------------------------------------------------ one batch, built once
def test_a_padded_batch_is_converted_once_at_the_model_boundary(monkeypatch):
    import poskit.attention.padding as padding
    import poskit.models.batch as batch

    calls = {"mask": 0, "positions": 0}
    real_mask, real_positions = batch.real_token_mask, batch.padded_positions

    def count_mask(*a, **k):
        calls["mask"] += 1
        return real_mask(*a, **k)

    def count_positions(*a, **k):
        calls["positions"] += 1
        return real_positions(*a, **k)

    monkeypatch.setattr(batch, "real_token_mask", count_mask)
    monkeypatch.setattr(batch, "padded_positions", count_positions)
    monkeypatch.setattr(padding, "padded_positions", count_positions)
    model = _decoder("cope", n_layers=3)
    ids = torch.randint(1, 13, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    model(ids, attention_mask=mask)
    assert calls == {"mask": 1, "positions": 1}  # not once per layer
    seen = []
    for b in model.blocks:
        b.attn.register_forward_pre_hook(lambda m, args: seen.append(args[3]))
    batch_of_call = model.batch(ids, attention_mask=mask)
    model(ids, attention_mask=mask)
    assert all(torch.equal(real, batch_of_call.real) and real.dtype == torch.bool for real in seen)


# ------------------------------------------------------------------------------- activation checkpointing
def _grads(model, loss_fn, seed=5):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss_fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("encoding", ["rope", "pope", "cope", "alibi"])
def test_checkpointed_decoder_gradients_equal_the_plain_ones(encoding):
    model = _decoder(encoding, dropout=0.1).train()
    ids = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, :2] = False
    loss = lambda: model(ids, attention_mask=mask).logsumexp(-1).mean()  # noqa: E731
    plain = _grads(model, loss)
    model.gradient_checkpointing = True
    calls = []
    model.blocks[1].attn.register_forward_pre_hook(lambda *a: calls.append(1))
    checkpointed = _grads(model, loss)
    assert len(calls) == 2 and plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=0, msg=name)


def test_checkpointed_encoder_decoder_and_vit_gradients_equal_the_plain_ones():
    s2s = _seq2seq("rope", dropout=0.1, cross_attention_positions="aligned").train()
    src, tgt = torch.randint(1, 11, (2, 5)), torch.randint(1, 11, (2, 4))
    vit = ViT(encoding="pope", dim=16, heads=2).train()
    images = torch.rand(2, 1, 8, 8)
    for model, loss in ((s2s, lambda: s2s(src, tgt).pow(2).mean()), (vit, lambda: vit(images).pow(2).mean())):
        plain = _grads(model, loss)
        model.gradient_checkpointing = True
        checkpointed = _grads(model, loss)
        assert plain.keys() == checkpointed.keys() and len(plain) == len(list(model.parameters()))
        for name in plain:
            torch.testing.assert_close(checkpointed[name], plain[name], rtol=0, atol=0, msg=name)


def test_checkpointing_is_skipped_when_decoding_with_a_cache():
    model = _decoder("rope").eval()
    model.gradient_checkpointing = True
    ids = torch.randint(0, 13, (1, 5))
    cache = KVCache(2)
    steps = torch.cat([model(ids[:, :3], cache=cache), model(ids[:, 3:], cache=cache)], 1)
    torch.testing.assert_close(steps, model(ids), rtol=1e-5, atol=1e-5)
    assert cache.length == 5


# -------------------------------------------------------------------------------------- cross-attention
@pytest.mark.parametrize("encoding", ["none", "rope", "alibi"])
def test_cross_attention_equals_hand_written_projections(encoding):
    torch.manual_seed(0)
    layer = poskit.nn.Attention(16, 2, encoding=encoding, bias=True).double()
    x, memory = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1] * 5])
    qpos, kpos = torch.tensor([4, 5, 6]), torch.tensor([[0, 1, 2, 2, 2], [0, 1, 2, 3, 4]])
    heads = lambda t: t.view(2, t.shape[1], 2, 8).transpose(1, 2)  # noqa: E731
    out = poskit.attention(heads(layer.q_proj(x)), heads(layer.k_proj(memory)), heads(layer.v_proj(memory)),
                           layer.encoding, attn_mask=keep.bool()[:, None, None, :], q_positions=qpos,
                           k_positions=kpos, backend="reference")
    want = layer.o_proj(out.transpose(1, 2).reshape(2, 3, 16))
    got = layer(x, context=memory, context_mask=keep, positions=qpos, context_positions=kpos)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not torch.allclose(got[0], layer(x, context=memory, positions=qpos, context_positions=kpos)[0])


def test_cross_attention_refusals_name_the_argument():
    layer = poskit.nn.Attention(16, 2, encoding="none")
    x = torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match="context must have x's batch size 2"):
        layer(x, context=torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match="cache is for self-attention"):
        layer(x, is_causal=True, context=torch.randn(2, 4, 16), cache=KVCache(1))
    with pytest.raises(ValueError, match="context_mask: attention_mask must be a \\(2, 4\\) tensor"):
        layer(x, context=torch.randn(2, 4, 16), context_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="pass context too"):
        layer(x, context_mask=torch.ones(2, 3))


# --------------------------------------------------------------------- weights saved under earlier names
def _old_seq2seq_names(state: dict) -> dict:
    renames = {"encoder": (("norm1.", "res1.norm."), ("norm2.", "res2.norm."), ("mlp.", "ff.")),
               "decoder": (("attn.", "self_attn."), ("norm1.", "res1.norm."), ("norm_cross.", "res2.norm."),
                           ("norm2.", "res3.norm."), ("mlp.", "ff."))}
    out = {}
    for key, value in state.items():
        stack, _, rest = key.partition(".")
        if stack in renames:
            index, _, rest = rest.partition(".")
            for new, old in renames[stack]:
                if rest.startswith(new):
                    rest = old + rest[len(new):]
                    break
            key = f"{stack}.{index}.{rest}"
        out[key] = value
    return out


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_decoder_weights_saved_under_the_earlier_block_names_load(norm):
    trained = _seq2seq("pope", norm=norm, cross_attention_positions="aligned")
    old = _old_seq2seq_names(trained.state_dict())
    assert "decoder.0.self_attn.q_proj.weight" in old and "encoder.1.res2.norm.bias" in old  # the earlier layout
    fresh = _seq2seq("pope", norm=norm, cross_attention_positions="aligned", encoding_options={"delta_init": "zero"})
    fresh.load_state_dict(old)  # strict
    src, tgt = torch.randint(1, 11, (2, 5)), torch.randint(1, 11, (2, 4))
    assert torch.equal(fresh.eval()(src, tgt), trained.eval()(src, tgt))
    with pytest.raises(RuntimeError, match="decoder.0.res9.norm.weight"):
        fresh.load_state_dict({**old, "decoder.0.res9.norm.weight": torch.zeros(16)})


def test_vit_weights_saved_under_the_earlier_mlp_names_load():
    torch.manual_seed(0)
    trained = ViT(encoding="learned", dim=16, heads=2)
    old = {k.replace(".mlp.w1.", ".mlp.0.").replace(".mlp.w2.", ".mlp.2."): v for k, v in trained.state_dict().items()}
    assert "blocks.0.mlp.0.weight" in old
    torch.manual_seed(1)
    fresh = ViT(encoding="learned", dim=16, heads=2)
    fresh.load_state_dict(old)
    images = torch.rand(2, 1, 8, 8)
    assert torch.equal(fresh(images), trained(images))


# --------------------------------------------------------------------------- the ViT reads declarations
def test_vit_places_each_encoding_by_what_it_declares():
    from poskit.models.vit import placement, vit_encodings

    names = vit_encodings()
    assert {"none", "learned", "rope", "pope", "sinusoidal", "legendre"} <= set(names)
    assert not {"alibi", "cope", "relative", "rope-yarn"} & set(names)  # no 2-D positions for them
    assert [placement(n) for n in ("none", "learned", "sinusoidal", "rope", "pope")] == \
        ["none", "table", "embed", "attention", "attention"]
    torch.manual_seed(0)
    images = torch.rand(2, 1, 8, 8)
    moved = images.clone()
    moved[:, :, 0:2, 0:2], moved[:, :, 6:8, 6:8] = images[:, :, 6:8, 6:8], images[:, :, 0:2, 0:2]
    for name in ("sinusoidal", "legendre"):
        model = ViT(encoding=name, dim=16, heads=2).double()
        assert model.blocks[0].attn.encoding.kind == "none" and not list(model.axis_encoding.parameters())
        assert model(upsample_to(images, 16).double()).shape == (2, 10)
        assert not torch.allclose(model(images.double()), model(moved.double()), atol=1e-6)  # positions matter


def upsample_to(images, size):
    return torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
