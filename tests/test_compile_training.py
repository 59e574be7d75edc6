"""TrainConfig.compile: training through torch.compile gives the eager run's numbers (up to rounding), saves
checkpoints under the model's own parameter names, and may be switched on or off by a resume."""
import json

import pytest
import torch

from poskit.cli import _base_config, build_parser
from poskit.training import TrainConfig, load_run, read_metrics, train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # each compilation takes 10-40 s

# no dropout: eager and compiled runs then compute the same function and differ only by rounding
TINY = dict(task="flip-flop", task_options={"length": 16, "eval_size": 32, "eval_batch_size": 32},
            model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "pope"}, batch_size=8,
            max_steps=8, lr=3e-3, warmup_steps=2, eval_every=4, log_every=1, checkpoint_every=4)


def tiny(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**TINY, **kw})


def _train_losses(run) -> list[float]:
    return [m["train_loss"] for m in read_metrics(run) if "train_loss" in m]


def test_a_compiled_run_trains_like_the_eager_one_and_saves_plain_parameter_names(tmp_path):
    from torch._dynamo.utils import counters

    eager = train(tiny(), tmp_path / "eager", quiet=True)
    counters.clear()
    compiled = train(tiny(compile=True), tmp_path / "compiled", quiet=True)
    assert counters["stats"]["unique_graphs"] >= 1  # the training forward did go through dynamo
    assert json.loads((tmp_path / "compiled" / "config.json").read_text())["compile"] is True
    assert _train_losses(tmp_path / "compiled") == pytest.approx(_train_losses(tmp_path / "eager"), rel=1e-4)
    assert compiled["splits"]["test"]["loss"] == pytest.approx(eager["splits"]["test"]["loss"], rel=1e-4)
    # the checkpoint is the model's, not the compiled wrapper's: it loads into a plain Transformer
    model, _, cfg = load_run(tmp_path / "compiled")
    reference, _, _ = load_run(tmp_path / "eager")
    assert cfg.compile and not any("_orig_mod" in k for k in model.state_dict())
    for (name, p), (_, r) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(p, r, rtol=1e-4, atol=1e-5, msg=name)


def test_a_resume_may_switch_compilation_on(tmp_path):
    assert train(tiny(), tmp_path / "r", stop_after=4, quiet=True) is None
    train(tiny(compile=True), tmp_path / "r", resume=True, quiet=True)
    uninterrupted = train(tiny(), tmp_path / "u", quiet=True)
    assert _train_losses(tmp_path / "r") == pytest.approx(_train_losses(tmp_path / "u"), rel=1e-4)
    assert json.loads((tmp_path / "r" / "results.json").read_text())["splits"]["test"]["loss"] == pytest.approx(
        uninterrupted["splits"]["test"]["loss"], rel=1e-4)


def test_the_compile_flag_sets_the_config_field():
    def config(*flags):
        return _base_config(build_parser().parse_args(["train", "--task", "flip-flop", *flags]), "pope")

    assert config("--compile").compile is True
    assert config().compile is False
