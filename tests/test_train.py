"""poskit.train: schedule, loss restriction, learning, atomic checkpoints and exact resume (also after a kill)."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from poskit.train import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    RESULTS_FILE,
    TrainConfig,
    load_run,
    lr_at,
    read_metrics,
    restrict_to_last,
    train,
)

@pytest.fixture(autouse=True)
def _one_thread():
    # tiny matrices: one thread is faster, and avoids OpenMP spin-waiting on a busy machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope"}


def tiny(**kw) -> TrainConfig:
    base = dict(task="flip-flop", task_options={"length": 16, "eval_size": 64, "eval_batch_size": 64},
                model=dict(TINY_MODEL), batch_size=8, max_steps=24, lr=3e-3, warmup_steps=4, eval_every=8,
                log_every=4, checkpoint_every=8)
    base.update(kw)
    return TrainConfig.from_dict(base)


def test_lr_schedule_warmup_then_cosine_to_min():
    cfg = TrainConfig(max_steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)  # linear warmup reaches the peak
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decays monotonically
    assert lr_at(100, cfg) == pytest.approx(1e-4)  # to the minimum at max_steps
    assert lr_at(55, cfg) == pytest.approx(1e-4 + 0.5 * 0.9e-3)  # cosine midpoint
    assert TrainConfig(lr=2e-3).final_lr == pytest.approx(2e-4)  # default minimum: lr / 10 (the papers' ratio)
    assert TrainConfig(max_steps=200, warmup_fraction=0.05).warmup == 10


def test_restrict_to_last_keeps_one_target_per_row():
    t = torch.tensor([[-100, 3, -100, 4, -100], [5, 6, 7, -100, -100], [-100, -100, -100, -100, 9]])
    out = restrict_to_last(t)
    assert out.tolist() == [[-100, -100, -100, 4, -100], [-100, -100, 7, -100, -100], [-100, -100, -100, -100, 9]]


@pytest.mark.parametrize("kw,needle", [
    ({"task": "sudoku"}, "task must be one of"),
    ({"loss_on": "first"}, "loss_on must be one of"),
    ({"max_steps": 0}, "max_steps must be a positive int"),
    ({"min_lr": 1.0}, "min_lr must be in"),
    ({"warmup_fraction": 1.5}, "warmup_fraction must be in"),
    ({"train_seconds": -1}, "train_seconds must be > 0"),
])
def test_bad_train_config_raises_value_error(kw, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig(**kw)
    with pytest.raises(ValueError, match="unknown train config field"):
        TrainConfig.from_dict({"epochs": 3})


def test_training_smoke_loss_goes_down(tmp_path):
    # Indirect Indexing with shift 0 (copy the source character): learnable in a few hundred steps
    cfg = TrainConfig.from_dict(dict(
        task="indirect-indexing", task_options={"min_len": 6, "max_len": 10, "max_shift": 0, "eval_size": 200},
        model={"d_model": 32, "n_layers": 2, "n_heads": 2, "encoding": "pope"}, batch_size=32, max_steps=150,
        lr=5e-3, warmup_steps=10, eval_every=50, log_every=10, checkpoint_every=150))
    results = train(cfg, tmp_path / "run", quiet=True)
    log = read_metrics(tmp_path / "run")
    losses = [m["train_loss"] for m in log if "train_loss" in m]
    assert losses[-1] < 0.5 * losses[0], losses
    assert losses[0] == pytest.approx(math.log(len("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789,+-") + 1), rel=0.15)
    assert results["splits"]["test"]["accuracy"] > 0.5  # chance is 1/52
    assert results["steps"] == 150 and set(results["splits"]) == {"validation", "test"}


def test_loss_on_last_uses_only_the_final_target(tmp_path):
    from poskit.tasks import lm_loss
    from poskit.train import Trainer

    cfg = tiny(loss_on="last")
    tr = Trainer(cfg, None, quiet=True)
    batch = tr.task.train_batch(4, torch.Generator().manual_seed(0))
    assert (batch.target_mask.sum(1) > 1).any()  # flip-flop sequences have several reads
    with torch.no_grad():
        expected = lm_loss(tr.model(batch.inputs), restrict_to_last(batch.targets)).item()
        full = lm_loss(tr.model(batch.inputs), batch.targets).item()
    assert tr.train_step(batch) == pytest.approx(expected, rel=1e-6)
    assert expected != pytest.approx(full)


def _state(run_dir):
    return torch.load(Path(run_dir) / CHECKPOINT_FILE, weights_only=True)


def test_stop_and_resume_is_exact(tmp_path):
    cfg = tiny(model={**TINY_MODEL, "dropout": 0.1})  # dropout: the RNG state must be restored too
    full = train(cfg, tmp_path / "full", quiet=True)
    assert train(cfg, tmp_path / "split", stop_after=11, quiet=True) is None  # stops at step 11, mid-interval
    assert _state(tmp_path / "split")["step"] == 11
    with pytest.raises(ValueError, match="already holds a run"):
        train(cfg, tmp_path / "split", quiet=True)
    resumed = train(cfg, tmp_path / "split", resume=True, quiet=True)
    assert resumed["final_train_loss"] == full["final_train_loss"]  # bit for bit
    assert resumed["splits"] == full["splits"]
    assert read_metrics(tmp_path / "split") == _strip_elapsed(read_metrics(tmp_path / "full"), read_metrics(tmp_path / "split"))
    a, b = _state(tmp_path / "full")["model"], _state(tmp_path / "split")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def _strip_elapsed(ref, got):
    # wall-clock fields differ between runs; everything else must match
    return [{**r, "elapsed": g["elapsed"]} if "elapsed" in r else r for r, g in zip(ref, got)]


def test_checkpoint_contents_and_no_temp_files(tmp_path):
    train(tiny(), tmp_path / "r", quiet=True)
    state = _state(tmp_path / "r")  # loads with weights_only=True: no pickled objects
    assert {"model", "optimizer", "step", "rng", "data_generator", "config"} <= set(state)
    assert set(state["rng"]) == {"torch", "numpy", "python"}
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
        [CONFIG_FILE, "metrics.jsonl", CHECKPOINT_FILE, RESULTS_FILE])
    model, task, cfg = load_run(tmp_path / "r")
    assert cfg.task == "flip-flop" and not model.training


def test_kill_mid_run_then_resume_matches_uninterrupted(tmp_path):
    cfg = tiny(max_steps=200, checkpoint_every=10, eval_every=100, log_every=10)
    ref = train(cfg, tmp_path / "ref", quiet=True)
    run = tmp_path / "killed"
    run.mkdir()
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    code = ("import json, sys, torch; torch.set_num_threads(1); from poskit.train import TrainConfig, train; "
            "train(TrainConfig.from_dict(json.load(open(sys.argv[1]))), sys.argv[2], quiet=True)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cfg.json"), str(run)])
    try:
        deadline = time.time() + 60
        while not (run / CHECKPOINT_FILE).exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not (run / RESULTS_FILE).exists(), "the run finished before it could be killed"
    killed_at = _state(run)["step"]
    assert 0 < killed_at < 200
    resumed = train(cfg, run, resume=True, quiet=True)
    assert resumed["final_train_loss"] == ref["final_train_loss"]
    assert resumed["splits"]["test"] == ref["splits"]["test"]
    steps = [m["step"] for m in read_metrics(run) if "train_loss" in m]
    assert steps == list(range(10, 201, 10))  # the log has no gap and no duplicate around the kill


def test_train_seconds_resolves_and_records_steps(tmp_path):
    results = train(tiny(train_seconds=1.0, warmup_fraction=0.1), tmp_path / "t", quiet=True)
    saved = json.loads((tmp_path / "t" / CONFIG_FILE).read_text())
    # the planned steps are recorded; the time cap may end training a little before them
    assert saved["max_steps"] == results["planned_steps"] >= results["steps"] > 1
    assert results["train_seconds"] < 10


def test_bf16_autocast_trains(tmp_path):
    results = train(tiny(bf16=True, max_steps=8), tmp_path / "b", quiet=True)
    assert math.isfinite(results["final_train_loss"])


def test_time_budget_stops_training_even_before_max_steps(tmp_path):
    from poskit.train import Trainer

    cfg = tiny(train_seconds=0.5, max_steps=10**6, eval_every=10**6, log_every=10**6, checkpoint_every=10**6)
    trainer = Trainer(cfg, tmp_path, quiet=True)
    assert trainer.run() is True
    assert 0 < trainer.step < 10**6 and trainer.elapsed >= 0.5
    log = read_metrics(tmp_path)
    # the cut-off step still gets its loss line, an evaluation and a checkpoint
    assert [m["step"] for m in log] == [trainer.step, trainer.step] and "split" in log[1]
    assert _state(tmp_path)["step"] == trainer.step
