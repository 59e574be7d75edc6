"""The field's other encodings (xpos, t5, fire, kerple-log, kerple-power, dynamic, mrope) and scheduled models
(irope, ModelConfig.layer_encodings) in `poskit compare`, `poskit extrapolate` and the HF bridge, on tiny runs, and
the text-extrapolation reproduction's rows."""
import json
from pathlib import Path

import pytest
import torch

from poskit.cli import main
from poskit.encodings.spec import EncodingSpec

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = "xpos,t5,fire,kerple-log,kerple-power,dynamic,mrope,irope:nope_every=2"
TINY = ["model.d_model=16", "model.n_layers=2", "model.n_heads=2", "eval_every=2", "log_every=1",
        "checkpoint_every=2", "warmup_steps=1", "task_options.context=16", "final_eval_batches=1", "eval_batches=1",
        "batch_size=4"]


def test_compare_extrapolate_and_export_the_new_encodings(tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", "--task", "shakespeare", "--encodings", NEW, "--seeds", "0", "--steps", "2",
                 "--out", str(out), "--workers", "1", "--quiet", *TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    labels = [s.label for s in EncodingSpec.parse_list(NEW)]
    assert sorted(results["encodings"]) == sorted(labels)
    assert all(e["mean"] > 1 for e in results["encodings"].values())  # perplexities of trained models
    runs = [str(out / d) for ds in results["runs"].values() for d in ds]  # recorded relative to the output folder
    irope_run = out / results["runs"]["irope:nope_every=2"][0]
    cfg = json.loads((Path(irope_run) / "config.json").read_text())
    assert cfg["model"]["encoding"] == "irope" and cfg["model"]["layer_encodings"] is None

    assert main(["extrapolate", *runs, "--lengths", "1x,2x", "--n-chars", "256", "--workers", "1",
                 "--out", str(tmp_path / "ex"), "--quiet"]) == 0
    report = json.loads((tmp_path / "ex" / "extrapolation.json").read_text())
    assert sorted(report["sweeps"]) == sorted(e.split(":")[0] for e in NEW.split(","))
    assert all(row["perplexity"] > 1 for rows in report["sweeps"].values() for row in rows)

    # the trained irope run in the HF bridge: its layers (rope, none) and logits as poskit's
    from extras import need

    need("transformers", "hf", "transformers (poskit.hf needs it)")
    from poskit.hf import from_poskit
    from poskit.training import load_run

    model, _, _ = load_run(irope_run)
    hf = from_poskit(model.eval())
    assert [e.name for e in hf.model.encoding_modules()] == ["irope", "none"]
    ids = torch.randint(0, model.config.vocab_size, (1, 12))
    assert torch.equal(hf(ids).logits, model(ids))


def test_compare_takes_a_layer_schedule_for_every_run(tmp_path):
    out = tmp_path / "sched"
    assert main(["compare", "--task", "shakespeare", "--encodings", "rope,alibi", "--seeds", "0", "--steps", "2",
                 "--out", str(out), "--workers", "1", "--quiet", *TINY, 'model.layer_encodings=["*","none"]']) == 0
    for label in ("rope", "alibi"):
        cfg = json.loads((out / label / "seed0" / "config.json").read_text())
        assert cfg["model"]["layer_encodings"] == ["*", "none"]


def test_text_extrapolation_has_the_new_rows():
    from poskit.experiments.registry import experiment
    from poskit.models import ModelConfig, Transformer

    r = experiment("text-extrapolation", "reproduction").settings
    specs = EncodingSpec.parse_list(r.encodings)
    assert [s.label for s in specs][:4] == ["none", "alibi", "rope", "pope"]  # the paper's rows first, unchanged
    assert {"xpos", "t5", "fire", "kerple-log", "irope:nope_every=2"} <= {s.label for s in specs}
    model = r.config["model"]
    with torch.device("meta"):
        irope = Transformer(ModelConfig(**{**model, "encoding": "irope", "encoding_options": {"nope_every": 2}}))
    assert [e.name for e in irope.encoding_modules()] == ["irope", "none"]  # no position on layer 2 of 2
