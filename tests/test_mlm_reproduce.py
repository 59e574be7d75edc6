"""`poskit reproduce mlm` end to end at a tiny size (the stdlib corpus, bytes tokenizer, two steps), and its
`--preset paper` settings, which are checked without training."""
from __future__ import annotations

import json
import math

import pytest

from poskit.experiments.registry import experiment
from extras import need

need("matplotlib", "experiments", "matplotlib (the reproduction writes plots)")

TINY = ["task=mlm",
        'task_options={"corpus": "code", "tokenizer": "bytes", "vocab_size": null, "max_documents": 3, "context": 16}',
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "batch_size=4", "eval_every=1", "log_every=1",
        "eval_batches=1", "final_eval_batches=1", "checkpoint_every=2"]


@pytest.mark.slow  # three training processes: 106 s measured on a heavily loaded 2-core machine
def test_reproduce_mlm_tiny_writes_results_curves_and_both_plots(tmp_path, monkeypatch, capsys):
    from poskit.cli import main

    monkeypatch.setenv("POSKIT_DATA", str(tmp_path / "poskit-data"))
    out = tmp_path / "mlm"
    assert main(["reproduce", "mlm", "--steps", "2", "--seeds", "0", "--workers", "2", "--out", str(out), "--quiet",
                 *TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["metric"] == "loss" and set(results["encodings"]) == {"learned", "rope", "pope"}
    for name, entry in results["encodings"].items():
        assert math.isfinite(entry["mean"]) and entry["mean"] > 0, name
        log = [json.loads(line) for line in (out / name / "seed0" / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in log if "train_loss" in m] == [1, 2]
        assert all(math.isfinite(m["loss"]) for m in log if "split" in m)
        config = json.loads((out / name / "seed0" / "config.json").read_text())
        assert config["model"]["causal"] is False and config["model"]["encoding"] == name
    for png in ("compare.png", "training_loss.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| learned |" in capsys.readouterr().out


def test_paper_preset_is_bert_base(tmp_path):
    from poskit.experiments.reproduce import preset_config, run_reproduction
    from poskit.training import TrainConfig

    paper = TrainConfig.from_dict(preset_config(experiment("mlm", "reproduction").settings, "paper"))
    assert (paper.model.d_model, paper.model.n_layers, paper.model.n_heads) == (768, 12, 12)
    assert (paper.batch_size, paper.max_steps, paper.lr, paper.task_options["context"]) == (64, 100_000, 1e-5, 512)
    assert paper.model.causal is False and paper.task_options["vocab_size"] is None
    with pytest.raises(ValueError, match="preset must be one of"):
        run_reproduction("mlm", preset="gpu", out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
