"""Passkey prompts (poskit.tasks.passkey): the key and its depth read back by a parser of the decoded text that
knows only the documented format, exact lengths, determinism, the filler's source, refusals; passkey windows mixed
into language-model training (off by default, with the plain windows unchanged) and the ``passkey`` task."""
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.tasks import IGNORE_INDEX, Vocab, build_task
from poskit.tasks.passkey import KEY_HIGH, KEY_LOW, PasskeyGenerator, check_passkey_fraction
from poskit.tasks.protocol import Described
from poskit.tasks.windows import WindowedLM
from poskit.training import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

# the documented format, written out here rather than imported, so that the parser is independent of the generator
KEY_LINE = re.compile(r"\npass key (\d{5})\.\n")
QUESTION = "\npass key "
KEY_LINE_CHARS = len("\npass key 12345.\n")


def parse(text: str) -> tuple[str, float, str]:
    """(key, depth, filler text) of a character-level prompt, from its text alone."""
    found = KEY_LINE.findall(text)
    assert len(found) == 1, text
    m = KEY_LINE.search(text)
    assert text.endswith(QUESTION)
    filler = text[: m.start()] + text[m.end(): -len(QUESTION)]
    assert len(filler) == len(text) - KEY_LINE_CHARS - len(QUESTION)
    return m.group(1), m.start() / len(filler), filler


@pytest.fixture(scope="module")
def plays():
    return build_task("shakespeare", context=64)


class TinyText(WindowedLM, Described):
    """A small character-level LM task over made-up words: fast, and its alphabet can leave characters out."""

    name = "tiny-text"
    metric = "perplexity"
    accuracy_level = "token"
    split_names = ("validation", "test")
    unit = "characters"

    def __init__(self, context: int = 48, digits: bool = True, passkey_fraction: float = 0.0) -> None:
        self.context, self.digits, self.eval_batch_size = context, digits, 8
        rng = np.random.default_rng(0)
        words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 8))) for _ in range(3000)]
        text = " ".join(words).replace("e ", "e.\n")
        alphabet = sorted(set(text) | set("pask y.\n") | (set("0123456789") if digits else set()))
        self.vocab = Vocab(alphabet)
        ids = torch.tensor(self.vocab.encode(text))
        self.text = text
        a, b = int(0.7 * len(ids)), int(0.8 * len(ids))  # about 11000, 1600 and 3200 characters
        self.train_ids, self._regions = ids[:a], {"validation": ids[a:b], "test": ids[b:]}
        self.passkey_fraction = check_passkey_fraction(self, passkey_fraction)

    def encode(self, text):
        return self.vocab.encode(text)

    def decode(self, ids):
        return self.vocab.decode(ids)


@pytest.fixture(scope="module")
def tiny():
    return TinyText()


# ------------------------------------------------------------------ the generator


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.77, 1.0])
def test_key_and_depth_read_back_from_the_decoded_text(plays, depth):
    gen = PasskeyGenerator(plays, "test")
    for p in gen.prompts(200, depth, trials=8, seed=3):
        text = plays.decode(p.tokens)
        key, parsed_depth, filler = parse(text)
        assert key == p.key and plays.decode(p.answer) == key
        assert abs(parsed_depth - depth) <= 0.5 / len(filler) + 1e-12
        # the filler is one contiguous passage of the held-out test text (never training text)
        assert filler in plays.held_out_text[: plays.test_chars]


_TINY = None


def tiny_text():
    global _TINY
    _TINY = _TINY or TinyText()  # built once: hypothesis calls the test many times
    return _TINY


@settings(max_examples=60, deadline=None)
@given(length=st.integers(32, 600), depth=st.floats(0.0, 1.0), seed=st.integers(0, 2**32),
       answer_in_length=st.booleans(), split=st.sampled_from(["train", "validation", "test"]))
def test_every_prompt_has_its_length_key_and_depth(length, depth, seed, answer_in_length, split):
    task = tiny_text()
    gen = PasskeyGenerator(task, split)
    (p,) = gen.prompts(length, depth, 1, seed, answer_in_length=answer_in_length)
    text = task.decode(p.tokens)
    assert len(p.tokens) == len(text) == (length - 4 if answer_in_length else length)
    key, parsed_depth, filler = parse(text)
    assert key == p.key and task.decode(p.answer) == key and 10000 <= int(key) <= 99999
    assert abs(parsed_depth - depth) <= 0.5 / len(filler) + 1e-12
    source = task.train_ids if split == "train" else task.region(split)
    assert filler in task.decode(source)


@pytest.mark.parametrize("length", [28, 29, 64, 101, 257, 1000])
def test_lengths_are_exact(plays, length):
    gen = PasskeyGenerator(plays, "validation")
    assert gen.min_length == 28  # 17 + 10 format characters and one of filler
    for depth in (0.0, 0.5, 1.0):
        p = gen.prompt(length, depth, np.random.default_rng(length))
        assert p.tokens.dtype == np.int64 and p.tokens.shape == (length,)
        assert len(plays.decode(p.tokens)) == length and p.filler == length - 27


def test_answer_in_length_counts_the_key_tokens_the_model_reads(tiny):
    gen = PasskeyGenerator(tiny)
    inside = gen.prompts(64, 0.5, 4, seed=0, answer_in_length=True)
    plain = gen.prompts(64, 0.5, 4, seed=0)
    assert [len(p.tokens) for p in plain] == [64] * 4
    # the prompt and the key but its last token: exactly a training window of context 64
    assert [len(p.tokens) + len(p.answer) - 1 for p in inside] == [64] * 4
    assert [p.key for p in inside] == [p.key for p in plain]
    with pytest.raises(ValueError, match="answer_in_length must be true or false"):
        gen.prompts(64, 0.5, 4, seed=0, answer_in_length=1)


def test_depth_ends_and_middle(tiny):
    gen = PasskeyGenerator(tiny)
    first, last = gen.prompt(60, 0.0, np.random.default_rng(0)), gen.prompt(60, 1.0, np.random.default_rng(0))
    assert tiny.decode(first.tokens).startswith("\npass key ") and first.key_start == 0
    assert tiny.decode(last.tokens).endswith(f"\npass key {last.key}.\n\npass key ") and last.key_start == last.filler
    # the same draws: the same key and filler, only the key line moved
    assert first.key == last.key and parse(tiny.decode(first.tokens))[2] == parse(tiny.decode(last.tokens))[2]


def test_prompts_are_deterministic_and_each_cell_has_its_own_stream(tiny):
    gen = PasskeyGenerator(tiny)
    a, b = gen.prompts(80, 0.5, 6, seed=1), gen.prompts(80, 0.5, 6, seed=1)
    assert all(np.array_equal(x.tokens, y.tokens) and x.key == y.key for x, y in zip(a, b))
    assert [p.key for p in gen.prompts(80, 0.5, 6, seed=2)] != [p.key for p in a]
    assert [p.key for p in gen.prompts(80, 0.5, 10, seed=1)[:6]] == [p.key for p in a]  # more trials: a prefix
    assert [p.key for p in gen.prompts(81, 0.5, 6, seed=1)] != [p.key for p in a]
    assert [p.key for p in gen.prompts(80, 0.25, 6, seed=1)] != [p.key for p in a]
    assert len({p.key for p in a}) == 6


def test_keys_are_uniform_five_digit_numbers(tiny):
    gen, rng = PasskeyGenerator(tiny), np.random.default_rng(0)
    keys = np.array([int(gen.draw_key(rng)) for _ in range(20000)])
    assert keys.min() >= KEY_LOW == 10000 and keys.max() <= KEY_HIGH == 99999
    leading, last = np.bincount(keys // 10000, minlength=10) / len(keys), np.bincount(keys % 10) / len(keys)
    assert leading[0] == 0 and np.abs(leading[1:] - 1 / 9).max() < 0.012, leading
    assert np.abs(last - 1 / 10).max() < 0.012, last


def test_byte_level_corpus_prompts(tmp_path, monkeypatch):
    monkeypatch.setenv("POSKIT_DATA", str(tmp_path))  # the stdlib slice's token cache goes here
    task = build_task("corpus", corpus="code", tokenizer="bytes", max_documents=8, context=64)
    gen = PasskeyGenerator(task, "validation")
    for length in (40, 333):
        p = gen.prompt(length, 0.4, np.random.default_rng(0))
        assert len(p.tokens) == length and p.answer.tolist() == [ord(c) + 1 for c in p.key]  # bytes: id = byte + 1
        key, depth, _ = parse(task.decode(p.tokens))  # byte-level text: one character per byte (ASCII source)
        assert key == p.key and abs(depth - 0.4) <= 0.5 / p.filler


# ------------------------------------------------------------------ refusals


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("depth", [-0.01, 1.01, float("nan"), "0.5"])
def test_depth_outside_0_1_is_refused(tiny, depth):
    with pytest.raises(ValueError, match=r"depth must be") as e:
        PasskeyGenerator(tiny).prompt(60, depth, np.random.default_rng(0))
    _one_line(e)


def test_length_too_short_for_the_format(tiny):
    gen = PasskeyGenerator(tiny)
    gen.prompt(28, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"length must be at least 28 tokens of corpus 'tiny-text'.*got 27") as e:
        gen.prompt(27, 0.5, np.random.default_rng(0))
    _one_line(e)
    with pytest.raises(ValueError, match=r"length=9000 needs 8973 filler tokens.*'test' text.*has only"):
        gen.prompt(9000, 0.5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="trials must be"):
        gen.prompts(60, 0.5, 0, seed=0)
    gen.prompts(32, 0.5, 1, seed=0, answer_in_length=True)
    with pytest.raises(ValueError, match=r"length must be at least 32 tokens.*got 31") as e:
        gen.prompts(31, 0.5, 1, seed=0, answer_in_length=True)
    _one_line(e)


def test_a_corpus_without_digits_is_refused_by_name():
    with pytest.raises(ValueError, match=r"needs '0', which the vocabulary of corpus 'tiny-text' cannot spell") as e:
        PasskeyGenerator(TinyText(digits=False))
    _one_line(e)
    with pytest.raises(ValueError, match=r"passkey_fraction"):
        TinyText(digits=False, passkey_fraction=0.1)
    TinyText(digits=False)  # without passkey windows the corpus needs no digits


def test_tasks_without_text_are_refused(tiny):
    with pytest.raises(ValueError, match=r"task 'flip-flop' has no text to draw passkey filler from"):
        PasskeyGenerator(build_task("flip-flop", eval_size=8))
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'validation', 'test'\], got 'dev'"):
        PasskeyGenerator(tiny, "dev")


# ------------------------------------------------------------------ passkey windows in LM training


def test_passkey_fraction_zero_draws_the_plain_windows(plays):
    g = torch.Generator().manual_seed(5)
    batch = plays.train_batch(16, g)
    after = torch.randint(0, 10**9, (1,), generator=g)
    # exactly the documented windows, and the generator advanced by the window starts alone
    g2 = torch.Generator().manual_seed(5)
    starts = torch.randint(0, len(plays.train_ids) - 64, (16,), generator=g2)
    seq = plays.train_ids[starts[:, None] + torch.arange(65)]
    assert torch.equal(batch.inputs, seq[:, :-1]) and torch.equal(batch.targets, seq[:, 1:])
    assert torch.equal(after, torch.randint(0, 10**9, (1,), generator=g2))
    explicit = build_task("shakespeare", context=64, passkey_fraction=0.0)
    again = explicit.train_batch(16, torch.Generator().manual_seed(5))
    assert torch.equal(again.inputs, batch.inputs) and explicit.params["passkey_fraction"] == 0.0


def test_passkey_windows_replace_a_fraction_of_the_training_windows(plays):
    mixed = build_task("shakespeare", context=64, passkey_fraction=0.25)
    plain = plays.train_batch(400, torch.Generator().manual_seed(9))
    batch = mixed.train_batch(400, torch.Generator().manual_seed(9))
    assert batch.inputs.shape == (400, 64) and torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    n_passkey = 0
    for row in range(400):
        text = mixed.decode(torch.cat((batch.inputs[row], batch.targets[row, -1:])))
        if KEY_LINE.search(text):
            n_passkey += 1
            key, _, filler = parse(text[:-5])  # the window is the prompt followed by its answer
            assert text.endswith(QUESTION + key) and filler in mixed.train_text
        else:  # the other windows are the plain ones
            assert torch.equal(batch.inputs[row], plain.inputs[row])
    assert 60 <= n_passkey <= 140  # Binomial(400, 0.25): mean 100, sd 8.7
    again = mixed.train_batch(400, torch.Generator().manual_seed(9))
    assert torch.equal(again.inputs, batch.inputs)


def test_passkey_fraction_is_validated(plays):
    for bad in (-0.1, 1.5, "0.1"):
        with pytest.raises(ValueError, match="passkey_fraction must be"):
            build_task("shakespeare", context=64, passkey_fraction=bad)
    with pytest.raises(ValueError, match=r"passkey_fraction=0.1 needs context >= 32 tokens of corpus 'shakespeare'"):
        build_task("shakespeare", context=31, passkey_fraction=0.1)
    build_task("shakespeare", context=32, passkey_fraction=0.1).train_batch(8, torch.Generator().manual_seed(0))


def test_train_with_passkey_fraction_task_option(tmp_path):
    cfg = TrainConfig.from_dict(dict(
        task="shakespeare", task_options={"context": 32, "passkey_fraction": 0.5},
        model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope"}, batch_size=4, max_steps=2,
        warmup_steps=1, eval_every=2, log_every=1, checkpoint_every=2, eval_batches=1, final_eval_batches=1))
    results = train(cfg, tmp_path / "run", quiet=True)
    assert results["steps"] == 2


# ------------------------------------------------------------------ the passkey task


@pytest.fixture(scope="module")
def passkey_task():
    return build_task("passkey", context=48, eval_size=24, eval_batch_size=10)


def test_passkey_task_windows_and_targets(passkey_task):
    t = passkey_task
    batch = t.train_batch(12, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == batch.targets.shape == (12, 48)
    assert (batch.targets[:, :-5] == IGNORE_INDEX).all() and (batch.targets[:, -5:] != IGNORE_INDEX).all()
    for row in range(12):
        text = t.decode(batch.inputs[row])
        key = t.decode(batch.targets[row, -5:])
        assert text.endswith(QUESTION + key[:4]) and KEY_LINE.search(text).group(1) == key
    assert torch.equal(t.train_batch(12, torch.Generator().manual_seed(0)).inputs, batch.inputs)
    test, val = t.split("test"), t.split("validation")
    assert [len(b) for b in test] == [10, 10, 4] and t.max_input_len == 48
    assert torch.equal(test[0].inputs, t.split("test")[0].inputs)
    assert not torch.equal(test[0].inputs, val[0].inputs)
    held_out = t.lm.held_out_text[: t.lm.test_chars]
    for row in test[0].inputs:
        assert parse(t.decode(row)[:-4])[2] in held_out


def test_passkey_task_params_rebuild_and_refusals(passkey_task):
    t = passkey_task
    assert type(t)(**t.params).params == t.params and repr(t).startswith("PasskeyTask(base='shakespeare'")
    with pytest.raises(ValueError, match="base must be the name of a language-modelling task"):
        build_task("passkey", base="flip-flop")
    with pytest.raises(ValueError, match="tokenizer must be None"):
        build_task("passkey", tokenizer="bytes")  # shakespeare has its own characters
    with pytest.raises(ValueError, match=r"task 'passkey' needs context >= 32"):
        build_task("passkey", context=20)
    with pytest.raises(ValueError, match="split must be one of"):
        t.split("train")


def test_a_corpus_that_is_not_text_is_refused_by_name():
    from types import SimpleNamespace

    from poskit.data.tokenizers import build_tokenizer
    from poskit.tasks import CorpusLM

    genome = CorpusLM.__new__(CorpusLM)  # the genome corpus itself is an optional download: only its tokenizer
    genome.corpus, genome.data = "genome", SimpleNamespace(tokenizer=build_tokenizer("dna6"))
    genome.train_ids, genome._regions = torch.ones(100, dtype=torch.long), {"test": torch.ones(50, dtype=torch.long)}
    with pytest.raises(ValueError, match=r"vocabulary of corpus 'genome' \(tokenizer 'dna6'\) cannot spell .*"
                                         r"reads dna documents, not text") as e:
        PasskeyGenerator(genome)
    _one_line(e)
