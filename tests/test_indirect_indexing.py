"""Indirect Indexing against the PoPE paper's definition (App. B.1), by a checker that shares no code with the
generator: it reads each example back from its tokens, recomputes every target from the string, the source
character and the shift, and tallies lengths, shifts and letters over thousands of samples.  The default task
and each cheaper variant (several queries, a smaller alphabet, shorter strings, curricula) are checked; so are
the fixed training set and the disjointness of everything that is scored from everything that is trained on.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import numpy as np
import pytest
import torch

from poskit.tasks import IGNORE_INDEX, build_task, collate

ALL_LETTERS = string.ascii_uppercase + string.ascii_lowercase
QUERY = re.compile(r",([A-Za-z]),([+-])(\d+),([A-Za-z])")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def parse_rows(task, batch):
    """Per row: (string, [(source char, shift, target char, target position in the row)], targets).

    The row's text is its inputs plus the final target (the inputs stop before it)."""
    out = []
    for inp, tgt in zip(batch.inputs.tolist(), batch.targets.tolist()):
        n = len(inp)
        while n and inp[n - 1] == 0:
            n -= 1
        assert all(t == IGNORE_INDEX for t in tgt[n:]), "a target on padding"
        tokens = [task.vocab.tokens[i] for i in inp[:n]] + [task.vocab.tokens[tgt[n - 1]]]
        assert all(len(tok) == 1 for tok in tokens), "character-level: one character per token"
        text = "".join(tokens)
        m = re.fullmatch(r"([A-Za-z]+)((?:,[A-Za-z],[+-]\d+,[A-Za-z])+)", text)
        assert m, text
        src, rest = m.groups()
        queries, pos = [], len(src)
        for q in QUERY.finditer(rest):
            ch, sign, digits, target = q.groups()
            assert digits == str(int(digits)), "no leading zeros"
            assert sign == "+" or int(digits) != 0, "a zero shift is written +0"
            pos += len(q.group(0))
            # the target character is token pos-1 of the text; the input that predicts it is the one before
            queries.append((ch, int(digits) * (1 if sign == "+" else -1), target, pos - 2))
        out.append((src, queries, tgt[:n]))
    return out


def check(task, batches, *, min_len, max_len, max_shift, alphabet=ALL_LETTERS, n_queries=1, allow_zero=True):
    """Every example follows the definition; returns tallies of lengths, shifts and letters."""
    lengths, shifts, letters = Counter(), Counter(), Counter()
    for batch in batches:
        for src, queries, tgt in parse_rows(task, batch):
            assert min_len <= len(src) <= max_len
            assert len(set(src)) == len(src), "letters are drawn without replacement"
            assert set(src) <= set(alphabet)
            assert len(queries) == n_queries
            scored = set()
            for ch, shift, target, at in queries:
                assert abs(shift) <= max_shift and (allow_zero or shift != 0)
                i = src.index(ch)
                assert 0 <= i + shift < len(src), "the shift stays inside the string"
                assert target == src[i + shift]
                assert tgt[at] == task.vocab.index[target]
                scored.add(at)
                shifts[shift] += 1
            assert all(t == IGNORE_INDEX for k, t in enumerate(tgt) if k not in scored), "only targets are scored"
            lengths[len(src)] += 1
            letters.update(src)
    return lengths, shifts, letters


def assert_uniform(counts: Counter, values, slack=0.35):
    """Every value occurs, each within +-slack of the uniform expectation."""
    assert sorted(counts) == sorted(values)
    expected = sum(counts.values()) / len(values)
    assert all(abs(c - expected) < slack * expected for c in counts.values()), counts


def rows_of(batches):
    return {tuple(r) for b in batches for r in b.inputs.tolist()}


# ------------------------------------------------------------------ the paper's task


def test_default_matches_the_paper_definition_over_thousands_of_samples():
    t = build_task("indirect-indexing", eval_size=3000)
    train = [t.train_batch(500, gen(s)) for s in range(4)]
    lengths, shifts, letters = check(t, t.split("validation") + t.split("test") + train,
                                     min_len=20, max_len=40, max_shift=15)
    assert sum(lengths.values()) == 8000
    assert_uniform(lengths, range(20, 41))
    assert_uniform(shifts, range(-15, 16))  # uniform over [-15, +15], 0 included
    assert set(letters) == set(ALL_LETTERS)
    assert t.max_input_len == 47 and len(t.vocab) == 1 + 52 + 10 + 3


def test_checker_catches_a_wrong_target():
    t = build_task("indirect-indexing", n_queries=2, eval_size=20)
    batch = t.split("test")[0]
    check(t, [batch], min_len=20, max_len=40, max_shift=15, n_queries=2)
    at = int(batch.target_mask[0].nonzero()[0])  # the first query's target in row 0
    targets = batch.targets.clone()
    targets[0, at] = t.vocab.index["A"] if targets[0, at] != t.vocab.index["A"] else t.vocab.index["B"]
    with pytest.raises(AssertionError):
        check(t, [type(batch)(batch.inputs, targets)], min_len=20, max_len=40, max_shift=15, n_queries=2)


def test_no_zero_shift_option():
    t = build_task("indirect-indexing", allow_zero_shift=False, eval_size=2000)
    _, shifts, _ = check(t, t.split("test"), min_len=20, max_len=40, max_shift=15, allow_zero=False)
    assert_uniform(shifts, [s for s in range(-15, 16) if s != 0], slack=0.5)


def test_splits_and_fixed_training_set_are_disjoint():
    t = build_task("indirect-indexing", eval_size=1500, train_size=3000)
    val, test = rows_of(t.split("validation")), rows_of(t.split("test"))
    assert len(val) == len(test) == 1500 and not (val & test)
    pool = rows_of([collate(t.train_pool())])
    assert not (pool & (val | test))
    check(t, [collate(t.train_pool())], min_len=20, max_len=40, max_shift=15)


def test_fixed_training_set_is_fixed_compact_and_the_only_training_data():
    t = build_task("indirect-indexing", eval_size=200, train_size=500)
    pool = t.train_pool()
    assert len(pool) == 500 and pool.tokens.dtype == np.uint8
    assert pool.tokens.nbytes + pool.mask_bits.nbytes <= 500 * (47 + 1 + 6)
    again = build_task("indirect-indexing", eval_size=200, train_size=500).train_pool()
    assert np.array_equal(pool.tokens, again.tokens) and np.array_equal(pool.mask_bits, again.mask_bits)
    members = {pool[k].tokens.tobytes() for k in range(len(pool))}
    drawn = set()
    for s in range(6):
        b = t.train_batch(100, gen(s))
        for (src, queries, _), row in zip(parse_rows(t, b), b.inputs.tolist()):
            ch, shift, target, _ = queries[0]
            full = t.vocab.encode(f"{src},{ch},{'+' if shift >= 0 else '-'}{abs(shift)},{target}")
            assert np.array(full, dtype=np.int64).tobytes() in members
            drawn.add(tuple(row))
    assert len(drawn) > 300  # 600 draws with replacement from 500: most of the set is used


def test_packed_batches_equal_collate():
    t = build_task("indirect-indexing", eval_size=50, train_size=300, n_queries=3, min_len=5, max_len=30, max_shift=4)
    pool = t.train_pool()
    for rows in ([0], [5, 5, 7], list(range(0, 300, 7)), [299, 0]):
        a, b = pool.batch(rows), collate([pool[k] for k in rows])
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_paper_preset_sizes():
    t = build_task("indirect-indexing", preset="paper")
    assert (t.min_len, t.max_len, t.max_shift, t.allow_zero_shift) == (20, 40, 15, True)
    assert (t.train_size, t.eval_size) == (1_000_000, 10_000)
    assert (t.n_queries, t.alphabet_size, t.curriculum) == (1, 52, None)


def test_params_rebuild_an_equal_task():
    t = build_task("indirect-indexing", n_queries=2, alphabet_size=30, min_len=6, max_len=12, max_shift=5,
                   eval_size=40)
    again = build_task("indirect-indexing", **t.params)
    assert repr(again) == repr(t) and "n_queries=2" in repr(t)
    assert torch.equal(again.split("test")[0].inputs, t.split("test")[0].inputs)


# ------------------------------------------------------------------ cheaper variants


def test_several_queries_per_string():
    t = build_task("indirect-indexing", n_queries=4, eval_size=1500)
    lengths, shifts, _ = check(t, t.split("validation") + [t.train_batch(500, gen(0))],
                               min_len=20, max_len=40, max_shift=15, n_queries=4)
    assert sum(shifts.values()) == 4 * 2000
    assert_uniform(shifts, range(-15, 16), slack=0.25)
    assert_uniform(lengths, range(20, 41), slack=0.5)
    assert t.accuracy_level == "token"  # per query, each query being one example of the paper's task
    b = t.split("test")[0]
    assert int(b.target_mask.sum()) == 4 * len(b)
    assert b.inputs.shape[1] <= t.max_input_len == 40 + 4 * 8 - 1


def test_smaller_alphabet_and_shorter_strings():
    t = build_task("indirect-indexing", alphabet_size=16, min_len=8, max_len=16, max_shift=7, eval_size=2000)
    alphabet = ALL_LETTERS[:16]
    lengths, shifts, letters = check(t, t.split("test"), min_len=8, max_len=16, max_shift=7, alphabet=alphabet)
    assert_uniform(lengths, range(8, 17))
    assert_uniform(shifts, range(-7, 8))
    assert set(letters) == set(alphabet)
    assert len(t.vocab) == 1 + 16 + 10 + 3 and t.max_input_len == 16 + 7 - 1


def test_length_curriculum():
    t = build_task("indirect-indexing", curriculum="length", curriculum_steps=210, eval_size=500)
    # 21 lengths in 210 steps: a stage of 10 steps per length, the paper's distribution from step 210 on
    assert [t.curriculum_cap(s) for s in (0, 9, 10, 105, 199, 200, 209, 210, 10**6)] == [20, 20, 21, 30, 39, 40, 40,
                                                                                        40, 40]
    for step, cap in ((0, 20), (55, 25), (500, 40)):
        lengths, _, _ = check(t, [t.train_batch(400, gen(step), step=step)], min_len=20, max_len=cap, max_shift=15)
        assert max(lengths) == cap
    lengths, _, _ = check(t, t.split("test"), min_len=20, max_len=40, max_shift=15)
    assert max(lengths) == 40  # evaluation uses the full distribution from the start


def test_shift_curriculum_starts_with_copying():
    t = build_task("indirect-indexing", curriculum="shift", curriculum_steps=160, eval_size=500)
    assert [t.curriculum_cap(s) for s in (0, 9, 10, 80, 159, 160)] == [0, 0, 1, 8, 15, 15]
    for step, cap in ((0, 0), (35, 3), (10**5, 15)):
        _, shifts, _ = check(t, [t.train_batch(2000, gen(step), step=step)], min_len=20, max_len=40, max_shift=cap)
        assert_uniform(shifts, range(-cap, cap + 1), slack=0.5)
    no_zero = build_task("indirect-indexing", curriculum="shift", curriculum_steps=15, allow_zero_shift=False,
                         eval_size=50)
    _, shifts, _ = check(no_zero, [no_zero.train_batch(300, gen(0), step=0)], min_len=20, max_len=40, max_shift=1,
                         allow_zero=False)
    assert sorted(shifts) == [-1, 1]


def test_variants_keep_training_disjoint_from_evaluation():
    for params in (dict(n_queries=3), dict(alphabet_size=10, min_len=3, max_len=4, max_shift=2),
                   dict(curriculum="length", curriculum_steps=50, min_len=3, max_len=5, max_shift=2,
                        alphabet_size=6)):
        t = build_task("indirect-indexing", eval_size=200, **params)
        held = rows_of(t.split("validation")) | rows_of(t.split("test"))
        drawn = rows_of([t.train_batch(200, gen(s), step=s) for s in range(5)])
        assert len(held) == 400 and not (drawn & held), params


def test_default_stream_ignores_the_step():
    t = build_task("indirect-indexing", eval_size=50)
    a, b = t.train_batch(16, gen(3)), t.train_batch(16, gen(3), step=12345)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(alphabet_size=1), r"alphabet_size must be an integer in \[2, 52\], got 1"),
        (dict(alphabet_size=30, max_len=31), r"max_len must be an integer in \[20, 30\], got 31"),
        (dict(n_queries=0), r"n_queries must be an int >= 1, got 0"),
        (dict(n_queries=True), r"n_queries must be an int >= 1, got True"),
        (dict(curriculum="size", curriculum_steps=10), r"curriculum must be one of \['length', 'shift'\], got 'size'"),
        (dict(curriculum="length"), "curriculum and curriculum_steps go together"),
        (dict(curriculum_steps=10), "curriculum and curriculum_steps go together"),
        (dict(curriculum="shift", curriculum_steps=0), r"curriculum_steps must be an int >= 1, got 0"),
        (dict(curriculum="length", curriculum_steps=10, train_size=100), "cannot be combined with a fixed training"),
        (dict(allow_zero_shift=1), r"allow_zero_shift must be true or false \(a bool\), got 1"),
    ],
)
def test_bad_variant_options(params, match):
    with pytest.raises(ValueError, match=match):
        build_task("indirect-indexing", **params)


def test_curriculum_needs_the_step():
    t = build_task("indirect-indexing", curriculum="length", curriculum_steps=10, eval_size=20)
    with pytest.raises(ValueError, match=r"curriculum='length' needs the training step"):
        t.train_batch(4, gen(0))
    with pytest.raises(ValueError, match=r"step must be an int >= 0, got -1"):
        t.train_batch(4, gen(0), step=-1)


def test_reproduce_paper_preset_is_the_papers_appendix_b():
    """`poskit reproduce indirect-indexing --preset paper`: Tables 6-7 of the PoPE paper, 1M fixed examples."""
    from poskit.experiments.registry import experiment
    from poskit.experiments.reproduce import preset_config
    from poskit.training import TrainConfig

    cfg = TrainConfig.from_dict(preset_config(experiment("indirect-indexing", "reproduction").settings, "paper"))
    m = cfg.model
    assert (m.d_model, m.n_layers, m.n_heads, m.dropout) == (512, 8, 8, 0.0)
    assert (cfg.batch_size, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps) == (64, 2e-4, 2e-5, 4000, 100_000)
    assert (cfg.beta2, cfg.weight_decay, cfg.grad_clip) == (0.99, 0.01, 1.0)
    assert cfg.preset == "paper"
    from poskit.training.step import build_task_for

    task = build_task_for(cfg)
    assert (task.train_size, task.eval_size, task.min_len, task.max_len, task.max_shift) == (1_000_000, 10_000, 20, 40, 15)
    # none of the default's variant options survives into the paper's task
    assert (task.alphabet_size, task.n_queries, task.curriculum) == (52, 1, None)


def test_the_reproductions_default_variant_follows_the_definition():
    """The variant `poskit reproduce indirect-indexing` trains by default (shifts up to 3, 16 letters, strings
    of 8-16, four queries per string), checked like the paper's task, over the training stream too."""
    from poskit.experiments.registry import experiment
    from poskit.experiments.reproduce import preset_config
    from poskit.training import TrainConfig
    from poskit.training.step import build_task_for

    cfg = TrainConfig.from_dict(preset_config(experiment("indirect-indexing", "reproduction").settings, "default"))
    assert experiment("indirect-indexing", "reproduction").settings.seeds == (0, 1, 2)
    t = build_task_for(cfg)
    assert (t.alphabet_size, t.min_len, t.max_len, t.max_shift, t.n_queries) == (16, 8, 16, 3, 4)
    alphabet = ALL_LETTERS[:16]
    train = [t.train_batch(250, gen(s)) for s in range(8)]
    for batches in (t.split("test"), train):
        lengths, shifts, letters = check(t, batches, min_len=8, max_len=16, max_shift=3, alphabet=alphabet,
                                         n_queries=4)
        assert_uniform(lengths, range(8, 17))
        assert_uniform(shifts, range(-3, 4))
        assert set(letters) == set(alphabet)
