"""poskit.training: schedule, loss restriction, learning, atomic checkpoints and exact resume (also after a kill)."""
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

from poskit.training import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    RESULTS_FILE,
    TrainConfig,
    load_run,
    lr_at,
    read_metrics,
    restrict_targets,
    restrict_to_last,
    read_checkpoint,
    rng_state,
    set_rng_state,
    train,
)
from poskit.training.run_dir import LOCK_FILE, MARKER_FILE

# tiny matrices: one thread is faster, and avoids OpenMP spin-waiting on a busy machine (conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


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


def test_restrict_targets_counts_like_python_indices():
    t = torch.tensor([[-100, 3, -100, 4, 5], [6, -100, -100, -100, -100], [-100, -100, -100, -100, -100]])
    keep = lambda pos: restrict_targets(t, pos).tolist()  # noqa: E731
    assert keep([0]) == [[-100, 3, -100, -100, -100], [6, -100, -100, -100, -100], [-100] * 5]
    assert keep([-2, -1]) == [[-100, -100, -100, 4, 5], [6, -100, -100, -100, -100], [-100] * 5]
    assert keep([1]) == [[-100, -100, -100, 4, -100], [-100] * 5, [-100] * 5]  # a row without a second target
    assert keep([-3, 0]) == [[-100, 3, -100, -100, -100], [6, -100, -100, -100, -100], [-100] * 5]
    assert torch.equal(restrict_to_last(t), restrict_targets(t, [-1]))


@pytest.mark.parametrize("kw,needle", [
    ({"task": "sudoku"}, "task must be one of"),
    ({"loss_on": "first"}, "loss_on must be \"task\", \"last\" or a non-empty list"),
    ({"loss_on": []}, "loss_on must be"),
    ({"loss_on": [0, 0]}, "loss_on must be"),
    ({"loss_on": [1.5]}, "loss_on must be"),
    ({"loss_on": [True]}, "loss_on must be"),
    ({"max_steps": 0}, "max_steps must be a positive int, got 0"),
    ({"min_lr": 1.0}, "min_lr must be in"),
    ({"warmup_fraction": 1.5}, "warmup_fraction must be in"),
    ({"train_seconds": -1}, "train_seconds must be > 0"),
    # types checked against the annotations: the field and what it accepts, never a TypeError
    ({"lr": "abc"}, "lr must be a number, got 'abc'"),
    ({"min_lr": "x"}, "min_lr must be a number or null, got 'x'"),
    ({"bf16": "maybe"}, "bf16 must be true or false, got 'maybe'"),
    ({"bf16": 1}, "bf16 must be true or false, got 1"),
    ({"batch_size": 2.5}, "batch_size must be an integer, got 2.5"),
    ({"max_steps": True}, "max_steps must be an integer, got True"),
    ({"eval_batches": "all"}, "eval_batches must be an integer or null"),
    ({"task_options": [1]}, "task_options must be a JSON object"),
    ({"device": 0}, "device must be a string"),
    ({"lr": float("nan")}, "lr must be a number, got nan"),
    ({"model": {"dropout": "abc"}}, "model.dropout must be a number, got 'abc'"),
    ({"model": {"tie_embeddings": "no"}}, "model.tie_embeddings must be true or false, got 'no'"),
    ({"model": {"n_heads": "4"}}, "model.n_heads must be an integer, got '4'"),
    ({"model": {"dropout": 1.0}}, "model.dropout must be in \\[0, 1\\)"),
    ({"model": 3}, "model must be a JSON object of ModelConfig fields, got 3"),
    ({"beta2": 5}, "beta2 must be in \\[0, 1\\), got 5.0"),
    ({"beta1": -0.1}, "beta1 must be in \\[0, 1\\)"),
    ({"eval_split": "train"}, "eval_split must be one of the splits of task 'shakespeare': \\['validation', 'test'\\]"),
    ({"task": "flip-flop", "eval_split": "ood_longer"}, "eval_split must be one of the splits of task 'flip-flop'"),
    ({"preset": "huge"}, "preset must be one of \\['default', 'paper'\\]"),
    ({"task": "flip-flop", "curve_splits": ["ood_longer"]}, "curve_splits must be a list of distinct splits of task "
     "'flip-flop' other than eval_split"),
    ({"task": "flip-flop", "curve_splits": ["validation"]}, "curve_splits must be a list of distinct splits"),
    ({"task": "flip-flop", "curve_splits": ["test", "test"]}, "curve_splits must be a list of distinct splits"),
    ({"curve_splits": "test"}, "curve_splits must be a list of strings"),
    ({"task_options": {"lenght": 8}}, "task_options.lenght must be a parameter of task 'shakespeare'"),
    ({"device": "gpu"}, "device must be a torch device"),
])
def test_bad_train_config_raises_value_error(kw, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig.from_dict(kw)


def test_config_types_are_normalised():
    cfg = TrainConfig.from_dict({"lr": 1, "beta2": 0, "loss_on": [-2, -1], "model": {"dropout": 0}})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and isinstance(cfg.beta2, float)
    assert cfg == TrainConfig.from_dict({"lr": 1.0, "beta2": 0.0, "loss_on": [-2, -1], "model": {"dropout": 0.0}})
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown train config field"):
        TrainConfig.from_dict({"epochs": 3})


def _fields_without_docstrings(path: Path, cls_name: str) -> list[str]:
    import ast

    (cls,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    body, missing = cls.body, []
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            nxt = body[i + 1] if i + 1 < len(body) else None
            if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                missing.append(node.target.id)
    return missing


def test_every_config_field_is_documented():
    import poskit.models.decoder
    import poskit.training.config

    assert _fields_without_docstrings(Path(poskit.training.config.__file__), "TrainConfig") == []
    assert _fields_without_docstrings(Path(poskit.models.decoder.__file__), "ModelConfig") == []


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


def test_curve_splits_are_evaluated_with_the_eval_split_and_kept_apart(tmp_path):
    from poskit.report.aggregate import learning_curves, periodic_evaluations

    train(tiny(curve_splits=["ood_sparse", "test"]), tmp_path / "run", quiet=True)
    log = read_metrics(tmp_path / "run")
    evaluations = [(m["step"], m["split"]) for m in log if "split" in m]
    # every evaluation step logs the eval split first, then each curve split in order
    assert evaluations == [(s, split) for s in (8, 16, 24) for split in ("validation", "ood_sparse", "test")]
    assert [m["split"] for m in periodic_evaluations(log)] == ["validation"] * 3
    by_split = {split: learning_curves([tmp_path / "run"], "accuracy", split)
                for split in ("validation", "ood_sparse", "test")}
    for split, (steps, mean, std) in by_split.items():
        expected = [m["accuracy"] for m in log if m.get("split") == split]
        assert steps == [8, 16, 24] and mean == expected and std == [0.0] * 3
    # the default is the eval split's curve, not the last split logged at each step
    assert learning_curves([tmp_path / "run"], "accuracy") == by_split["validation"]


def test_split_learning_curves_read_each_log_once_and_equal_the_per_split_curves(tmp_path, monkeypatch):
    from poskit.report import aggregate

    for seed in (0, 1):
        train(tiny(curve_splits=["ood_sparse"], seed=seed), tmp_path / f"run{seed}", quiet=True)
    dirs = [tmp_path / "run0", tmp_path / "run1"]
    splits = ["validation", "ood_sparse"]
    expected = {split: aggregate.learning_curves(dirs, "accuracy", split) for split in splits}
    reads = []
    real = aggregate.read_metrics
    monkeypatch.setattr(aggregate, "read_metrics", lambda d: reads.append(d) or real(d))
    assert aggregate.split_learning_curves(dirs, "accuracy", splits) == expected
    assert sorted(reads) == sorted(dirs)
    assert expected["validation"] != expected["ood_sparse"]


def test_trainer_passes_each_step_to_the_task_so_a_curriculum_advances(tmp_path, monkeypatch):
    # a curriculum task draws its training batch from the step; the trainer (and its preflight) must pass it
    from poskit.tasks.indirect_indexing import IndirectIndexing

    seen = []
    original = IndirectIndexing.train_batch

    def recording(self, batch_size, generator, step=None):
        batch = original(self, batch_size, generator, step=step)
        seen.append((step, int(batch.inputs.ne(self.vocab.pad_id).sum(1).max())))
        return batch

    monkeypatch.setattr(IndirectIndexing, "train_batch", recording)
    cfg = TrainConfig.from_dict(dict(
        task="indirect-indexing",
        task_options={"min_len": 6, "max_len": 12, "max_shift": 2, "eval_size": 20,
                      "curriculum": "length", "curriculum_steps": 4},
        model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope"}, batch_size=8, max_steps=6,
        eval_every=6, log_every=1, checkpoint_every=6))
    train(cfg, tmp_path / "run", quiet=True)
    steps = [s for s, _ in seen]
    assert None not in steps and steps[-6:] == [0, 1, 2, 3, 4, 5], steps
    longest = dict(seen[-6:])
    assert longest[0] < longest[5], seen  # strings grow with the curriculum (step 0 capped at min_len)


def test_loss_on_last_uses_only_the_final_target(tmp_path):
    from poskit.tasks import lm_loss
    from poskit.training import Trainer

    cfg = tiny(loss_on="last")
    tr = Trainer(cfg, None, quiet=True)
    batch = tr.recipe.task.train_batch(4, torch.Generator().manual_seed(0))
    assert (batch.target_mask.sum(1) > 1).any()  # flip-flop sequences have several reads
    with torch.no_grad():
        expected = lm_loss(tr.model(batch.inputs), restrict_to_last(batch.targets)).item()
        full = lm_loss(tr.model(batch.inputs), batch.targets).item()
    assert tr.train_step(batch) == pytest.approx(expected, rel=1e-6)
    assert expected != pytest.approx(full)


def test_loss_on_chosen_target_positions(tmp_path):
    from poskit.tasks import lm_loss
    from poskit.training import Trainer

    tr = Trainer(tiny(loss_on=[0, -1]), None, quiet=True)
    batch = tr.recipe.task.train_batch(8, torch.Generator().manual_seed(0))
    assert (batch.target_mask.sum(1) > 2).any()  # rows with reads that [0, -1] leaves out
    with torch.no_grad():
        expected = lm_loss(tr.model(batch.inputs), restrict_targets(batch.targets, [0, -1])).item()
        last = lm_loss(tr.model(batch.inputs), restrict_to_last(batch.targets)).item()
    assert tr.train_step(batch) == pytest.approx(expected, rel=1e-6)
    assert expected != pytest.approx(last)
    # asking for more targets than any row has would be a NaN loss: an error naming loss_on instead
    tr = Trainer(tiny(loss_on=[40]), None, quiet=True)
    with pytest.raises(ValueError, match="loss_on=\\[40\\] keeps no target of this batch"):
        tr.train_step(batch)


def _state(run_dir):
    return read_checkpoint(Path(run_dir) / CHECKPOINT_FILE)


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


def test_resume_keeps_the_saved_config_except_a_longer_max_steps(tmp_path):
    cfg = tiny()
    assert train(cfg, tmp_path / "r", stop_after=8, quiet=True) is None
    for change, field in (({"lr": 1e-3}, "lr"), ({"model": {**TINY_MODEL, "encoding": "pope"}}, "model.encoding"),
                          ({"max_steps": 16}, "max_steps"), ({"task_options": {"length": 18, "eval_size": 64, "eval_batch_size": 64}}, "task_options.length")):
        with pytest.raises(ValueError, match=f"where {field} is .*only max_steps"):
            train(tiny(**change), tmp_path / "r", resume=True, quiet=True)
    assert _state(tmp_path / "r")["step"] == 8  # refused before training
    # None continues with the saved config; a larger max_steps extends a finished run
    done = train(None, tmp_path / "r", resume=True, quiet=True)
    assert done["steps"] == 24
    mtime = (tmp_path / "r" / CHECKPOINT_FILE).stat().st_mtime_ns
    assert train(cfg, tmp_path / "r", resume=True, quiet=True) == done  # finished: saved results, no training
    assert (tmp_path / "r" / CHECKPOINT_FILE).stat().st_mtime_ns == mtime
    longer = train(tiny(max_steps=32), tmp_path / "r", resume=True, quiet=True)
    assert longer["steps"] == 32 and json.loads((tmp_path / "r" / CONFIG_FILE).read_text())["max_steps"] == 32
    steps = [m["step"] for m in read_metrics(tmp_path / "r") if "train_loss" in m]
    assert steps == list(range(4, 33, 4))


def test_cuda_rng_state_is_saved_and_restored_when_cuda_is_in_use(monkeypatch):
    assert "cuda" not in rng_state()  # a CPU run does not touch CUDA
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.tensor([7, 8], dtype=torch.uint8)])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: restored.update({device: s.tolist()}))
    state = rng_state()
    assert state["cuda"][0].tolist() == [7, 8]
    set_rng_state(state)
    assert restored == {0: [7, 8]}


def _strip_elapsed(ref, got):
    # wall-clock fields differ between runs; everything else must match
    return [{**r, "elapsed": g["elapsed"]} if "elapsed" in r else r for r, g in zip(ref, got)]


def test_checkpoint_contents_and_no_temp_files(tmp_path):
    train(tiny(), tmp_path / "r", quiet=True)
    state = _state(tmp_path / "r")  # the training state loads with weights_only=True: no pickled objects
    assert {"model", "optimizer", "step", "rng", "data_generator", "config", "world_size"} <= set(state)
    assert set(state["rng"]) == {"torch", "numpy", "python"}
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
        [CONFIG_FILE, "metrics.jsonl", CHECKPOINT_FILE, CHECKPOINTS_DIR, RESULTS_FILE, MARKER_FILE, LOCK_FILE])
    assert len(list((tmp_path / "r" / CHECKPOINTS_DIR).iterdir())) == 1  # earlier checkpoints were removed
    model, task, cfg = load_run(tmp_path / "r")
    assert cfg.task == "flip-flop" and not model.training


def test_kill_mid_run_then_resume_matches_uninterrupted(tmp_path):
    # the CLI end to end: `poskit train` killed (SIGKILL) right after its first checkpoint, then
    # `poskit train --resume --run-dir D`, against an uninterrupted run of the same command
    from poskit.cli import main

    args = ["--task", "flip-flop", "--encoding", "rope", "--steps", "200", "--batch-size", "8", "--quiet",
            "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.dropout=0.1",
            "task_options.length=16", "task_options.eval_size=64", "task_options.eval_batch_size=64",
            "checkpoint_every=10", "eval_every=50", "log_every=10", "warmup_steps=10"]
    assert main(["train", *args, "--run-dir", str(tmp_path / "ref")]) == 0
    ref = json.loads((tmp_path / "ref" / RESULTS_FILE).read_text())
    run = tmp_path / "killed"
    # one thread, as in this process (the fixture), so that both runs do the same arithmetic
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "poskit.cli", "train", *args, "--run-dir", str(run)], env=env)
    try:
        deadline = time.time() + 60
        while not (run / CHECKPOINT_FILE).exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / RESULTS_FILE).exists(), "the run finished before it could be killed"
    killed_at = _state(run)["step"]
    assert 0 < killed_at < 200
    # the resume runs in this process: the same command, without a second interpreter start-up (seconds here)
    assert main(["train", "--resume", "--run-dir", str(run), "--quiet"]) == 0
    got = json.loads((run / RESULTS_FILE).read_text())
    assert got["final_train_loss"] == ref["final_train_loss"] and got["steps"] == 200
    assert got["splits"] == ref["splits"]  # every metric of every split, exactly
    assert read_metrics(run) == _strip_elapsed(read_metrics(tmp_path / "ref"), read_metrics(run))
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
    from poskit.training import Trainer

    cfg = tiny(train_seconds=0.5, max_steps=10**6, eval_every=10**6, log_every=10**6, checkpoint_every=10**6)
    trainer = Trainer(cfg, tmp_path, quiet=True)
    assert trainer.run() is True
    assert 0 < trainer.step < 10**6 and trainer.elapsed >= 0.5
    log = read_metrics(tmp_path)
    # the cut-off step still gets its loss line, an evaluation and a checkpoint
    assert [m["step"] for m in log] == [trainer.step, trainer.step] and "split" in log[1]
    assert _state(tmp_path)["step"] == trainer.step


def test_benchmark_times_the_trainers_own_step(monkeypatch, capsys):
    import poskit.training
    from conftest import load_benchmark

    bench = load_benchmark("train_step")
    assert bench.optimizer_step is poskit.training.optimizer_step
    seen = []

    def counting_step(model, optimizer, batch, cfg, step):
        seen.append((cfg.grad_clip, [g["weight_decay"] for g in optimizer.param_groups]))
        return poskit.training.optimizer_step(model, optimizer, batch, cfg, step)

    monkeypatch.setattr(bench, "optimizer_step", counting_step)
    bench.main(["--quick", "--encodings", "alibi", "--batch-size", "2", "--context", "8"])
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) == {"encoding", "rope", "alibi"} and rows["rope"][3] == "1.00"  # ratios to rope
    # every timed step is the trainer's: clipping at the config's 1.0, decay on one group only
    assert seen and all(clip == 1.0 and decays == [0.01, 0.0] for clip, decays in seen)
