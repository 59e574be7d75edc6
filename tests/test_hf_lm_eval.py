"""lm-evaluation-harness's HFLM wrapper evaluates a PoskitForCausalLM: its log-likelihoods of local documents equal
the sum of token log-probabilities from poskit's own Transformer (no download: a character tokenizer built here)."""
import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
need("lm_eval", "peers", "lm-evaluation-harness (lm-eval)")
pytestmark = pytest.mark.usefixtures("one_thread")

from hf_helpers import hf_model  # noqa: E402

CHARS = list("abcdefghijklmnopqrstuvwxyz .,")
DOCS = [("the cat sat on", " the mat."), ("a", "b"), ("once upon a time, there", " was a fox"),
        ("zz", " top, bottom.")]


def _char_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    # BPE without merges: every character is one token (spaces included: no pre-tokenizer splits the text)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def _poskit_loglikelihood(transformer, tokenizer, context, continuation):
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    logp = torch.log_softmax(transformer(ids)[0], -1)  # position t predicts token t + 1
    return sum(float(logp[len(ctx) + i - 1, tok]) for i, tok in enumerate(cont))


@pytest.mark.parametrize("encoding", ["pope", "rope", "cope"])
def test_hflm_loglikelihood_equals_poskit_token_log_probs(encoding):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    tokenizer = _char_tokenizer()
    model = hf_model(encoding, vocab_size=len(CHARS) + 1, pad_token_id=0)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=2)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=doc, idx=i) for i, doc in enumerate(DOCS)]
    results = lm.loglikelihood(requests, disable_tqdm=True)
    for (context, continuation), (logprob, _greedy) in zip(DOCS, results):
        expected = _poskit_loglikelihood(model.model, tokenizer, context, continuation)
        assert logprob == pytest.approx(expected, rel=1e-9, abs=1e-9)
