"""Scoring passkey retrieval (poskit.evaluate.passkey): an oracle whose logits copy the key scores 100 %, a random
decoder about 0; the KV-cache path equals whole-sequence decoding; the grid's shape and JSON; the heat map."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_passkey import TinyText  # noqa: E402

from poskit.evaluate.passkey import passkey_grid, score_passkeys  # noqa: E402
from poskit.models import ModelConfig, Transformer  # noqa: E402
from poskit.report.passkey import plot_passkey  # noqa: E402
from poskit.tasks import build_task  # noqa: E402
from poskit.tasks.passkey import PasskeyGenerator  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class CopyOracle:
    """logits (B, T, V) built to copy the key: where the text since the key line ends with "\\npass key " and the
    key's first j digits, the (j+1)-th digit gets logit 30 (every other token 0).  ``wrong_third`` makes it
    answer a wrong third digit for keys whose first digit is odd, so that the text it then generates no longer
    matches and it predicts nothing useful for the remaining digits."""

    def __init__(self, vocab, wrong_third: bool = False):
        self.vocab, self.wrong_third = vocab, wrong_third
        self.prefix = vocab.encode("\npass key ")
        self.digits = vocab.encode("0123456789")

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        logits = torch.zeros(B, T, len(self.vocab))
        P = len(self.prefix)
        for b in range(B):
            row = tokens[b].tolist()
            first = next(s for s in range(T) if row[s: s + P] == self.prefix)
            key = row[first + P: first + P + 5]
            for t in range(first + P + 5, T):
                for j in range(5):
                    start = t + 1 - P - j
                    if start > first and row[start: t + 1] == self.prefix + key[:j]:
                        answer = key[j]
                        if self.wrong_third and j == 2 and self.digits.index(key[0]) % 2 == 1:
                            answer = self.digits[(self.digits.index(answer) + 1) % 10]
                        logits[b, t, answer] = 30.0
        return logits


@pytest.fixture(scope="module")
def tiny():
    return TinyText()


def random_decoder(task, encoding="rope", seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=len(task.vocab), d_model=32, n_layers=2, n_heads=2, encoding=encoding))


def test_oracle_scores_every_key(tiny):
    gen = PasskeyGenerator(tiny)
    prompts = [p for d in (0.0, 0.5, 1.0) for p in gen.prompts(70, d, 5, seed=0)]
    scores = score_passkeys(CopyOracle(tiny.vocab), prompts, tiny.decode, batch_size=4)
    assert [s["key"] for s in scores] == [p.key for p in prompts]
    for s in scores:
        assert s["exact"] and s["generated"] == s["key"] and s["digits_correct"] == 5 and s["digit_accuracy"] == 1.0
        # each digit: log(1 / (1 + (V - 1) e^-30))
        assert -5 * len(tiny.vocab) * math.exp(-30) * 1.01 < s["key_logprob"] <= 0


def test_greedy_mistakes_and_teacher_forcing_are_told_apart(tiny):
    gen = PasskeyGenerator(tiny)
    prompts = gen.prompts(60, 0.3, 40, seed=1)
    scores = score_passkeys(CopyOracle(tiny.vocab, wrong_third=True), prompts, tiny.decode)
    odd = [int(p.key[0]) % 2 == 1 for p in prompts]
    assert 5 < sum(odd) < 35
    for s, is_odd in zip(scores, odd):
        assert s["exact"] == (not is_odd)
        # a wrong third digit derails greedy decoding (digits 4 and 5 are lost too); under teacher forcing only the
        # third digit's probability is small
        assert s["digits_correct"] == (2 if is_odd else 5)
        assert (s["key_logprob"] < -29) == is_odd


# PoPE's cached decoding compiles its CPU kernel on first use (about 12 s of CPU): slow
@pytest.mark.parametrize("encoding", ["rope", "alibi", "cope", pytest.param("pope", marks=pytest.mark.slow)])
def test_kv_cache_decoding_equals_whole_sequence_decoding(tiny, encoding):
    model = random_decoder(tiny, encoding, seed=1)
    with torch.no_grad():
        for p in model.parameters():  # larger weights: varied, input-dependent greedy tokens
            p.mul_(4.0)
    gen = PasskeyGenerator(tiny)
    prompts = gen.prompts(50, 0.5, 6, seed=2) + gen.prompts(64, 0.0, 3, seed=2)  # two lengths: two groups
    cached = score_passkeys(model, prompts, tiny.decode, batch_size=4, use_cache=True)
    full = score_passkeys(model, prompts, tiny.decode, batch_size=4, use_cache=False)
    assert len({s["generated"] for s in cached}) > 1
    for a, b in zip(cached, full):
        assert a["generated"] == b["generated"] and a["exact"] == b["exact"]
        assert a["key_logprob"] == pytest.approx(b["key_logprob"], abs=1e-4)
    assert model.training  # the scorer restores the mode it found


def test_random_decoder_scores_about_zero(tiny):
    model = random_decoder(tiny).eval()
    result = passkey_grid(model, tiny, lengths=[40, 80], depths=[0.0, 0.5, 1.0], trials=8, seed=0)
    assert result["mean_accuracy"] == 0.0
    assert np.mean(result["digit_accuracy"]) < 0.2
    # near-uniform logits at initialisation: about log(1 / V) per key token
    assert np.allclose(np.array(result["key_logprob"]) / 5, -math.log(len(tiny.vocab)), atol=0.3)


def test_grid_shape_json_and_record(tiny):
    result = passkey_grid(CopyOracle(tiny.vocab), tiny, lengths=[40, 64], depths=[0, 0.5, 1.0], trials=3, seed=4,
                          record_trials=True, split="validation")
    assert result["lengths"] == [40, 64] and result["depths"] == [0.0, 0.5, 1.0] and result["trials"] == 3
    for key in ("accuracy", "digit_accuracy", "key_logprob"):
        assert np.array(result[key]).shape == (2, 3)
    assert result["accuracy"] == [[1.0] * 3] * 2 and result["mean_accuracy"] == 1.0
    assert [r["length"] for r in result["by_length"]] == [40, 64]
    assert [(c["length"], c["depth"]) for c in result["cells"]] == [(L, d) for L in (40, 64) for d in (0, 0.5, 1)]
    assert all(len(c["scores"]) == 3 for c in result["cells"])
    assert result["corpus"] == "corpus 'tiny-text'" and result["split"] == "validation"
    assert result["format"] == {"key_line": "\npass key {key}.\n", "question": "\npass key "}
    assert result["answer_in_length"] is True
    assert json.loads(json.dumps(result)) == result
    # the same prompts for every model: same seed, same keys
    again = passkey_grid(CopyOracle(tiny.vocab), tiny, lengths=[40, 64], depths=[0, 0.5, 1.0], trials=3, seed=4,
                         record_trials=True, split="validation")
    assert [s["key"] for c in again["cells"] for s in c["scores"]] == \
           [s["key"] for c in result["cells"] for s in c["scores"]]


def test_grid_refusals_name_the_argument(tiny):
    oracle = CopyOracle(tiny.vocab)
    for kwargs, match in [
        (dict(lengths=[31]), r"lengths must be at least 32 tokens of corpus 'tiny-text'.*\[31\]"),
        (dict(lengths=[27], answer_in_length=False), r"lengths must be at least 28 tokens.*\[27\]"),
        (dict(lengths=[]), "lengths must be a non-empty list"),
        (dict(lengths=[40, 40]), "lengths must not repeat"),
        (dict(depths=[1.5]), "depths must be"),
        (dict(depths="0.5"), "depths must be a non-empty list"),
        (dict(trials=0), "trials must be"),
        (dict(seed=-1), "seed must be"),
        (dict(split="train2"), "split must be one of"),
        (dict(use_cache=True), "use_cache=True needs a causal poskit decoder"),
    ]:
        args = dict(lengths=[40], depths=[0.5], trials=2, seed=0)
        args.update(kwargs)
        with pytest.raises(ValueError, match=match) as e:
            passkey_grid(oracle, tiny, **args)
        assert "\n" not in str(e.value)


def test_passkey_task_accuracy_is_greedy_exact_match(tiny):
    # the passkey task's sequence accuracy (teacher forcing) counts a window exactly when greedy decoding
    # reproduces its key: the oracle that derails on odd first digits scores the same fraction both ways
    task = build_task("passkey", context=48, eval_size=30, eval_batch_size=30)
    oracle = CopyOracle(task.vocab, wrong_third=True)
    metrics = task.evaluate(oracle, "test")
    batch = task.split("test")[0]
    keys = [task.decode(t[-5:]) for t in batch.targets]
    even = sum(int(k[0]) % 2 == 0 for k in keys) / 30
    assert 0 < even < 1 and metrics["accuracy"] == pytest.approx(even)
    assert task.evaluate(CopyOracle(task.vocab), "test")["accuracy"] == 1.0


def test_heat_map_png(tiny, tmp_path):
    result = passkey_grid(CopyOracle(tiny.vocab), tiny, lengths=[32, 48, 96], depths=[0, 0.5, 1], trials=1)
    result["accuracy"][2] = [0.0, 0.5, 0.25]
    path = plot_passkey(result, tmp_path / "passkey.png", context=48)
    assert path == tmp_path / "passkey.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_passkey(result, tmp_path / "digits.png", metric="digit_accuracy", title="digits")
    assert (tmp_path / "digits.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="metric must be"):
        plot_passkey(result, tmp_path / "x.png", metric="key_logprob")
    with pytest.raises(ValueError, match="result must be a passkey_grid result"):
        plot_passkey({"lengths": [1]}, tmp_path / "x.png")
