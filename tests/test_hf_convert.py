"""`poskit export RUN --hf DIR` and back: the exported directory loads in transformers and in poskit with the
run's logits; bad input is refused naming the argument."""
import json

import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from poskit.cli import main  # noqa: E402
from poskit.hf import PoskitForCausalLM, to_poskit  # noqa: E402
from poskit.training import TrainConfig  # noqa: E402
from poskit.training.run import load_run, train  # noqa: E402
from thread_helpers import single_thread  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run") / "r"
    cfg = TrainConfig.from_dict(dict(
        task="flip-flop", task_options={"length": 16, "eval_size": 16, "eval_batch_size": 16},
        model={"d_model": 16, "n_layers": 2, "n_heads": 2, "encoding": "pope", "mlp": "swiglu", "tie_embeddings": True},
        batch_size=4, max_steps=3, warmup_steps=1, eval_every=3, log_every=3, checkpoint_every=3))
    with single_thread():
        train(cfg, d, quiet=True)
    return d


def test_export_then_load_in_transformers_and_poskit_gives_the_run_logits(run_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--hf", str(out)]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "poskit_run.json"} <= {p.name for p in out.iterdir()}
    model, task, cfg = load_run(run_dir)
    ids = torch.randint(1, len(task.vocab), (2, task.max_input_len))
    expected = model(ids)
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf) is PoskitForCausalLM
    assert hf.config.max_position_embeddings == task.max_input_len and hf.config.pad_token_id == task.vocab.pad_id
    assert torch.equal(hf(ids).logits, expected)
    assert torch.equal(to_poskit(out)(ids), expected)
    info = json.loads((out / "poskit_run.json").read_text())
    assert info["task"] == task.name and info["vocab"]["tokens"] == list(task.vocab.tokens)
    assert info["train_config"]["model"] == cfg.model.to_dict()


def test_export_refuses_a_non_empty_directory_and_leaves_it(run_dir, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        main(["export", str(run_dir), "--hf", str(out)])
    assert e.value.code == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert main(["export", str(run_dir), "--hf", str(out), "--overwrite", "--quiet"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "keep.txt").exists()


def test_export_of_a_directory_without_a_run_names_it(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path / "nothing"), "--hf", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "nothing" in err and "poskit train" in err
    assert not (tmp_path / "out").exists()


def test_to_poskit_names_a_directory_without_a_model(tmp_path):
    with pytest.raises(ValueError, match="directory .*must hold a saved PoskitForCausalLM"):
        to_poskit(tmp_path)


def test_to_poskit_names_a_truncated_weights_file(run_dir, tmp_path):
    out = tmp_path / "hf"
    main(["export", str(run_dir), "--hf", str(out), "--quiet"])
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=str(out)):
        to_poskit(out)
