"""The checkpoint format: safetensors weights usable on their own, a commit record that survives a writer
killed between files, old checkpoint.pt runs resumed and converted, and optional TensorBoard logging.
(Corrupted and truncated files of either format: tests/test_bad_input_runs.py.)"""
import json
import shutil
from pathlib import Path

import pytest
import torch

from poskit.cli import main
from poskit.util.config_check import ConfigError
from poskit.models import ModelConfig, Transformer
from poskit.training import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    LEGACY_CHECKPOINT_FILE,
    RESULTS_FILE,
    TrainConfig,
    load_run,
    read_checkpoint,
    read_metrics,
    train,
)
from poskit.training import checkpoint_store
from poskit.training.checkpoint_store import MODEL_CONFIG_FILE, STATE_FILE, WEIGHTS_FILE
from poskit.training.files import RunFileError

from checkpoint_helpers import to_legacy
from thread_helpers import single_thread
from extras import need

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(task="flip-flop", task_options={"length": 16, "eval_size": 32, "eval_batch_size": 32},
            model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "pope", "dropout": 0.1}, batch_size=8,
            max_steps=16, lr=3e-3, warmup_steps=2, eval_every=8, log_every=4, checkpoint_every=8)


def tiny(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**TINY, **kw})


def _files(run: Path) -> Path:
    return run / json.loads((run / CHECKPOINT_FILE).read_text())["directory"]




@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run and one stopped at its step-8 checkpoint, built once; tests work on copies."""
    root = tmp_path_factory.mktemp("ckpt")
    with single_thread():
        full = train(tiny(), root / "full", quiet=True)
        assert train(tiny(), root / "stopped", stop_after=8, quiet=True) is None
    return root, full


def _copy(runs, name, tmp_path) -> Path:
    shutil.copytree(runs[0] / name, tmp_path / name)
    return tmp_path / name


def test_weights_and_model_config_load_alone_into_a_transformer(runs):
    from safetensors.torch import load_file

    run = runs[0] / "full"
    weights = load_file(_files(run) / WEIGHTS_FILE)
    config = ModelConfig.from_dict(json.loads((_files(run) / MODEL_CONFIG_FILE).read_text()))
    model = Transformer(config)
    model.load_state_dict(weights)  # strict: every tensor there, none missing
    reference, task, _ = load_run(run)
    assert set(weights) == set(reference.state_dict())
    x = task.split("test")[0].inputs
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
    # the training state holds no weights (they are in the safetensors file only)
    state = torch.load(_files(run) / STATE_FILE, weights_only=True)
    assert "model" not in state and {"optimizer", "rng", "data_generator", "step"} <= set(state)


def test_tied_embeddings_round_trip(tmp_path):
    # safetensors refuses two names on one storage; the writer stores each name's own copy
    cfg = tiny(model={**TINY["model"], "tie_embeddings": True}, max_steps=4, checkpoint_every=4, eval_every=4)
    train(cfg, tmp_path / "tied", quiet=True)
    model, _, _ = load_run(tmp_path / "tied")
    assert model.head.weight.data_ptr() == model.embed.weight.data_ptr()  # still tied after loading
    trainer_weights = read_checkpoint(tmp_path / "tied" / CHECKPOINT_FILE)["model"]
    assert torch.equal(trainer_weights["embed.weight"], trainer_weights["head.weight"])


def test_a_writer_failing_before_the_commit_leaves_the_previous_checkpoint(runs, tmp_path, monkeypatch):
    run = _copy(runs, "stopped", tmp_path)
    before = (run / CHECKPOINT_FILE).read_bytes()

    def fail(path, obj):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint_store, "atomic_write_json", fail)
    with pytest.raises(OSError, match="simulated"):
        train(None, run, resume=True, quiet=True)
    monkeypatch.undo()
    assert (run / CHECKPOINT_FILE).read_bytes() == before  # the commit record still names step 8
    assert read_checkpoint(run / CHECKPOINT_FILE)["step"] == 8
    assert len(list((run / CHECKPOINTS_DIR).iterdir())) == 2  # step 8's files and the uncommitted ones
    results = train(None, run, resume=True, quiet=True)
    assert results["final_train_loss"] == runs[1]["final_train_loss"] and results["splits"] == runs[1]["splits"]
    assert len(list((run / CHECKPOINTS_DIR).iterdir())) == 1


def test_an_old_checkpoint_pt_run_resumes_exactly_and_is_rewritten(runs, tmp_path):
    run = _copy(runs, "stopped", tmp_path)
    to_legacy(run)
    model, _, _ = load_run(run)  # an old run loads as it is
    assert not model.training
    results = train(None, run, resume=True, quiet=True)
    assert results["final_train_loss"] == runs[1]["final_train_loss"]  # bit for bit, dropout included
    assert results["splits"] == runs[1]["splits"]
    assert not (run / LEGACY_CHECKPOINT_FILE).exists() and (run / CHECKPOINT_FILE).exists()
    a = read_checkpoint(runs[0] / "full" / CHECKPOINT_FILE)["model"]
    b = read_checkpoint(run / CHECKPOINT_FILE)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_convert_checkpoint_command(runs, tmp_path, capsys):
    run = _copy(runs, "stopped", tmp_path)
    to_legacy(run)
    legacy = torch.load(run / LEGACY_CHECKPOINT_FILE, weights_only=True)
    assert main(["convert-checkpoint", str(run)]) == 0
    assert "checkpoint.pt ->" in capsys.readouterr().out
    assert not (run / LEGACY_CHECKPOINT_FILE).exists()
    state = read_checkpoint(run / CHECKPOINT_FILE)
    assert all(torch.equal(legacy["model"][k], state["model"][k]) for k in legacy["model"])
    assert state["step"] == legacy["step"] and state["metrics_bytes"] == legacy["metrics_bytes"]
    results = train(None, run, resume=True, quiet=True)
    assert results["final_train_loss"] == runs[1]["final_train_loss"]
    # nothing left to convert: one line, exit 2, naming the run
    with pytest.raises(SystemExit) as e:
        main(["convert-checkpoint", str(run)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run}' has no checkpoint.pt to convert (it already has checkpoint.json)" in err


def test_convert_refuses_a_corrupt_old_checkpoint_and_changes_nothing(runs, tmp_path):
    run = _copy(runs, "stopped", tmp_path)
    to_legacy(run)
    data = (run / LEGACY_CHECKPOINT_FILE).read_bytes()
    (run / LEGACY_CHECKPOINT_FILE).write_bytes(data[: len(data) // 2])
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ValueError, match="checkpoint.pt: is not a readable checkpoint"):
        main_convert(run)
    assert sorted(p.name for p in run.iterdir()) == before


def main_convert(run):
    from poskit.training import convert_legacy_checkpoint

    return convert_legacy_checkpoint(run)


# -- TensorBoard

def test_tensorboard_asked_for_without_the_extra_is_refused_naming_it(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r'tensorboard must be false, or the "tensorboard" extra installed'):
        train(tiny(tensorboard=True), tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()


def test_tensorboard_logs_the_metrics_records(runs, tmp_path):
    need("tensorboard", "tensorboard", "TensorBoard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _copy(runs, "stopped", tmp_path)
    # a resume may switch TensorBoard on (it changes no number of the run)
    train(tiny(tensorboard=True), run, resume=True, quiet=True)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    log = [m for m in read_metrics(run) if m["step"] > 8]  # what this invocation logged
    train_loss = {e.step: e.value for e in events.Scalars("train/train_loss")}
    assert train_loss == pytest.approx({m["step"]: m["train_loss"] for m in log if "train_loss" in m})
    accuracy = {e.step: e.value for e in events.Scalars("validation/accuracy")}
    assert accuracy == pytest.approx({m["step"]: m["accuracy"] for m in log if m.get("split") == "validation"})
    assert json.loads((run / RESULTS_FILE).read_text())["final_train_loss"] == runs[1]["final_train_loss"]


@pytest.mark.parametrize("field", ["sha256", "bytes"])
def test_a_changed_entry_of_the_record_is_blamed_on_the_record_not_on_the_file_it_describes(runs, tmp_path, field):
    # one character of model_config.json's recorded hash (or its size) changed: the intact model_config.json
    # must not be reported as corrupt
    run = _copy(runs, "stopped", tmp_path)
    record_path = run / CHECKPOINT_FILE
    record = json.loads(record_path.read_text())
    entry = record["files"][MODEL_CONFIG_FILE]
    entry[field] = ("0" if entry["sha256"][0] != "0" else "1") + entry["sha256"][1:] if field == "sha256" \
        else entry["bytes"] + 1
    record_path.write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(RunFileError) as err:
        train(None, run, resume=True, quiet=True)
    assert err.value.path == record_path and "record_sha256" in str(err.value)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_record_written_before_its_own_hash_still_resumes_exactly(runs, tmp_path):
    run = _copy(runs, "stopped", tmp_path)
    record_path = run / CHECKPOINT_FILE
    record = json.loads(record_path.read_text())
    del record[checkpoint_store.RECORD_HASH]
    record_path.write_text(json.dumps(record, indent=2))
    results = train(None, run, resume=True, quiet=True)
    assert results["final_train_loss"] == runs[1]["final_train_loss"]
    assert checkpoint_store.RECORD_HASH in json.loads(record_path.read_text())  # the next checkpoint has it


def test_a_recorded_hash_that_is_not_a_sha256_is_refused_naming_the_record(runs, tmp_path):
    run = _copy(runs, "stopped", tmp_path)
    record_path = run / CHECKPOINT_FILE
    record = json.loads(record_path.read_text())
    del record[checkpoint_store.RECORD_HASH]  # an older record: only the format check can catch it
    record["files"][STATE_FILE]["sha256"] = record["files"][STATE_FILE]["sha256"][:20] + " " + \
        record["files"][STATE_FILE]["sha256"][21:]
    record_path.write_text(json.dumps(record))
    with pytest.raises(RunFileError) as err:
        train(None, run, resume=True, quiet=True)
    assert err.value.path == record_path
