"""PoskitForCausalLM's position_ids and inputs_embeds, as transformers users pass them: explicit positions equal
to the default ones change nothing, other positions give what poskit's own API gives with them (and what a
relative encoding gives without them), embeddings in place of ids give the same logits and the same greedy
generation, and malformed inputs are refused naming the argument."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from hf_helpers import VOCAB, hf_model, left_padded  # noqa: E402

# one encoding per way positions enter: absolute at the embeddings (sinusoidal, learned), q/k rotation (rope,
# rope-yarn), PoPE, a bias (alibi, relative), contextual (cope)
ENCODINGS = ["sinusoidal", "learned", "rope", "rope-yarn", "pope", "alibi", "relative", "cope"]
KW = dict(max_new_tokens=5, pad_token_id=0, do_sample=False)


def _ids(b=2, t=6, seed=0):
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _padded(seed=0):
    g = torch.Generator().manual_seed(seed)
    return left_padded([torch.randint(1, VOCAB, (n,), generator=g) for n in (4, 7, 2)])


def _hf_default_positions(mask):
    # transformers' convention for a padded batch: the count of real tokens before each token (pads at 0)
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_explicit_default_position_ids_change_nothing(encoding):
    model = hf_model(encoding)
    ids = _ids()
    T = ids.shape[1]
    default = model(ids).logits
    assert torch.equal(model(ids, position_ids=torch.arange(T)[None]).logits, default)
    assert torch.equal(model(ids, position_ids=torch.arange(T).expand(2, T)).logits, default)
    padded, mask = _padded()
    real = mask.bool()
    expected = model(padded, attention_mask=mask).logits
    got = model(padded, attention_mask=mask, position_ids=_hf_default_positions(mask)).logits
    assert torch.equal(got[real], expected[real])  # a pad's own logits are meaningless either way


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_shifted_position_ids_give_the_logits_of_poskit_run_at_those_positions(encoding):
    model = hf_model(encoding)
    ids = _ids()
    positions = torch.arange(ids.shape[1]) + torch.tensor([[3], [11]])  # a different shift per row
    got = model(ids, position_ids=positions).logits
    assert torch.equal(got, model.model(ids, positions=positions))
    # and with padding, the mask still hides the pads while the given positions are used
    padded, mask = _padded(1)
    shifted = _hf_default_positions(mask) + 5
    got = model(padded, attention_mask=mask, position_ids=shifted).logits
    assert torch.equal(got, model.model(padded, positions=shifted, attention_mask=mask))


def test_position_ids_reach_an_absolute_encoding():
    # guard against a silently ignored argument: sinusoidal logits do depend on the positions
    model = hf_model("sinusoidal")
    ids = _ids()
    assert not torch.allclose(model(ids, position_ids=torch.arange(6)[None] + 7).logits, model(ids).logits)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(encoding=st.sampled_from(["rope", "alibi", "pope"]), shifts=st.lists(st.integers(0, 500), min_size=1, max_size=3),
       length=st.integers(1, 7), seed=st.integers(0, 2 ** 16))
def test_relative_encodings_ignore_a_common_shift_of_position_ids(encoding, shifts, length, seed):
    """Independent of poskit's plumbing: a relative encoding's logits depend on position differences only,
    so any per-row shift of position_ids leaves them unchanged (up to float64 rounding)."""
    model = hf_model(encoding)
    ids = _ids(len(shifts), length, seed)
    shifted = torch.arange(length) + torch.tensor(shifts)[:, None]
    torch.testing.assert_close(model(ids, position_ids=shifted).logits, model(ids).logits, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "pope", "alibi", "cope"])
def test_cached_decode_with_position_ids_equals_the_full_forward(encoding):
    model = hf_model(encoding)
    ids = _ids(t=7)
    positions = (torch.arange(7) * 2 + torch.tensor([[1], [4]]))  # gaps, a different start per row
    full = model(ids, position_ids=positions).logits
    out = model(ids[:, :5], position_ids=positions[:, :5], use_cache=True)
    step = model(ids[:, 5:], position_ids=positions[:, 5:], past_key_values=out.past_key_values, use_cache=True)
    torch.testing.assert_close(step.logits, full[:, 5:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope"])
def test_generate_with_position_ids_equals_a_greedy_loop_at_those_positions(encoding):
    model = hf_model(encoding)
    ids = _ids(b=1, t=4)
    start = 9
    out = model.generate(ids, position_ids=torch.arange(4)[None] + start, **KW)
    seq = ids
    for _ in range(KW["max_new_tokens"]):  # uncached greedy decoding through poskit's own API
        logits = model.model(seq, positions=torch.arange(seq.shape[1]) + start)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_inputs_embeds_of_the_ids_give_identical_logits(encoding):
    model = hf_model(encoding)
    ids = _ids()
    assert torch.equal(model(inputs_embeds=model.get_input_embeddings()(ids)).logits, model(ids).logits)
    padded, mask = _padded(2)
    embeds = model.get_input_embeddings()(padded)
    assert torch.equal(model(inputs_embeds=embeds, attention_mask=mask).logits,
                       model(padded, attention_mask=mask).logits)


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "pope", "alibi", "cope"])
def test_generate_from_inputs_embeds_equals_generate_from_input_ids(encoding):
    model = hf_model(encoding)
    ids, mask = _padded(3)
    L = ids.shape[1]
    from_ids = model.generate(ids, attention_mask=mask, **KW)[:, L:]
    # transformers returns only the new tokens when it is given embeddings
    from_embeds = model.generate(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=mask, **KW)
    assert torch.equal(from_embeds, from_ids)


def test_malformed_inputs_are_refused_naming_the_argument():
    model = hf_model("rope")
    ids = _ids()
    embeds = model.get_input_embeddings()(ids)
    with pytest.raises(ValueError, match="exactly one of input_ids .* got both"):
        model(ids, inputs_embeds=embeds)
    with pytest.raises(ValueError, match=r"inputs_embeds must be a floating \(B, T, 32\) tensor.*\(2, 6, 16\)"):
        model(inputs_embeds=embeds[..., :16])
    with pytest.raises(ValueError, match="inputs_embeds must be a floating"):
        model(inputs_embeds=ids[..., None].expand(2, 6, 32))
    with pytest.raises(ValueError, match="input_ids must be a .B, T. integer tensor.*float"):
        model(ids.double())
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 39\] \(vocab_size 40\), got ids in "
                                         r"\[1, 40\]"):
        model(ids.clone().fill_(1).index_fill_(1, torch.tensor([0]), VOCAB))
    with pytest.raises(ValueError, match=r"position_ids must be an integer tensor.*torch.float"):
        model(ids, position_ids=torch.arange(6.0)[None])
    with pytest.raises(ValueError, match=r"position_ids must have shape \(2, 6\) or \(1, 6\).*got \(6,\)"):
        model(ids, position_ids=torch.arange(6))
    with pytest.raises(ValueError, match=r"position_ids must have shape .* got \(3, 6\)"):
        model(ids, position_ids=torch.arange(6).expand(3, 6))
    with pytest.raises(ValueError, match="position_ids must be >= 0, got a minimum of -1"):
        model(ids, position_ids=torch.arange(6)[None] - 1)


def test_poskit_transformer_takes_inputs_embeds_and_refuses_them_with_tokens():
    model = hf_model("sinusoidal").model
    ids = _ids()
    embeds = model.embed(ids)
    assert torch.equal(model(None, inputs_embeds=embeds), model(ids))
    with pytest.raises(ValueError, match="tokens or inputs_embeds, not both"):
        model(ids, inputs_embeds=embeds)
    with pytest.raises(ValueError, match=r"inputs_embeds must be a floating \(B, T, 32\) tensor"):
        model(None, inputs_embeds=embeds[0])
