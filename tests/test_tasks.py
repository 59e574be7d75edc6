"""Tests of poskit.tasks.

Every synthetic generator is checked by an independent checker: a small parser that
reads the decoded input string back, recomputes the answer(s) from the task's
definition in the papers, and compares them with the batch's targets.
"""

from __future__ import annotations

import itertools
import re
import string
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.tasks import (
    IGNORE_INDEX,
    Batch,
    Task,
    available_tasks,
    build_task,
    collate,
    lm_loss,
    score_batch,
    summarize,
    task_parameters,
)
from poskit.tasks.base import rng_from_generator

LETTERS = set(string.ascii_letters)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rows(batch: Batch):
    """(input tokens without padding, targets of those positions) per row.

    Padding is only at the end, and an input position is padding exactly when it is
    0 and all later positions are too; targets beyond the content must be -100."""
    for inp, tgt in zip(batch.inputs.tolist(), batch.targets.tolist()):
        n = len(inp)
        while n > 0 and inp[n - 1] == 0:
            n -= 1
        assert all(t == IGNORE_INDEX for t in tgt[n:]), "target on a padding position"
        yield inp[:n], tgt[:n]


def full_text_tokens(task, inp, tgt) -> list[str]:
    """The whole example as tokens: the inputs plus the final target (the last answer)."""
    return [task.vocab.tokens[i] for i in inp] + [task.vocab.tokens[tgt[-1]]]


def all_batches(task, n_train=2, bs=64):
    out = [task.train_batch(bs, gen(s)) for s in range(n_train)]
    for s in task.split_names:
        out += task.split(s)
    return out


def row_keys(batches):
    return {tuple(inp) for b in batches for inp, _ in rows(b)}


# ------------------------------------------------------------------ checkers


def check_indirect_indexing(task, batch, min_len, max_len, max_shift, allow_zero=True):
    v = task.vocab
    for inp, tgt in rows(batch):
        text = v.decode(inp)
        m = re.fullmatch(r"([A-Za-z]+),([A-Za-z]),([+-])(\d+),", text)
        assert m, text
        src, ch, sign, mag = m.groups()
        assert min_len <= len(src) <= max_len
        assert len(set(src)) == len(src), "letters must be drawn without replacement"
        shift = int(mag) * (1 if sign == "+" else -1)
        assert str(int(mag)) == mag, "no leading zeros"
        assert abs(shift) <= max_shift
        if not allow_zero:
            assert shift != 0
        if shift == 0:
            assert sign == "+"
        i = src.index(ch)
        assert 0 <= i + shift < len(src), "shift leaves the string"
        expected = src[i + shift]
        # only the last position carries a target: the target character
        assert tgt[-1] == v.index[expected]
        assert all(t == IGNORE_INDEX for t in tgt[:-1])


def check_flip_flop(task, batch, length, reads_only=True):
    v = task.vocab
    for inp, tgt in rows(batch):
        toks = full_text_tokens(task, inp, tgt)
        assert len(toks) == length
        instr, bits = toks[0::2], toks[1::2]
        assert set(instr) <= {"w", "r", "i"} and set(bits) <= {"0", "1"}
        assert instr[0] == "w" and instr[-1] == "r"
        mem = None
        for k, (op, bit) in enumerate(zip(instr, bits)):
            pos = 2 * k  # input position whose next token is this bit
            if op == "w":
                mem = bit
            if op == "r":
                assert bit == mem, "read must return the last written bit"
                assert tgt[pos] == v.index[mem]
            elif reads_only:
                assert tgt[pos] == IGNORE_INDEX
        if reads_only:
            assert all(tgt[p] == IGNORE_INDEX for p in range(1, len(tgt), 2)), "targets on instruction tokens"
        else:
            assert all(t != IGNORE_INDEX for t in tgt)


def check_selective_copy(task, batch, n_tokens, n_blanks):
    v = task.vocab
    for inp, tgt in rows(batch):
        text = v.decode(inp)
        ctx, sep, copied = text.partition("|")
        assert sep == "|"
        assert len(ctx) == n_tokens + n_blanks
        assert ctx.count(".") == n_blanks
        data = [c for c in ctx if c != "."]
        assert len(data) == n_tokens
        assert set(data) <= set(string.ascii_uppercase[:14])
        # teacher forcing: the inputs after the delimiter are the first k-1 tokens
        assert list(copied) == data[:-1]
        start = len(ctx)  # position of '|': its target is the first data token
        assert [v.tokens[t] for t in tgt[start:]] == data
        assert all(t == IGNORE_INDEX for t in tgt[:start])


def run_counting_program(words, max_value):
    """Execute a counting program; returns (printed variable, its value, distance in
    tokens from that variable's last set statement to the print)."""
    vals, last_set, i = {}, {}, 0
    while words[i] != "print":
        w = words[i]
        if w == "pass;":
            i += 1
        elif words[i + 1] == "=":
            assert words[i + 2] == "0" and words[i + 3] == ";"
            vals[w] = 0
            last_set[w] = i
            i += 4
        elif words[i + 1] == "++;":
            assert w in vals, "increment of a variable that was never set"
            vals[w] += 1
            assert vals[w] <= max_value, "value above the limit"
            i += 2
        else:
            raise AssertionError(f"cannot parse {words[i:i + 4]}")
    assert i == len(words) - 2, "print must be the last statement"
    var = words[i + 1]
    return var, vals[var], i - last_set[var]


def check_counting(task, batch, max_value=10, max_steps=None):
    v = task.vocab
    dists = []
    for inp, tgt in rows(batch):
        words = [v.tokens[i] for i in inp]
        var, val, dist = run_counting_program(words, max_value)
        dists.append(dist)
        if max_steps is not None:
            n_statements = sum(w in ("pass;", ";", "++;") for w in words)
            assert 3 <= n_statements <= max_steps
        assert tgt[-1] == v.index[str(val)]
        assert all(t == IGNORE_INDEX for t in tgt[:-1])
    return dists


# ------------------------------------------------------------------ registry, errors


def test_available_and_protocol(tmp_path, monkeypatch):
    monkeypatch.setenv("POSKIT_DATA", str(tmp_path))  # the stdlib slice's token cache goes here, not the user's
    corpus_tasks = ["corpus", "lm-code", "lm-genome", "lm-jsb", "lm-maestro", "lm-plays", "lm-wiki"]
    synthetic = ["counting", "flip-flop", "indirect-indexing", "selective-copy", "shakespeare"]
    mlm_tasks = ["mlm", "mlm-wiki"]
    assert available_tasks() == sorted(synthetic + corpus_tasks + mlm_tasks + ["passkey"])
    # the corpus tasks need the optional corpora (tests/test_data_*.py); a small stdlib slice stands for them
    built = [build_task(name) for name in synthetic]
    built.append(build_task("corpus", corpus="code", tokenizer="bytes", max_documents=8))
    built.append(build_task("mlm", corpus="code", tokenizer="bytes", vocab_size=None, max_documents=8))
    built.append(build_task("passkey", eval_size=4))
    for t in built:
        assert isinstance(t, Task)
        assert t.metric in ("accuracy", "perplexity", "loss")
        assert t.vocab.pad_id == 0 and t.vocab.tokens[0] == "<pad>"
        assert set(t.split_names) >= {"validation", "test"}


@pytest.mark.parametrize(
    "name, params, match",
    [
        ("nope", {}, "available tasks"),
        ("indirect-indexing", {"foo": 1}, "unknown parameter 'foo'.*allowed parameters"),
        ("indirect-indexing", {"min_len": 30, "max_len": 20}, "max_len"),
        ("indirect-indexing", {"max_len": 53}, "max_len"),
        ("indirect-indexing", {"min_len": 10, "max_shift": 10}, "max_shift"),
        ("indirect-indexing", {"max_shift": 0, "allow_zero_shift": False}, "max_shift"),
        ("indirect-indexing", {"min_len": 2.5}, "min_len must be an integer"),
        ("flip-flop", {"length": 101}, "length must be even"),
        ("flip-flop", {"p_ignore": 1.0}, "p_ignore"),
        ("flip-flop", {"train_loss_on": "bits"}, r"train_loss_on must be one of \['reads', 'all'\]"),
        ("selective-copy", {"n_tokens": 0}, "n_tokens"),
        ("selective-copy", {"n_symbols": 30}, "n_symbols"),
        ("counting", {"n_vars": 0}, "n_vars"),
        ("counting", {"w_set": 0}, "w_set"),
        ("counting", {"max_steps": 2}, "max_steps"),
        ("shakespeare", {"held_out": ["hamlet", "nosuchplay"]}, "nosuchplay"),
        ("shakespeare", {"test_chars": 10**9}, "test_chars"),
        ("counting", {"eval_size": 0}, "eval_size"),
    ],
)
def test_bad_params(name, params, match):
    with pytest.raises(ValueError, match=match):
        build_task(name, **params)


def test_bad_preset_split_and_batch_args():
    with pytest.raises(ValueError, match="preset must be one of"):
        build_task("counting", preset="huge")
    t = build_task("flip-flop", eval_size=8)
    with pytest.raises(ValueError, match="split must be one of"):
        t.split("train")
    with pytest.raises(ValueError, match="batch_size"):
        t.train_batch(0, gen(0))
    with pytest.raises(ValueError, match="generator"):
        t.train_batch(4, 123)
    s = build_task("shakespeare")
    with pytest.raises(ValueError, match="split must be one of"):
        s.eval_windows(64, "train")


def test_paper_presets():
    ii = build_task("indirect-indexing", preset="paper", eval_size=5)
    assert (ii.min_len, ii.max_len, ii.max_shift) == (20, 40, 15)
    sc = build_task("selective-copy", preset="paper", eval_size=4)
    assert (sc.n_tokens, sc.n_blanks, sc.ood_dense_blanks, sc.ood_sparse_blanks) == (256, 256, 128, 512)
    assert sc.max_input_len == 256 * 2 + 512
    check_selective_copy(sc, sc.split("ood_sparse")[0], 256, 512)
    ff = build_task("flip-flop", preset="paper", eval_size=4)
    assert ff.length == 512 and ff.split("test")[0].inputs.shape == (4, 511)
    ct = build_task("counting", preset="paper", eval_size=4, train_size=20)
    assert ct.max_steps == 512 and ct.train_size == 20


# ------------------------------------------------------------------ indirect indexing


def test_indirect_indexing_labels_and_format():
    t = build_task("indirect-indexing", eval_size=300)
    for b in all_batches(t):
        check_indirect_indexing(t, b, 20, 40, 15)
    assert len(t.vocab) == 1 + 52 + 10 + 3
    b = t.train_batch(64, gen(0))
    assert b.inputs.shape[1] <= t.max_input_len == 47


def test_indirect_indexing_paper_sample_format():
    t = build_task("indirect-indexing")
    # the paper's samples (without the spaces of its listing) encode, decode and check.
    # (Its first listed sample "TzbnkWoKDyscBepYvfwxEVQtgPa, c, -8, b" is off by one - -8 from
    # 'c' is 'n' - and the Sec. 4 example has a '1' where an 'l' must be.)
    for s in ["NZTUIGWkXFrhCJDzscat,N,+4,I", "RBEvOPgtAGDnjhbJCLScruZpMNsYwfQxXFAzUT,x,+2,F",
              "QEOHoUbKfeSrMVNlCzXu,z,-3,N"]:
        assert t.vocab.decode(t.vocab.encode(s)) == s
        src, ch, sh, tgt = s.split(",")
        assert src[src.index(ch) + int(sh)] == tgt
    assert t.format_shift(0) == "+0" and t.format_shift(-15) == "-15"


def test_indirect_indexing_distribution():
    t = build_task("indirect-indexing", eval_size=3000)
    shifts, lengths, letters = Counter(), Counter(), Counter()
    for b in t.split("validation"):
        for inp, _ in rows(b):
            src, ch, sh, _ = t.vocab.decode(inp).split(",")
            shifts[int(sh)] += 1
            lengths[len(src)] += 1
            letters.update(src)
    assert sorted(shifts) == list(range(-15, 16))  # every shift, uniformly (expected ~97 each)
    assert min(shifts.values()) > 55 and max(shifts.values()) < 145
    assert sorted(lengths) == list(range(20, 41))
    assert min(lengths.values()) > 85  # expected ~143 each
    assert set(letters) == LETTERS


def test_indirect_indexing_small_variant_and_no_zero():
    t = build_task("indirect-indexing", min_len=10, max_len=20, max_shift=1, allow_zero_shift=False, eval_size=200)
    for b in all_batches(t):
        check_indirect_indexing(t, b, 10, 20, 1, allow_zero=False)


@settings(max_examples=25, deadline=None)
@given(
    min_len=st.integers(2, 52),
    extra=st.integers(0, 20),
    shift_frac=st.floats(0, 1),
    seed=st.integers(0, 2**31),
)
def test_indirect_indexing_property(min_len, extra, shift_frac, seed):
    max_len = min(52, min_len + extra)
    max_shift = int(shift_frac * (min_len - 1))
    t = build_task("indirect-indexing", min_len=min_len, max_len=max_len, max_shift=max_shift)
    check_indirect_indexing(t, t.train_batch(16, gen(seed)), min_len, max_len, max_shift)


# ------------------------------------------------------------------ flip-flop


def read_distances(task, batches):
    """Distance (in instructions) from each read to the write it recalls."""
    d = []
    for b in batches:
        for inp, tgt in rows(b):
            instr = full_text_tokens(task, inp, tgt)[0::2]
            last_w = None
            for k, op in enumerate(instr):
                if op == "w":
                    last_w = k
                elif op == "r":
                    d.append(k - last_w)
    return np.array(d)


def test_flip_flop_labels():
    t = build_task("flip-flop", eval_size=200)
    for b in all_batches(t, bs=32):
        check_flip_flop(t, b, 256)
    t_all = build_task("flip-flop", length=64, train_loss_on="all", eval_size=50)
    check_flip_flop(t_all, t_all.train_batch(32, gen(1)), 64, reads_only=False)
    check_flip_flop(t_all, t_all.split("test")[0], 64, reads_only=True)  # eval scores reads only


def test_flip_flop_ood_statistics():
    t = build_task("flip-flop", eval_size=400)
    frac_i = {}
    for s in t.split_names:
        ins = [tok for b in t.split(s) for inp, tgt in rows(b) for tok in full_text_tokens(t, inp, tgt)[2:-2:2]]
        frac_i[s] = Counter(ins)["i"] / len(ins)
    assert abs(frac_i["test"] - 0.8) < 0.01 and abs(frac_i["ood_sparse"] - 0.98) < 0.005
    assert abs(frac_i["ood_dense"] - 0.1) < 0.01
    d_in = read_distances(t, t.split("test")).mean()
    d_sparse = read_distances(t, t.split("ood_sparse")).mean()
    d_dense = read_distances(t, t.split("ood_dense")).mean()
    assert d_sparse > 3 * d_in and d_dense < d_in


@settings(max_examples=20, deadline=None)
@given(half=st.integers(4, 80), p=st.floats(0.0, 0.99), seed=st.integers(0, 2**31))
def test_flip_flop_property(half, p, seed):
    # eval_size 1: training excludes the evaluation splits, which must leave room in the shortest sequences
    t = build_task("flip-flop", length=2 * half, p_ignore=p, eval_size=1)
    check_flip_flop(t, t.train_batch(8, gen(seed)), 2 * half)


# ------------------------------------------------------------------ selective copy


def test_selective_copy_labels_and_ood():
    t = build_task("selective-copy", eval_size=200)
    blanks = {"validation": 32, "test": 32, "ood_dense": 16, "ood_sparse": 64}
    for s, nb in blanks.items():
        for b in t.split(s):
            check_selective_copy(t, b, 32, nb)
    for seed in range(3):
        check_selective_copy(t, t.train_batch(32, gen(seed)), 32, 32)
    assert len(t.vocab) == 17  # 14 data + blank + delimiter (+ pad)


def test_selective_copy_positions_uniform():
    t = build_task("selective-copy", n_tokens=4, n_blanks=12, eval_size=2000)
    occ = np.zeros(16)
    for b in t.split("validation"):
        occ += (b.inputs[:, :16] != t.vocab.index["."]).sum(0).numpy()
    # each of 16 slots holds a data token with probability 4/16
    assert np.all(np.abs(occ / 2000 - 0.25) < 0.05)


# ------------------------------------------------------------------ counting


def test_counting_labels_and_ood():
    t = build_task("counting", eval_size=300)
    dists = {}
    for s in t.split_names:
        dists[s] = np.mean([d for b in t.split(s) for d in check_counting(t, b, max_steps=256)])
    for seed in range(3):
        check_counting(t, t.train_batch(32, gen(seed)), max_steps=256)
    # the relevant context (last set of the printed variable -> print) is longer / shorter OOD
    assert dists["ood_longer"] > 1.15 * dists["test"] and dists["test"] > 1.5 * dists["ood_shorter"]
    t3 = build_task("counting", n_vars=3, max_steps=64, eval_size=100)
    for s in t3.split_names:
        check_counting(t3, t3.split(s)[0], max_steps=64)


def test_counting_value_cap_and_vars():
    t = build_task("counting", n_vars=1, max_steps=200, w_pass=1, max_value=3, eval_size=200)
    answers = Counter()
    for b in t.split("test"):
        check_counting(t, b, max_value=3)
        answers.update(t.vocab.tokens[x] for x in b.targets[b.target_mask].tolist())
    assert set(answers) <= {"0", "1", "2", "3"} and answers["3"] > 50  # the cap is reached, never passed
    t5 = build_task("counting", n_vars=5, eval_size=100)
    seen = {t5.vocab.tokens[i] for b in t5.split("test") for i in b.inputs.flatten().tolist()}
    assert {"a", "b", "c", "d", "e"} <= seen and "f" not in t5.vocab


def test_counting_reference_format():
    t = build_task("counting", n_vars=2)
    words = "a = 0 ; pass; pass; a ++; pass; b = 0 ; a ++; print a 2".split()
    assert t.vocab.decode(t.vocab.encode(words)) == " ".join(words)
    assert run_counting_program(words[:-1], 10)[:2] == ("a", 2)


def _corrupt_first_target(task, batch, alternatives):
    tg = batch.targets.clone()
    pos = int(batch.target_mask[0].nonzero()[0])
    cur = task.vocab.tokens[int(tg[0, pos])]
    tg[0, pos] = task.vocab.index[next(a for a in alternatives if a != cur)]
    return Batch(batch.inputs, tg)


def test_checkers_catch_wrong_labels():
    """The checkers are not vacuous: one wrong target makes each of them fail."""
    cases = [
        ("indirect-indexing", "AB", lambda t, b: check_indirect_indexing(t, b, 20, 40, 15)),
        ("flip-flop", "01", lambda t, b: check_flip_flop(t, b, 256)),
        ("selective-copy", "AB", lambda t, b: check_selective_copy(t, b, 32, 32)),
        ("counting", ["0", "1"], lambda t, b: check_counting(t, b)),
    ]
    for name, alternatives, check in cases:
        t = build_task(name, eval_size=20)
        b = t.split("test")[0]
        check(t, b)
        with pytest.raises(AssertionError):
            check(t, _corrupt_first_target(t, b, alternatives))


# ------------------------------------------------------------------ common synthetic behaviour


SYNTH = ["indirect-indexing", "flip-flop", "selective-copy", "counting"]


@pytest.mark.parametrize("name", SYNTH)
def test_splits_deterministic_and_disjoint(name):
    a = build_task(name, eval_size=150)
    b = build_task(name, eval_size=150)
    for s in a.split_names:
        xa, xb = a.split(s, batch_size=64), b.split(s, batch_size=64)
        assert len(xa) == 3 and sum(len(x) for x in xa) == 150
        for p, q in zip(xa, xb):
            assert torch.equal(p.inputs, q.inputs) and torch.equal(p.targets, q.targets)
        assert a.split(s, batch_size=64)[0].inputs.data_ptr() != 0  # repeated calls work
    val = row_keys(a.split("validation"))
    for s in a.split_names:
        if s != "validation":
            assert not (row_keys(a.split(s)) & val), f"{s} overlaps validation"
    assert row_keys(a.split("test")) != row_keys(build_task(name, eval_size=150, eval_seed=1).split("test"))


@pytest.mark.parametrize("name", SYNTH + ["shakespeare"])
def test_train_batches_deterministic(name):
    t = build_task(name) if name != "shakespeare" else build_task(name, context=32)
    b1, b2, b3 = t.train_batch(16, gen(7)), t.train_batch(16, gen(7)), t.train_batch(16, gen(8))
    assert torch.equal(b1.inputs, b2.inputs) and torch.equal(b1.targets, b2.targets)
    assert not torch.equal(b1.inputs[:, : b3.inputs.shape[1]], b3.inputs[:, : b1.inputs.shape[1]])
    g = gen(7)
    c1, c2 = t.train_batch(16, g), t.train_batch(16, g)  # the generator advances
    assert torch.equal(c1.inputs, b1.inputs) and not torch.equal(c1.inputs[:, :5], c2.inputs[:, :5])
    assert b1.inputs.dtype == torch.int64 and b1.inputs.shape[1] <= t.max_input_len


# example spaces small enough that independent draws of the splits (and of training data) collide
SMALL = {
    "indirect-indexing": (dict(min_len=2, max_len=2, max_shift=1), 300),
    "flip-flop": (dict(length=10), 3),
    "selective-copy": (dict(n_tokens=2, n_blanks=2, ood_dense_blanks=2, ood_sparse_blanks=3, n_symbols=2), 6),
    "counting": (dict(max_steps=6), 20),
}


def raw_keys(task, n, variant, seed=0):
    """Rows the generator itself draws, without any exclusion."""
    return row_keys([collate(task._generate(np.random.default_rng(seed), n, variant))])


@pytest.mark.parametrize("name", SYNTH)
@pytest.mark.parametrize("small", [False, True])
def test_all_fixed_splits_pairwise_disjoint(name, small):
    params, eval_size = SMALL[name] if small else ({}, 150)
    t = build_task(name, eval_size=eval_size, **params)
    keys = {s: row_keys(t.split(s)) for s in t.split_names}
    if small:  # the generator alone repeats examples across splits: the exclusion is what the test checks
        variants = {t.split_variants[s] for s in t.split_names}
        assert any(raw_keys(t, 4 * eval_size, v, 0) & raw_keys(t, 4 * eval_size, v, 1) for v in variants)
    for a, b in itertools.combinations(t.split_names, 2):
        assert not (keys[a] & keys[b]), f"{name}: {a} overlaps {b}"
    assert all(sum(len(b) for b in t.split(s)) == eval_size for s in t.split_names)


@pytest.mark.parametrize("name", SYNTH)
def test_training_examples_exclude_every_evaluation_split(name):
    params, eval_size = SMALL[name]
    t = build_task(name, eval_size=eval_size, **params)
    held = set().union(*(row_keys(t.split(s)) for s in t.split_names))
    assert raw_keys(t, 500, "train") & held  # unfiltered, training would see evaluation examples
    drawn = row_keys([t.train_batch(64, gen(s)) for s in range(5)])
    assert drawn and not (drawn & held)
    pooled = build_task(name, eval_size=eval_size, train_size=30, **params)
    assert not (row_keys([collate(pooled.train_pool())]) & held)


@pytest.mark.parametrize("name", SYNTH)
def test_training_stream_unchanged_where_nothing_collides(name):
    # at the default sizes no training example equals an evaluation one, so the stream is the generator's own
    # (reproductions trained before the exclusion existed see the same data)
    t = build_task(name, eval_size=200)
    expected = collate(t._generate(rng_from_generator(gen(3)), 32, "train"))
    got = t.train_batch(32, gen(3))
    assert torch.equal(got.inputs, expected.inputs) and torch.equal(got.targets, expected.targets)


def test_dedupe_tops_up_and_reports_impossible():
    # length 6: a tiny example space, so validation and test would collide without dedupe
    t = build_task("flip-flop", length=6, eval_size=5)
    val, test = row_keys(t.split("validation")), t.split("test")
    assert sum(len(b) for b in test) == 5 and not (row_keys(test) & val)
    with pytest.raises(ValueError, match="too small"):
        build_task("flip-flop", length=4, eval_size=50).split("test")  # only 2 distinct sequences


def test_train_pool():
    t = build_task("counting", train_size=50, eval_size=100)
    pool = {e.tokens.tobytes() for e in t.train_pool()}
    assert len(t.train_pool()) == 50
    for s in t.split_names:
        assert not any(e.tokens.tobytes() in pool for e in t.examples(s))
    b = t.train_batch(40, gen(0))
    for inp, tgt in rows(b):
        seq = np.array(inp + [tgt[-1]], dtype=np.int64)
        assert seq.tobytes() in pool


# ------------------------------------------------------------------ metrics


def test_metrics_on_constructed_logits():
    t = build_task("selective-copy", n_tokens=4, n_blanks=4, eval_size=10)
    b = t.split("test")[0]
    V = len(t.vocab)
    perfect = torch.full((*b.inputs.shape, V), -10.0)
    tgt = b.targets.clamp(min=0)
    perfect.scatter_(2, tgt[..., None], 10.0)
    m = summarize(score_batch(perfect, b), "sequence")
    assert m["accuracy"] == 1.0 and m["token_accuracy"] == 1.0 and m["n_tokens"] == 40 and m["n_sequences"] == 10
    # break one copied token in row 0: that row fails, 39/40 tokens still right
    pos = int(b.target_mask[0].nonzero()[0])
    wrong = perfect.clone()
    wrong[0, pos] = -10.0
    wrong[0, pos, (tgt[0, pos] + 1) % V] = 10.0
    m = summarize(score_batch(wrong, b), "sequence")
    assert m["sequence_accuracy"] == 0.9 and m["token_accuracy"] == 39 / 40
    # uniform logits: loss ln V, perplexity V
    m = summarize(score_batch(torch.zeros(*b.inputs.shape, V), b))
    assert abs(m["perplexity"] - V) < 1e-3
    assert abs(float(lm_loss(torch.zeros(*b.inputs.shape, V), b)) - np.log(V)) < 1e-5
    # evaluate() drives a model over a split
    out = t.evaluate(lambda x: torch.zeros(*x.shape, V), "ood_dense")
    assert out["n_sequences"] == 10 and abs(out["loss"] - np.log(V)) < 1e-5


# ------------------------------------------------------------------ shakespeare


@pytest.fixture(scope="module")
def shakespeare():
    return build_task("shakespeare")


def test_shakespeare_data(shakespeare):
    s = shakespeare
    assert s.metric == "perplexity"
    assert 78 <= len(s.vocab) - 1 <= 86
    assert len(s.train_plays) == 36 and "macbeth" not in s.train_plays and "twelfth-night" not in s.train_plays
    assert 4_500_000 < len(s.train_text) < 5_200_000
    for line in ["When shall we three meet again", "If music be the food of love, play on;",
                 "Is this a dagger which I see before me"]:
        assert line in s.held_out_text and line not in s.train_text
    assert "Who's there?" in s.train_text  # Hamlet is training text
    # markup stripped
    for ch in "*_#\\":
        assert ch not in s.vocab
    assert "\nMACBETH\n" in s.held_out_text and "  \n" not in s.held_out_text
    # vocabulary is deterministic (sorted)
    assert s.vocab.tokens[1:] == sorted(s.vocab.tokens[1:])
    raw = build_task("shakespeare", strip_markdown=False)
    assert len(raw.vocab) - 1 == 84 and len(raw.train_text) == 5_087_665  # the earlier measurements' split


def test_shakespeare_windows(shakespeare):
    s = shakespeare
    assert len(s.region("test")) == 131_072
    test_text = s.held_out_text[:131_072]
    for L in (64, 128, 256, 512):
        batches = s.eval_windows(L, "test", batch_size=100)
        inputs = torch.cat([b.inputs for b in batches])
        targets = torch.cat([b.targets for b in batches])
        assert inputs.shape == ((131_072 - 1) // L, L)
        # non-overlapping, contiguous windows; targets are the next characters
        assert s.vocab.decode(inputs.flatten()) == test_text[: inputs.numel()]
        assert s.vocab.decode(targets.flatten()) == test_text[1 : inputs.numel() + 1]
    last = torch.cat([b.targets for b in s.eval_windows(512, "test", last_fraction=0.25)])
    assert (last[:, :384] == IGNORE_INDEX).all() and (last[:, 384:] != IGNORE_INDEX).all()
    few = s.eval_windows(64, "test", n_chars=1000)
    assert sum(len(b) for b in few) == 999 // 64
    # validation is the rest of the held-out text: disjoint from test
    val = torch.cat([b.inputs for b in s.split("validation")])
    assert s.vocab.decode(val[0]) == s.held_out_text[131_072 : 131_072 + 64]
    tb = s.train_batch(8, gen(0))
    assert tb.inputs.shape == (8, 64) and torch.equal(tb.inputs[:, 1:], tb.targets[:, :-1])
    for inp in tb.inputs:
        assert s.vocab.decode(inp) in s.train_text
    with pytest.raises(ValueError, match="no complete window"):
        s.eval_windows(200_000, "test")


# ------------------------------------------------------------------ counting: truncation, distinct split examples


def answer_of_window(words):
    """The printed value recomputed from a (possibly left-truncated) program: increments of the printed variable
    after its last visible set statement."""
    assert words[-2] == "print"
    var = words[-1]
    last_set = max(i for i in range(len(words) - 3) if words[i] == var and words[i + 1] == "=")
    return sum(1 for j in range(last_set, len(words) - 3) if words[j] == var and words[j + 1] == "++;")


def test_counting_max_tokens_trims_from_the_left_like_the_reference_pipeline():
    full = build_task("counting", preset="paper", max_tokens=None, eval_size=100, train_size=20)
    cut = build_task("counting", preset="paper", eval_size=100, train_size=20)
    assert cut.max_tokens == 512 and cut.max_input_len == 512 and full.max_input_len == 4 * 512 + 2
    longest = 0
    for s in cut.split_names:
        for a, b in zip(full.examples(s), cut.examples(s)):
            assert len(b.tokens) == min(len(a.tokens), 513)
            assert np.array_equal(b.tokens, a.tokens[-513:])  # the last 512 inputs and the answer
            longest = max(longest, len(a.tokens) - 1)
        for b in cut.split(s):
            assert b.inputs.shape[1] <= 512
            for inp, tgt in rows(b):
                assert tgt[-1] == cut.vocab.index[str(answer_of_window([cut.vocab.tokens[i] for i in inp]))]
    assert longest > 512  # the cap did trim something


def test_counting_ood_shorter_stays_within_the_training_lengths_with_the_paper_preset():
    t = build_task("counting", preset="paper", eval_size=300, train_size=2000)
    train_max = int(t.train_pool().lengths.max()) - 1
    shorter = max(len(e.tokens) - 1 for e in t.examples("ood_shorter"))
    assert shorter <= train_max == 512
    untrimmed = build_task("counting", preset="paper", max_tokens=None, eval_size=300, train_size=2000)
    assert max(len(e.tokens) - 1 for e in untrimmed.examples("ood_shorter")) > int(
        untrimmed.train_pool().lengths.max()) - 1  # without the cap the split is longer than any training program


@pytest.mark.parametrize("name, params", [("counting", dict(max_steps=16)), ("flip-flop", dict(length=12))])
def test_evaluation_splits_hold_no_example_twice(name, params):
    t = build_task(name, eval_size=40, **params)
    raw = [e.tokens.tobytes() for e in t._generate(np.random.default_rng(0), 400, "in")]
    assert len(set(raw)) < len(raw)  # the generator alone repeats examples
    for s in t.split_names:
        keys = [e.tokens.tobytes() for e in t.examples(s)]
        assert len(keys) == 40 and len(set(keys)) == 40, s


def test_counting_bad_max_tokens():
    with pytest.raises(ValueError, match=r"max_tokens must be an int >= 6, got 5"):
        build_task("counting", max_tokens=5)


@pytest.mark.parametrize("name", SYNTH + ["shakespeare"])
def test_params_list_the_constructor_arguments_and_rebuild_the_task(name):
    t = build_task(name)
    assert list(t.params) == [p for p in task_parameters(name)]
    listed = ", ".join(f"{k}={v!r}" for k, v in t.params.items())
    assert repr(type(t)(**t.params)) == repr(t) == f"{type(t).__name__}({listed})"
