"""Beam search equals exhaustive search when the beam holds every prefix; greedy equals the obvious argmax
loop; KVCache.select_batch reorders a cache as beam search needs; bad arguments are named."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from poskit.attention.kv_cache import KVCache
from poskit.models.beam import beam_search, greedy_search

BOS, EOS = 0, 1


class ToyScorer:
    """Next-token log-probabilities that depend on the whole prefix: a fixed random table per prefix."""

    def __init__(self, vocab: int, seed: int, batch: int):
        self.vocab, self.seed = vocab, seed
        self.prefixes = [(b,) for b in range(batch)]  # the row's source id, then its tokens

    def table(self, prefix) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed,) + tuple(prefix)) % (2 ** 31))
        return torch.log_softmax(3 * torch.randn(self.vocab, generator=g, dtype=torch.float64), -1)

    def log_probs(self, tokens):
        self.prefixes = [p + (int(t),) for p, t in zip(self.prefixes, tokens[:, 0])]
        return torch.stack([self.table(p) for p in self.prefixes])

    def select(self, index):
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


def exhaustive(scorer: ToyScorer, row: int, max_len: int, alpha: float) -> tuple[list[int], float]:
    """Every sequence that ends at its first EOS or at max_len tokens, scored sum(log p) / n ** alpha."""
    best, best_score = None, -math.inf
    words = [v for v in range(scorer.vocab) if v != EOS]
    for n in range(1, max_len + 1):
        for body in itertools.product(words, repeat=n - 1):
            for last in range(scorer.vocab):  # EOS, or any token when the length limit ends the sequence
                if last != EOS and n != max_len:
                    continue
                seq, prefix, total = list(body) + [last], (row, BOS), 0.0
                for tok in seq:
                    total += float(scorer.table(prefix)[tok])
                    prefix = prefix + (tok,)
                score = total / n ** alpha
                if score > best_score:
                    best, best_score = (list(body) if last == EOS else seq), score
    return best, best_score


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0]), max_len=st.integers(1, 4))
def test_a_beam_as_wide_as_every_prefix_finds_the_exhaustive_optimum(seed, alpha, max_len):
    vocab, batch = 3, 2
    found = beam_search(ToyScorer(vocab, seed, batch), batch, bos=BOS, eos=EOS, max_len=max_len,
                        beam_size=(vocab - 1) ** max_len, length_penalty=alpha)
    for row in range(batch):
        assert found[row] == exhaustive(ToyScorer(vocab, seed, batch), row, max_len, alpha)[0]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), beam=st.integers(1, 4))
def test_a_narrow_beam_never_scores_above_the_exhaustive_optimum(seed, beam):
    vocab, max_len, alpha = 4, 3, 0.6
    found = beam_search(ToyScorer(vocab, seed, 1), 1, bos=BOS, eos=EOS, max_len=max_len, beam_size=beam,
                        length_penalty=alpha)[0]
    scorer, prefix, total = ToyScorer(vocab, seed, 1), (0, BOS), 0.0
    seq = found + ([EOS] if len(found) < max_len else [])
    for tok in seq:
        total += float(scorer.table(prefix)[tok])
        prefix += (tok,)
    assert total / len(seq) ** alpha <= exhaustive(ToyScorer(vocab, seed, 1), 0, max_len, alpha)[1] + 1e-12


def test_greedy_equals_the_argmax_loop():
    scorer, vocab = ToyScorer(5, 3, 3), 5
    found = greedy_search(scorer, 3, bos=BOS, eos=EOS, max_len=6)
    for row in range(3):
        ref, prefix = [], (row, BOS)
        for _ in range(6):
            tok = int(ToyScorer(vocab, 3, 3).table(prefix).argmax())
            if tok == EOS:
                break
            ref.append(tok)
            prefix += (tok,)
        assert found[row] == ref


def test_select_batch_reorders_every_layer_like_a_cache_built_from_those_rows():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 4, 5, generator=g), torch.randn(3, 2, 4, 5, generator=g)
    mask = torch.rand(3, 4, generator=g) > 0.3
    cache = KVCache(2)
    for layer in range(2):
        cache.append(layer, k, v, torch.arange(4), key_mask=mask)
    index = torch.tensor([2, 2, 0])
    cache.select_batch(index)
    for layer in range(2):
        got = cache.layer(layer)
        torch.testing.assert_close(got.keys, k[index])
        torch.testing.assert_close(got.values, v[index])
        assert torch.equal(got.key_mask, mask[index]) and got.positions.shape == (1, 4)
    cache.append(0, k[:, :, :1], v[:, :, :1], torch.tensor([4]))  # still extends after the reorder
    torch.testing.assert_close(cache.layer(0).keys[:, :, 4], k[:, :, 0])
    with pytest.raises(ValueError, match=r"index must hold batch rows in \[0, 2\]"):
        cache.select_batch(torch.tensor([3]))
    with pytest.raises(ValueError, match="index must be a 1-D integer tensor"):
        cache.select_batch(torch.tensor([0.5]))


@pytest.mark.parametrize("kw,name", [({"beam_size": 0}, "beam_size"), ({"length_penalty": -1.0}, "length_penalty"),
                                     ({"max_len": 0}, "max_len"), ({"eos": -1}, "eos")])
def test_bad_arguments_are_named(kw, name):
    args = dict(bos=BOS, eos=EOS, max_len=3, beam_size=2, length_penalty=0.6)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        beam_search(ToyScorer(3, 0, 1), 1, **args)
