"""GLUE fine-tuning of an MLM run (`poskit finetune-glue`) on tiny datasets written by `datasets` itself (no
network, no mock); the GLUE metrics against scipy and their definitions."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from poskit.tasks.glue import GLUE_TASKS, glue_metrics
from extras import need

datasets = need("datasets", "data", "datasets (GLUE is read with it)")


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    """A two-step MLM run on the stdlib corpus with the bytes tokenizer (no other extra needed)."""
    from poskit.training import TrainConfig, train

    root = tmp_path_factory.mktemp("glue")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSKIT_DATA", str(root / "poskit-data"))
        cfg = TrainConfig.from_dict({
            "task": "mlm", "task_options": {"corpus": "code", "tokenizer": "bytes", "vocab_size": None,
                                            "max_documents": 3, "context": 16},
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "causal": False, "encoding": "rope"},
            "batch_size": 4, "max_steps": 2, "eval_batches": 1, "final_eval_batches": 1, "eval_every": 2,
            "warmup_steps": 0})
        train(cfg, root / "run", quiet=True)
        yield root / "run"


def _save(path, columns: dict, n_train: int = 24, n_eval: int = 8, eval_split: str = "validation"):
    rng = np.random.default_rng(0)

    def part(n):
        labels = rng.integers(0, 2, n)
        rows = {c: [f"{'good' if y else 'bad'} {c} {i}" for i, y in enumerate(labels)] for c in columns}
        return datasets.Dataset.from_dict({**rows, "label": labels.tolist()})

    datasets.DatasetDict({"train": part(n_train), eval_split: part(n_eval)}).save_to_disk(str(path))
    return path


def test_finetune_sst2_writes_per_epoch_metrics_from_a_saved_dataset(mlm_run, tmp_path, capsys):
    from poskit.cli import main

    data = _save(tmp_path / "sst2", {"sentence": None})
    out = tmp_path / "ft"
    assert main(["finetune-glue", str(mlm_run), "--task", "sst2", "--data", f"hf:{data}", "--epochs", "2",
                 "--batch-size", "8", "--max-length", "12", "--out", str(out), "--quiet"]) == 0
    results = json.loads((out / "finetune.json").read_text())
    assert [e["epoch"] for e in results["epochs"]] == [1, 2]
    assert all(math.isfinite(e["train_loss"]) and 0.0 <= e["accuracy"] <= 1.0 for e in results["epochs"])
    assert results["train_examples"] == 24 and results["eval_examples"] == 8
    assert results["truncated"]["train"] > 0  # "good sentence 12" is longer than 12 bytes: cut, and counted
    assert "sst2 (rope), validation after 2 epochs: train_loss" in capsys.readouterr().out


def test_sentence_pairs_are_joined_by_the_separator_and_scored_with_f1(mlm_run, tmp_path):
    from poskit.experiments.finetune import finetune_glue

    data = _save(tmp_path / "mrpc", {"sentence1": None, "sentence2": None})
    results = finetune_glue(mlm_run, "mrpc", data=str(data), out_dir=tmp_path / "ft", epochs=1, batch_size=8,
                            max_length=64, quiet=True)
    assert results["metric"] == "f1" and 0.0 <= results["final"]["f1"] <= 1.0
    assert results["truncated"] == {"train": 0, "validation": 0}


def test_the_classifier_starts_from_the_pretrained_encoder(mlm_run):
    from poskit.experiments.finetune import SequenceClassifier
    from poskit.training import load_run

    model, task, _ = load_run(mlm_run)
    clf = SequenceClassifier(model, 3).eval()
    tokens = torch.from_numpy(task.encode_text("def f(x): return x")).unsqueeze(0)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        hidden = model.features(tokens)
        assert torch.allclose(model.head(hidden), model(tokens))  # features are what the MLM head read
        want = clf.classifier(hidden.mean(1))
        assert torch.allclose(clf(tokens, mask), want, atol=1e-6)
        padded = torch.cat([tokens, torch.zeros(1, 5, dtype=torch.long)], 1)
        pmask = torch.cat([mask, torch.zeros(1, 5, dtype=torch.bool)], 1)
        assert torch.allclose(clf(padded, pmask), want, atol=1e-5)  # padding changes nothing


def test_bad_glue_data_names_the_source_and_what_is_missing(mlm_run, tmp_path):
    from poskit.experiments.finetune import finetune_glue

    data = _save(tmp_path / "wrong", {"text": None})
    with pytest.raises(ValueError, match=r"lacks the columns \['sentence'\] of GLUE 'sst2'"):
        finetune_glue(mlm_run, "sst2", data=str(data), out_dir=tmp_path / "o1", quiet=True)
    with pytest.raises(ValueError, match="is not a directory written by DatasetDict.save_to_disk"):
        finetune_glue(mlm_run, "sst2", data=str(tmp_path / "missing"), out_dir=tmp_path / "o2", quiet=True)
    with pytest.raises(ValueError, match="has no 'validation_matched' split"):
        finetune_glue(mlm_run, "mnli", data=str(_save(tmp_path / "m", {"premise": None, "hypothesis": None})),
                      out_dir=tmp_path / "o3", quiet=True)
    with pytest.raises(ValueError, match="epochs must be an int >= 1"):
        finetune_glue(mlm_run, "sst2", data=str(data), epochs=0, quiet=True)
    with pytest.raises(ValueError, match="task must be one of"):
        finetune_glue(mlm_run, "squad", data=str(data), quiet=True)
    assert not (tmp_path / "o1").exists() and not (mlm_run / "glue-sst2").exists()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=4, max_size=60))
def test_classification_metrics_follow_their_definitions(pairs):
    pred, gold = (np.array(x) for x in zip(*pairs))
    m = glue_metrics(GLUE_TASKS["cola"], pred, gold)
    assert m["accuracy"] == pytest.approx(np.mean(pred == gold))
    # Matthews' coefficient is Pearson's correlation of the two binary vectors (0 where one is constant)
    want = 0.0 if pred.std() == 0 or gold.std() == 0 else np.corrcoef(pred, gold)[0, 1]
    assert m["matthews"] == pytest.approx(want, abs=1e-12)
    f1 = glue_metrics(GLUE_TASKS["mrpc"], pred, gold)["f1"]
    tp = np.sum((pred == 1) & (gold == 1))
    precision = tp / max(1, np.sum(pred == 1))
    recall = tp / max(1, np.sum(gold == 1))
    assert f1 == pytest.approx(0.0 if tp == 0 else 2 * precision * recall / (precision + recall))


def test_stsb_correlations_equal_scipy():
    stats = need("scipy.stats", "test", "scipy (the reference)")
    rng = np.random.default_rng(1)
    gold = np.round(rng.uniform(0, 5, 200), 1)  # ties, as STS-B's scores have
    pred = gold + rng.normal(0, 1, 200)
    pred[:20] = np.round(pred[:20])
    m = glue_metrics(GLUE_TASKS["stsb"], pred, gold)
    assert m["spearman"] == pytest.approx(stats.spearmanr(pred, gold).statistic, abs=1e-12)
    assert m["pearson"] == pytest.approx(stats.pearsonr(pred, gold).statistic, abs=1e-12)


_DATA_HOME = os.environ.get("POSKIT_DATA")  # the machine's corpora (mlm_run points POSKIT_DATA elsewhere)


def _wiki_or_skip(monkeypatch):
    from poskit.data import CorpusNotPresent, get_corpus

    if _DATA_HOME is None:
        monkeypatch.delenv("POSKIT_DATA", raising=False)
    else:
        monkeypatch.setenv("POSKIT_DATA", _DATA_HOME)
    try:
        get_corpus("wiki").source.locate()
    except CorpusNotPresent as e:
        pytest.skip(str(e))


def test_the_word_order_stand_in_differs_only_in_word_order_and_keeps_the_corpus_split(monkeypatch):
    """Checked against the corpus text by an independent route: every label-1 sentence is a sentence of its
    split's documents, every label-0 one a different order of such a sentence's words; the two splits share no
    sentence; both labels look alike at the edges (no final stop, no capital first letter)."""
    _wiki_or_skip(monkeypatch)
    from collections import Counter

    from poskit.tasks.word_order import word_order_dataset, word_order_sentences

    data = word_order_dataset(seed=3)
    again = word_order_dataset(seed=3)
    assert data["train"]["sentence"] == again["train"]["sentence"]  # deterministic for a seed
    for split, source in (("train", "validation"), ("validation", "test")):
        originals = [" ".join(s.split()).rstrip(".!?") for s in word_order_sentences(source)]
        by_words = {}
        for o in originals:
            by_words.setdefault(tuple(sorted(o.lower().split())), []).append(o.lower())
        rows = data[split]
        labels = Counter(rows["label"])
        assert labels[0] > len(rows) // 4 and labels[1] > len(rows) // 4  # both labels, drawn at random
        for sentence, label in zip(rows["sentence"], rows["label"]):
            assert not sentence.endswith((".", "!", "?")) and not sentence[:1].isupper()
            same_words = by_words[tuple(sorted(sentence.lower().split()))]
            if label == 1:
                assert sentence.lower() in same_words
            else:
                assert sentence.lower() not in same_words
    assert not set(data["train"]["sentence"]) & set(data["validation"]["sentence"])


def test_finetune_runs_end_to_end_on_the_offline_word_order_task(mlm_run, tmp_path, monkeypatch):
    _wiki_or_skip(monkeypatch)
    from poskit.experiments.finetune import finetune_glue

    results = finetune_glue(mlm_run, "cola", data="word-order", out_dir=tmp_path / "ft", epochs=1, batch_size=8,
                            max_length=24, max_train_examples=16, quiet=True)
    assert results["train_examples"] == 16 and results["eval_examples"] > 500
    assert all(math.isfinite(v) for k, v in results["final"].items() if k != "epoch")
    with pytest.raises(ValueError, match="data 'word-order' is a single-sentence acceptability task in CoLA's "
                                         "format: use it with --task cola, not 'sst2'"):
        finetune_glue(mlm_run, "sst2", data="word-order", out_dir=tmp_path / "no", quiet=True)
    assert not (tmp_path / "no").exists()
