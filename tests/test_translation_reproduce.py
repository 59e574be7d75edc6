"""`poskit reproduce translation` at a tiny size (files written, numbers finite, plot present), exact resume
of a translation run, the configuration's errors and the CLI's."""
from __future__ import annotations

import json
import math
import os

import pytest

from poskit.data.sources import trans
from poskit.data.sources.base import CorpusNotPresent
from poskit.training.recipes.seq2seq import Seq2SeqConfig
from extras import need


def _real_corpus():
    try:
        return trans.locate()
    except CorpusNotPresent:
        return None


REAL = _real_corpus()
needs_corpus = pytest.mark.skipif(REAL is None, reason="the trans-de-en corpus is absent: poskit data fetch translation "
                                                       "(or apt-get install trans-de-en)")
TINY = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "vocab_size=400", "limit=300", "test_limit=8", "eval_every=2",
        "checkpoint_every=2", "log_every=1", "warmup=2", "beam_size=2", "batch_tokens=300"]


@pytest.fixture
def corpus_home(tmp_path, monkeypatch):
    need("tokenizers", "data", "tokenizers (the translation BPE)")
    need("sacrebleu", "data", "sacrebleu (BLEU and chrF)")
    need("matplotlib", "experiments", "matplotlib (the convergence plot)")
    home = tmp_path / "poskit-data"
    (home / "fetched/translation/files/share").mkdir(parents=True)
    os.symlink(REAL, home / "fetched/translation/files/share/de-en")
    monkeypatch.setenv("POSKIT_DATA", str(home))
    monkeypatch.setenv("POSKIT_FUSED_DECODE", "0")  # no minute-long compile of PoPE's decode kernel here
    return home


@pytest.mark.slow
@needs_corpus
def test_tiny_reproduction_writes_its_table_plot_and_finite_numbers(corpus_home, tmp_path, capsys):
    from poskit.cli import main

    out = tmp_path / "repro"
    assert main(["reproduce", "translation", "--out", str(out), "--encodings", "sinusoidal,rope", "--seeds", "0,1",
                 "--steps", "4", "--workers", "1", "--quiet", *TINY]) == 0
    report = json.loads((out / "results.json").read_text())
    assert set(report["encodings"]) == {"sinusoidal", "rope"}
    for enc, e in report["encodings"].items():
        assert e["seeds"] == [0, 1] and e["steps"] == 4
        for key in ("bleu", "chrf", "test_nll", "validation_nll"):
            assert all(math.isfinite(v) for v in e[key]["per_seed"]) and len(e[key]["per_seed"]) == 2
        assert (out / f"{enc}-seed0" / "test.hyp.txt").read_text().count("\n") == 8
    assert (out / "convergence.png").stat().st_size > 1000
    assert "| rope | 2 |" in (out / "results.md").read_text() and "| rope | 2 |" in capsys.readouterr().out
    # results.json is the reproduction's results record (report/record.py), per seed, with the papers' numbers
    from poskit.report.record import absolute_paths, read_record

    record = read_record(out / "results.json")
    assert (record.kind, record.name, record.measurements["metric"]) == ("reproduction", "translation", "bleu")
    runs = record.measurements["groups"][""]["rope"]
    assert [r["run"] for r in runs] == ["rope-seed0", "rope-seed1"]
    assert [r["splits"]["test"]["bleu"] for r in runs] == report["encodings"]["rope"]["bleu"]["per_seed"]
    assert record.paper["numbers"][0]["rows"]["rope"] == [27.5] and record.arguments["steps"] == 4
    assert record.resolved["base"]["max_steps"] == 4 and "encoding" not in record.resolved["base"]["model"]
    assert absolute_paths(record.to_dict()) == []


def _interrupt_after_second_checkpoint(cfg, run_dir, monkeypatch):
    """Train `cfg` in `run_dir` until just after its second checkpoint is written, then 'kill' it."""
    from poskit.training.loop import Trainer
    from poskit.training.recipes import seq2seq

    saves = {"n": 0}
    real_save = Trainer.save_checkpoint

    def save_then_die(self):
        real_save(self)
        saves["n"] += 1
        if saves["n"] == 2:  # killed right after the step-4 checkpoint
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        seq2seq.train_seq2seq(cfg, run_dir, quiet=True)
    monkeypatch.setattr(Trainer, "save_checkpoint", real_save)


def _assert_same_run(resumed_dir, straight_dir, resumed, straight):
    """Same results, the same logged losses and validation NLLs, bit-identical final weights."""
    import torch

    from poskit.training.recipes.seq2seq import read_seq2seq_checkpoint

    for key in ("bleu", "chrf", "test_nll", "validation_nll", "steps"):
        assert resumed[key] == straight[key], key

    def logged(run):  # every record but its wall-clock field
        return [{k: v for k, v in json.loads(x).items() if k != "elapsed"}
                for x in (run / "metrics.jsonl").read_text().splitlines()]

    assert logged(resumed_dir) == logged(straight_dir)
    assert [r["step"] for r in logged(resumed_dir) if "train_loss" in r] == list(range(1, 7))
    a, b = read_seq2seq_checkpoint(resumed_dir)[0]["model"], read_seq2seq_checkpoint(straight_dir)[0]["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@needs_corpus
def test_an_interrupted_run_resumes_to_the_numbers_of_an_uninterrupted_one(corpus_home, tmp_path, monkeypatch):
    from poskit.experiments.overrides import apply_overrides
    from poskit.training.recipes import seq2seq

    cfg = {"model": {"encoding": "rope", "dropout": 0.1}, "max_steps": 6}
    cfg = Seq2SeqConfig.from_dict(apply_overrides(cfg, TINY))
    straight = seq2seq.train_seq2seq(cfg, tmp_path / "straight", quiet=True)
    assert (tmp_path / "straight" / "checkpoint.json").exists() and not (tmp_path / "straight" / "checkpoint.pt").exists()

    _interrupt_after_second_checkpoint(cfg, tmp_path / "resumed", monkeypatch)
    resumed = seq2seq.train_seq2seq(cfg, tmp_path / "resumed", quiet=True)
    _assert_same_run(tmp_path / "resumed", tmp_path / "straight", resumed, straight)
    # a finished 4-step run extended to 6 steps ends where the 6-step run did (the schedule ignores max_steps)
    short = Seq2SeqConfig.from_dict({**cfg.to_dict(), "max_steps": 4})
    seq2seq.train_seq2seq(short, tmp_path / "extended", quiet=True)
    extended = seq2seq.train_seq2seq(cfg, tmp_path / "extended", quiet=True)
    assert extended["test_nll"] == straight["test_nll"] and extended["steps"] == 6
    with pytest.raises(ValueError, match=r"where lr is .*; got 0.01"):
        seq2seq.train_seq2seq(Seq2SeqConfig.from_dict({**cfg.to_dict(), "lr": 1e-2}), tmp_path / "extended")


@pytest.mark.slow
@needs_corpus
@pytest.mark.parametrize("convert_first", [False, True])
def test_a_legacy_checkpoint_pt_run_resumes_exactly(corpus_home, tmp_path, monkeypatch, convert_first):
    """A run interrupted under the old single-file checkpoint.pt resumes (or is converted, then resumes) to
    the numbers and weights of an uninterrupted run; its next checkpoint is in the current format."""
    from poskit.cli import main
    from poskit.experiments.overrides import apply_overrides
    from poskit.training.recipes import seq2seq
    from seq2seq_checkpoint_helpers import to_legacy

    cfg = {"model": {"encoding": "rope", "dropout": 0.1}, "max_steps": 6}
    cfg = Seq2SeqConfig.from_dict(apply_overrides(cfg, TINY))
    straight = seq2seq.train_seq2seq(cfg, tmp_path / "straight", quiet=True)
    run = tmp_path / "legacy"
    _interrupt_after_second_checkpoint(cfg, run, monkeypatch)
    to_legacy(run)
    if convert_first:
        assert main(["convert-checkpoint", "--quiet", str(run)]) == 0
        assert not (run / "checkpoint.pt").exists()
    resumed = seq2seq.train_seq2seq(cfg, run, quiet=True)
    assert not (run / "checkpoint.pt").exists() and len(list((run / "checkpoints").iterdir())) == 1
    _assert_same_run(run, tmp_path / "straight", resumed, straight)


@pytest.mark.slow
@needs_corpus
def test_bleu_every_logs_a_validation_bleu_curve_and_plots_it(corpus_home, tmp_path):
    """bleu_every=N: validation BLEU and chrF at every N steps and at the end, in each run's metrics, the
    results (bleu_curves) and bleu_curve.png: the learning curve that says where BLEU plateaus."""
    from poskit.cli import main
    from poskit.report.record import read_record

    out = tmp_path / "curve"
    assert main(["reproduce", "translation", "--out", str(out), "--encodings", "sinusoidal", "--seeds", "0",
                 "--steps", "5", "--workers", "1", "--quiet", *TINY, "bleu_every=2", "bleu_pairs=6"]) == 0
    logged = [json.loads(line) for line in (out / "sinusoidal-seed0" / "metrics.jsonl").read_text().splitlines()]
    points = [r for r in logged if r.get("split") == "validation" and "bleu" in r]
    assert [r["step"] for r in points] == [2, 4, 5]  # every 2 steps, and the last
    assert all(math.isfinite(r["bleu"]) and math.isfinite(r["chrf"]) for r in points)
    record = read_record(out / "results.json")
    curve = record.details["bleu_curves"]["sinusoidal seed 0"]
    assert curve["steps"] == [2, 4, 5] and curve["bleu"] == [r["bleu"] for r in points]
    assert (out / "bleu_curve.png").stat().st_size > 1000 and "bleu_curve.png" in record.files


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"bleu_every must be a multiple of eval_every \(500\) or null"):
        Seq2SeqConfig(bleu_every=250)
    with pytest.raises(ValueError, match="bleu_pairs"):
        Seq2SeqConfig(bleu_every=500, bleu_pairs=0)
    with pytest.raises(ValueError, match="direction"):
        Seq2SeqConfig(direction="fr-en")
    with pytest.raises(ValueError, match="model.src_vocab_size"):
        Seq2SeqConfig(model={"src_vocab_size": 5})
    with pytest.raises(ValueError, match="model.cross_attention_positions"):
        Seq2SeqConfig(model={"encoding": "learned", "cross_attention_positions": "aligned"})
    with pytest.raises(ValueError, match="unknown"):
        Seq2SeqConfig.from_dict({"max_step": 3})


def test_cli_refuses_a_bad_preset_and_variants(capsys):
    from poskit.cli import main

    for argv, message in ((["reproduce", "translation", "--preset", "huge"], "invalid choice: 'huge'"),
                          (["reproduce", "translation", "--variants", "1"], "--variants does not apply")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    assert main(["list"]) == 0
    assert "translation" in capsys.readouterr().out


def test_paper_preset_is_the_transformer_base():
    from poskit.experiments.translation import plan_translation

    plan = plan_translation(preset="paper", encodings=["rope"], seeds=[0])
    m = plan[0][2].model_config()
    assert (m.d_model, m.n_heads, m.d_ff, m.n_encoder_layers, m.n_decoder_layers) == (512, 8, 2048, 6, 6)
    assert plan[0][2].beam_size == 4 and plan[0][2].length_penalty == 0.6 and plan[0][2].label_smoothing == 0.1


def test_encodings_are_specs_and_a_plain_name_keeps_the_saved_model_config():
    """A plain name adds no encoding_options to the model config (so existing runs still resume); a spec's
    options reach it, and the runs are labelled by the spec."""
    from poskit.experiments.translation import plan_translation

    plain = plan_translation(encodings=["rope"], seeds=[0])[0][2].to_dict()["model"]
    assert plain["encoding"] == "rope" and "encoding_options" not in plain
    label, _, cfg = plan_translation(encodings=["pope:delta_init=uniform"], seeds=[0])[0]
    assert label == "pope:delta_init=uniform"
    assert cfg.to_dict()["model"]["encoding_options"] == {"delta_init": "uniform"}
    assert cfg.model_config().encoding_options == {"delta_init": "uniform"}


def test_a_missing_sacrebleu_is_reported_before_any_training(monkeypatch, tmp_path, capsys):
    import sys

    from poskit.cli import main

    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import sacrebleu now fails
    with pytest.raises(SystemExit):
        main(["reproduce", "translation", "--out", str(tmp_path / "out")])
    assert "need sacrebleu" in capsys.readouterr().err and not (tmp_path / "out").exists()
