"""generate() through transformers with the poskit cache: batched left padding = one prompt at a time, cached =
uncached (greedy, sampling, beam search), and the Cache operations transformers calls."""
import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from hf_helpers import VOCAB, hf_model, left_padded  # noqa: E402
from poskit.hf import PoskitCache  # noqa: E402

# one encoding per way of entering attention and per cache form (raw, rotated, PoPE magnitude, contextual, absolute)
ENCODINGS = ["pope", "rope", "alibi", "cope", "relative", "sinusoidal", "rope-yarn"]
KW = dict(max_new_tokens=6, pad_token_id=0)


def _prompts(seed=0, lengths=(3, 7, 5)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_batched_left_padded_greedy_equals_one_prompt_at_a_time_and_uncached(encoding):
    model = hf_model(encoding)
    prompts = _prompts()
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    batched = model.generate(ids, attention_mask=mask, do_sample=False, **KW)[:, L:]
    alone = torch.stack([model.generate(p[None], do_sample=False, **KW)[0, len(p):] for p in prompts])
    uncached = model.generate(ids, attention_mask=mask, do_sample=False, use_cache=False, **KW)[:, L:]
    assert torch.equal(batched, alone) and torch.equal(batched, uncached)
    # and poskit's own generate agrees
    assert torch.equal(model.model.generate(ids, 6, attention_mask=mask)[:, L:], batched)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_cached_scores_equal_uncached_scores(encoding):
    model = hf_model(encoding)
    ids, mask = left_padded(_prompts(1))
    kw = dict(do_sample=False, output_logits=True, return_dict_in_generate=True, **KW)
    cached = model.generate(ids, attention_mask=mask, **kw)
    uncached = model.generate(ids, attention_mask=mask, use_cache=False, **kw)
    assert isinstance(cached.past_key_values, PoskitCache)
    for a, b in zip(cached.logits, uncached.logits):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_beam_search_cached_equals_uncached_and_batched_equals_alone(encoding):
    model = hf_model(encoding)
    prompts = _prompts(2)
    ids, mask = left_padded(prompts)
    L = ids.shape[1]
    kw = dict(num_beams=3, do_sample=False, **KW)
    beams = model.generate(ids, attention_mask=mask, **kw)[:, L:]
    assert torch.equal(beams, model.generate(ids, attention_mask=mask, use_cache=False, **kw)[:, L:])
    alone = torch.stack([model.generate(p[None], **kw)[0, len(p):] for p in prompts])
    assert torch.equal(beams, alone)


@pytest.mark.parametrize("encoding", ["pope", "cope"])
def test_beam_search_returns_the_highest_scoring_sequences_of_an_exhaustive_search(encoding):
    # 2 new tokens from a 6-token vocabulary: every continuation can be scored, so the best 2 are known
    model = hf_model(encoding, vocab_size=6)
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, num_beams=6, num_return_sequences=2, max_new_tokens=2, do_sample=False,
                         pad_token_id=0, length_penalty=0.0, early_stopping=True)
    pairs = torch.cartesian_prod(torch.arange(6), torch.arange(6))
    seqs = torch.cat((prompt.expand(36, 3), pairs), 1)
    logp = torch.log_softmax(model.model(seqs), -1)
    score = logp[:, 2].gather(1, seqs[:, 3:4])[:, 0] + logp[:, 3].gather(1, seqs[:, 4:5])[:, 0]
    best = seqs[score.argsort(descending=True)[:2]]
    assert torch.equal(out, best)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_sampling_cached_equals_uncached_with_the_same_seed(encoding):
    model = hf_model(encoding)
    ids, mask = left_padded(_prompts(3))
    kw = dict(do_sample=True, top_k=10, temperature=1.3, num_return_sequences=2, **KW)
    torch.manual_seed(5)
    cached = model.generate(ids, attention_mask=mask, **kw)
    torch.manual_seed(5)
    uncached = model.generate(ids, attention_mask=mask, use_cache=False, **kw)
    assert torch.equal(cached, uncached)
    assert cached.shape == (6, ids.shape[1] + 6)


def test_cache_operations_transformers_calls():
    model = hf_model("rope")
    ids = torch.randint(1, VOCAB, (2, 5))
    cache = model(ids, use_cache=True).past_key_values
    assert cache.get_seq_length() == 5 and len(cache) == 2 and cache.batch_size == 2
    keys = cache.layers[0].keys.clone()
    cache.reorder_cache(torch.tensor([1, 1]))
    assert torch.equal(cache.layers[0].keys, keys[[1, 1]])
    cache.batch_repeat_interleave(2)
    assert torch.equal(cache.layers[0].keys, keys[[1, 1, 1, 1]])
    cache.batch_select_indices(torch.tensor([0]))
    assert cache.batch_size == 1
    cache.crop(-2)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError, match="tokens_to_remove"):
        cache.crop(2)
    with pytest.raises(NotImplementedError, match="PoskitCache"):
        cache.update(keys, keys, 0)
    # decoding continues exactly after the crop: row 1's first three tokens, then token 3
    step = model(ids[1:, 3:4], past_key_values=cache).logits[0, -1]
    assert torch.allclose(step, model(ids[1:, :4]).logits[0, -1], atol=1e-10)


def test_static_cache_implementation_is_refused():
    model = hf_model("rope")
    with pytest.raises(ValueError, match="cache_implementation='static'.*PoskitCache"):
        model.generate(torch.tensor([[1, 2]]), cache_implementation="static", **KW)


def test_output_attentions_in_generate_without_cache():
    model = hf_model("pope")
    out = model.generate(torch.tensor([[1, 2, 3]]), use_cache=False, output_attentions=True,
                         return_dict_in_generate=True, do_sample=False, **KW)
    assert len(out.attentions) == 6 and out.attentions[-1][0].shape == (1, 4, 8, 8)
