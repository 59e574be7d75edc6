"""`poskit export RUN --hf DIR` and back: the exported directory loads in transformers and in poskit with the
run's logits; bad input is refused naming the argument."""
import json
import shutil

import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from poskit.cli import main  # noqa: E402
from poskit.hf import PoskitForCausalLM, to_poskit  # noqa: E402
from poskit.training import TrainConfig  # noqa: E402
from poskit.training.run import load_run, train  # noqa: E402
from poskit.training.run_dir import LOCK_FILE, MARKER_FILE  # noqa: E402
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
    assert torch.equal(hf(ids, use_cache=False).logits, expected)
    torch.testing.assert_close(hf(ids).logits, expected, rtol=1e-5, atol=1e-5)  # the cache's prefill
    assert torch.equal(to_poskit(out)(ids), expected)
    info = json.loads((out / "poskit_run.json").read_text())
    assert info["task"] == task.name and info["vocab"]["tokens"] == list(task.vocab.tokens)
    assert info["train_config"]["model"] == cfg.model.to_dict()


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_refuses_a_non_empty_directory_it_did_not_write_and_leaves_it(run_dir, tmp_path, overwrite, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as e:
        main(["export", str(run_dir), "--hf", str(out), *(["--overwrite"] if overwrite else [])])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"poskit export: error: --hf {out}: is not empty and was not written by poskit (it holds "
                          "keep.txt)"), err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_overwrite_replaces_an_earlier_export_only(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--hf", str(out), "--quiet"]) == 0
    assert json.loads((out / MARKER_FILE).read_text())["kind"] == "export"
    (out / "notes.txt").write_text("a file the user added to the export")
    with pytest.raises(SystemExit):  # an export is not replaced without --overwrite
        main(["export", str(run_dir), "--hf", str(out), "--quiet"])
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(run_dir), "--hf", str(out), "--overwrite", "--quiet"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "notes.txt").exists()
    assert not (out / LOCK_FILE).exists() and not [p for p in tmp_path.iterdir() if p.name != "hf"]


def test_overwrite_adopts_an_export_written_before_markers(run_dir, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--hf", str(out), "--quiet"]) == 0
    (out / MARKER_FILE).unlink()
    assert main(["export", str(run_dir), "--hf", str(out), "--overwrite", "--quiet"]) == 0
    assert json.loads((out / MARKER_FILE).read_text())["kind"] == "export"


def test_export_never_replaces_another_poskit_directory(run_dir, tmp_path, capsys):
    other = tmp_path / "other-run"
    shutil.copytree(run_dir, other)
    before = {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()}
    with pytest.raises(SystemExit):
        main(["export", str(run_dir), "--hf", str(other), "--overwrite", "--quiet"])
    assert "is a poskit directory of kind 'run'" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in other.iterdir() if p.is_file()} == before


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
