"""A run killed (SIGKILL) again and again, at random moments of training and inside its checkpoint and results
writes, then resumed each time, ends bit-identical to an uninterrupted run, and no file of the run is ever
missing or half-written in between. (tests/test_train.py has the single kill right after a checkpoint.)"""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from poskit.cli import main
from poskit.training import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    RESULTS_FILE,
    load_config,
    metrics_at_checkpoint,
    read_checkpoint,
    read_metrics,
)
from poskit.training.files import KILL_BEFORE_RENAME_ENV, TEMP_MARK

ARGS = ["--task", "flip-flop", "--encoding", "rope", "--steps", "300", "--batch-size", "8", "--quiet",
        "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.dropout=0.1",
        "task_options.length=16", "task_options.eval_size=64", "task_options.eval_batch_size=64",
        "checkpoint_every=10", "eval_every=50", "log_every=10", "warmup_steps=10"]
# one thread, as in this process, so that every invocation does the same arithmetic
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# tiny matrices: one thread is faster and does the same arithmetic in every process (conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def _start(run: Path, first: bool, kill_before_rename: str | None = None) -> subprocess.Popen:
    # the environment as the test runs, not as it was imported: the suite's session fixtures set variables the
    # processes must share with this one (POSKIT_KERNEL_CALIBRATION=off, or a machine's calibration would route
    # their attention elsewhere than this process's)
    env = {**os.environ, **THREADS}
    if kill_before_rename:
        env[KILL_BEFORE_RENAME_ENV] = kill_before_rename
    argv = ARGS if first else ["--resume", "--quiet"]
    return subprocess.Popen([sys.executable, "-m", "poskit.cli", "train", *argv, "--run-dir", str(run)], env=env)


def _checkpoint_step(run: Path) -> int:
    try:
        return read_checkpoint(run / CHECKPOINT_FILE)["step"]
    except ValueError:  # not there yet (a concurrent rename is atomic, so never a torn file)
        return -1


def _kill_after_progress(proc: subprocess.Popen, run: Path, rng: random.Random) -> None:
    """SIGKILL `proc` at a random moment once it has written a checkpoint past the current one."""
    start = _checkpoint_step(run)
    deadline = time.time() + 120
    while _checkpoint_step(run) <= start and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.03))  # anywhere in the steps, evaluations and writes that follow
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _assert_whole(run: Path) -> int:
    """Every file of the run is there and whole (readable and consistent); returns the checkpoint's step."""
    assert {CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE} <= {p.name for p in run.iterdir()}
    load_config(run)
    state = read_checkpoint(run / CHECKPOINT_FILE)
    metrics_at_checkpoint(run, state)  # the log up to the checkpoint is there and parses
    return state["step"]


def _strip_elapsed(ref, got):
    return [{**r, "elapsed": g["elapsed"]} if "elapsed" in r else r for r, g in zip(ref, got)]


@pytest.mark.slow  # five interpreter start-ups: about 50 s on a busy 2-core machine
def test_killed_at_random_points_and_inside_writes_then_resumed_is_bit_identical(tmp_path):
    assert main(["train", *ARGS, "--run-dir", str(tmp_path / "ref")]) == 0
    ref = json.loads((tmp_path / "ref" / RESULTS_FILE).read_text())
    run, rng = tmp_path / "killed", random.Random(1234)
    steps_seen = []

    # 1. inside a checkpoint write: the temporary file is complete, the rename has not happened
    nth = rng.randint(2, 6)
    proc = _start(run, first=True, kill_before_rename=f"{CHECKPOINT_FILE}:{nth}")
    assert proc.wait() == -signal.SIGKILL
    assert any(TEMP_MARK in p.name for p in run.iterdir())  # the killed write's leftover
    steps_seen.append(_assert_whole(run))
    assert steps_seen[-1] == 10 * (nth - 1)  # the previous checkpoint stands

    # 2. at random moments of training (steps, evaluations, metrics appends, checkpoint writes)
    for _ in range(2):
        _kill_after_progress(_start(run, first=False), run, rng)
        assert not (run / RESULTS_FILE).exists(), "the run finished before it could be killed"
        steps_seen.append(_assert_whole(run))

    # 3. inside a resumed invocation's checkpoint write, and inside the final results write
    proc = _start(run, first=False, kill_before_rename=f"{CHECKPOINT_FILE}:{rng.randint(2, 4)}")
    assert proc.wait() == -signal.SIGKILL
    steps_seen.append(_assert_whole(run))
    proc = _start(run, first=False, kill_before_rename=f"{RESULTS_FILE}:1")
    assert proc.wait() == -signal.SIGKILL
    assert not (run / RESULTS_FILE).exists() and _assert_whole(run) == 300

    assert steps_seen == sorted(steps_seen) and 0 < steps_seen[0] and steps_seen[-1] < 300
    # 4. the last resume, in this process
    assert main(["train", "--resume", "--run-dir", str(run), "--quiet"]) == 0
    got = json.loads((run / RESULTS_FILE).read_text())
    assert got["final_train_loss"] == ref["final_train_loss"] and got["steps"] == 300
    assert got["splits"] == ref["splits"]  # every metric of every split, exactly
    assert read_metrics(run) == _strip_elapsed(read_metrics(tmp_path / "ref"), read_metrics(run))
    a, b = read_checkpoint(tmp_path / "ref" / CHECKPOINT_FILE)["model"], read_checkpoint(run / CHECKPOINT_FILE)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # final weights, bit for bit
    assert not any(TEMP_MARK in p.name for p in run.iterdir())  # the leftovers were cleaned
