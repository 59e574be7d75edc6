"""`poskit reproduce performer`: its config trains linear attention, --preset paper applies the paper's sizes,
and a tiny end-to-end run (skipped when the offline wiki corpus is not on this machine)."""
import copy
import json

import pytest

from poskit.experiments.registry import experiment
from poskit.experiments.reproduce import preset_config
from poskit.training import TrainConfig


def test_performer_is_registered_with_linear_attention():
    r = experiment("performer", "reproduction").settings
    cfg = TrainConfig.from_dict(copy.deepcopy(r.config))
    assert cfg.model.attention == "linear"
    assert cfg.task_options["tokenizer"] == "bytes"  # character level
    assert {"learned", "rope"} <= set(r.encodings.split(","))  # Fig. 2 right: the paper's baseline and RoPE


def test_paper_preset_is_the_papers_setup():
    r = experiment("performer", "reproduction").settings
    cfg = TrainConfig.from_dict(preset_config(r, "paper"))
    # RoFormer section 4.4: 12 layers, 768 wide, 12 heads, lr 1e-4, batch 128, sequence length 1024
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads) == (12, 768, 12)
    assert (cfg.lr, cfg.batch_size, cfg.task_options["context"]) == (1e-4, 128, 1024)


def test_preset_must_be_known():
    from poskit.experiments.reproduce import run_reproduction

    with pytest.raises(ValueError, match="preset must be one of"):
        run_reproduction("performer", preset="gpu", out_dir="/nonexistent/never-written")


@pytest.mark.slow
def test_tiny_performer_run(tmp_path):
    from poskit.data import CorpusNotPresent, get_corpus
    from poskit.experiments.reproduce import run_reproduction

    try:
        get_corpus("wiki").source.locate()
    except CorpusNotPresent as e:
        pytest.skip(str(e))
    out = tmp_path / "perf"
    results = run_reproduction(
        "performer", out_dir=out, seeds=[0], steps=3, workers=1, quiet=True,
        overrides=["task_options.context=16", "model.d_model=16", "model.n_heads=2", "model.n_layers=1",
                   "batch_size=2", "eval_every=3", "eval_batches=1", "final_eval_batches=1"])
    assert set(results["encodings"]) == {"none", "learned", "rope", "pope"}  # learned: the paper's baseline
    saved = json.loads((out / "rope" / "seed0" / "config.json").read_text())
    assert saved["model"]["attention"] == "linear"
    assert (out / "compare.png").exists()
