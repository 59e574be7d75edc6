"""Run directories are poskit's own and locked: a directory poskit did not write, or one of another kind, is
refused untouched; a resume whose committed state is missing or inconsistent is refused untouched; results
that disagree with their run are refused naming the file; a second process on a run directory is refused at
once while the first finishes intact; a lock left by a dead process is named; runs written before the marker
files still resume. (Table cases, as tests/test_bad_input_runs.py.)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poskit.cli import main
from poskit.training import CHECKPOINT_FILE, CHECKPOINTS_DIR, CONFIG_FILE, RESULTS_FILE, RunFileError, TrainConfig, train
from poskit.training.files import read_results
from poskit.training.run_dir import LOCK_FILE, MARKER_FILE, RunDirError, check, check_apart, claim, locked, owned

from thread_helpers import single_thread

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(task="flip-flop", task_options={"length": 16, "eval_size": 32, "eval_batch_size": 32},
            model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope"}, batch_size=8, max_steps=8,
            lr=3e-3, warmup_steps=2, eval_every=4, log_every=4, checkpoint_every=4)
TRAIN = ["train", "--task", "flip-flop", "--encoding", "rope", "--steps", "8", "--batch-size", "8", "--quiet",
         "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task_options.length=16",
         "task_options.eval_size=32", "task_options.eval_batch_size=32", "eval_every=4", "checkpoint_every=4"]


def snapshot(root: Path) -> dict:
    """Every file under `root` (path -> bytes) and every directory, to compare before and after a refused call."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict:
    """Two finished runs (rope and alibi) and one stopped at its first checkpoint, built once."""
    root = tmp_path_factory.mktemp("runs")
    with single_thread():
        train(TrainConfig.from_dict(TINY), root / "rope", quiet=True)
        train(TrainConfig.from_dict({**TINY, "model": {**TINY["model"], "encoding": "alibi"}}), root / "alibi",
              quiet=True)
        assert train(TrainConfig.from_dict(TINY), root / "stopped", stop_after=4, quiet=True) is None
    return {name: root / name for name in ("rope", "alibi", "stopped")}


def _project(d: Path) -> None:  # a user's folder that happens to hold a checkpoints/ and a results.json
    (d / CHECKPOINTS_DIR).mkdir(parents=True)
    (d / CHECKPOINTS_DIR / "model-final.pt").write_bytes(b"the user's own weights")
    (d / RESULTS_FILE).write_text('{"accuracy": 0.93}')
    (d / "notes.md").write_text("# my project\n")


def _compare_out(d: Path) -> None:  # the output directory of `poskit compare`
    claim(d, "compare")
    (d / RESULTS_FILE).write_text("{}")


def _bad_marker(d: Path) -> None:
    d.mkdir()
    (d / MARKER_FILE).write_text("not json")


# (id, how the directory is made, fragment of the one-line error); `poskit train --run-dir D` on it
NEW_RUN_CASES = [
    ("a project folder", _project, "is not empty and was not written by poskit (it holds checkpoints/, notes.md, "
                                   "results.json)"),
    ("a compare output directory", _compare_out, f"is a poskit directory of kind 'compare' ({MARKER_FILE}), not of kind 'run'"),
    ("a directory with one stray file", lambda d: (d.mkdir(), (d / "x.txt").write_text("x")),
     "is not empty and was not written by poskit (it holds x.txt)"),
    ("a marker that is not one", _bad_marker, f"{MARKER_FILE}: is not a poskit directory marker"),
]


@pytest.mark.parametrize("make,fragment", [c[1:] for c in NEW_RUN_CASES], ids=[c[0] for c in NEW_RUN_CASES])
def test_train_refuses_a_directory_it_does_not_own_and_changes_nothing(make, fragment, tmp_path, capsys):
    d = tmp_path / "dir"
    make(d)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([*TRAIN, "--run-dir", str(d)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and str(d) in err, err
    assert snapshot(tmp_path) == before


def _missing_record(run: Path, runs: dict) -> None:  # the committed checkpoint folder stays, its record is gone
    (run / CHECKPOINT_FILE).unlink()


def _results_without_checkpoint(run: Path, runs: dict) -> None:
    (run / CHECKPOINT_FILE).unlink()
    shutil.rmtree(run / CHECKPOINTS_DIR)


def _results_of(other: str, **edit):
    def swap(run: Path, runs: dict) -> None:  # results.json of run `other`, edited
        results = json.loads((runs[other] / RESULTS_FILE).read_text())
        (run / RESULTS_FILE).write_text(json.dumps({**results, **edit}))
    return swap


# (id, run copied, damage, error fragment); `train(None, run, resume=True)` on it
RESUME_CASES = [
    ("checkpoint.json missing, checkpoints/ present", "stopped", _missing_record,
     f"{CHECKPOINT_FILE}: is missing, but {CHECKPOINTS_DIR}/ holds step-00000004-"),
    ("checkpoint.json missing on a finished run", "rope", _missing_record, f"{CHECKPOINT_FILE}: is missing"),
    ("results without any checkpoint", "rope", _results_without_checkpoint,
     f"{RESULTS_FILE}: is there, but no checkpoint"),
    ("results of another run (alibi's in rope's run)", "rope", _results_of("alibi"),
     f"{RESULTS_FILE}: encoding is 'alibi', but config.json beside it says 'rope'"),
    ("results with another seed", "rope", _results_of("rope", seed=3),
     f"{RESULTS_FILE}: seed is 3, but config.json beside it says 0"),
    ("results of another code version", "rope", _results_of("rope", poskit_version="0.0.1"),
     f"{RESULTS_FILE}: poskit_version is '0.0.1', but checkpoint.json beside it says"),
]


@pytest.mark.parametrize("source,damage,fragment", [c[1:] for c in RESUME_CASES], ids=[c[0] for c in RESUME_CASES])
def test_resume_refuses_missing_or_inconsistent_committed_state_and_changes_nothing(source, damage, fragment,
                                                                                     finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished[source], run)
    damage(run, finished)
    before = snapshot(run)
    with pytest.raises(ValueError) as e:
        train(None, run, resume=True, quiet=True)
    assert fragment in str(e.value) and str(run) in str(e.value) and "\n" not in str(e.value), e.value
    assert snapshot(run) == before  # in particular the committed checkpoint folder is still there


# the one reader of a run's results: every malformed file is one line naming it
READ_CASES = [("a list", "[]", "holds a JSON list, not a run's results"),
              ("an empty object", "{}", "lacks ['encoding', 'seed']: not a run's results written by poskit"),
              ("truncated", '{"task": "flip-flop", "enc', "is not valid JSON"),
              ("empty", "", "is empty")]


@pytest.mark.parametrize("text,fragment", [c[1:] for c in READ_CASES], ids=[c[0] for c in READ_CASES])
def test_the_results_reader_names_the_file_in_one_line(text, fragment, tmp_path):
    path = tmp_path / RESULTS_FILE
    path.write_text(text)
    with pytest.raises(RunFileError) as e:
        read_results(path)
    assert str(e.value).startswith(str(path)) and fragment in str(e.value) and "\n" not in str(e.value)


def test_a_finished_run_returns_its_checked_results(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished["rope"], run)
    results = train(None, run, resume=True, quiet=True)
    assert results == read_results(run / RESULTS_FILE) and results["encoding"] == "rope"
    record = json.loads((run / CHECKPOINT_FILE).read_text())
    assert record["run"] == {"task": "flip-flop", "encoding": "rope", "seed": 0,
                             "poskit_version": results["poskit_version"]}


@pytest.mark.parametrize("kind", ["export", "compare", "study", "extend"])
def test_other_commands_cannot_claim_a_run_and_a_run_cannot_claim_theirs(kind, finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished["rope"], run)
    before = snapshot(run)
    with pytest.raises(RunDirError, match=f"is a poskit directory of kind .run. .* not of kind .{kind}."):
        claim(run, kind)
    other = claim(tmp_path / kind, kind)
    assert check(other, kind) == "own" and json.loads((other / MARKER_FILE).read_text())["kind"] == kind
    with pytest.raises(RunDirError, match=f"is a poskit directory of kind .{kind}."):
        train(TrainConfig.from_dict(TINY), other, quiet=True)
    assert snapshot(run) == before


@pytest.mark.parametrize("out,where", [("run", "is"), ("run/hf", "is inside"), (".", "contains")])
def test_an_output_that_is_the_run_inside_it_or_above_it_is_refused(out, where, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunDirError, match=rf"--hf '{out}' {where} the run directory 'run'; writing it would replace"):
        check_apart(out, "run", "--hf")
    check_apart("elsewhere", "run", "--hf")
    check_apart("run-hf", "run", "--hf")  # a sibling whose name starts alike


def test_a_run_written_before_markers_resumes_and_is_adopted(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished["stopped"], run)
    (run / MARKER_FILE).unlink()
    (run / LOCK_FILE).unlink()
    assert check(run, "run") == "legacy"
    results = train(None, run, resume=True, quiet=True)
    assert results["steps"] == 8 and results["splits"] == json.loads((finished["rope"] / RESULTS_FILE).read_text())["splits"]
    assert json.loads((run / MARKER_FILE).read_text())["kind"] == "run"


def test_a_lock_left_by_a_dead_process_is_named_and_taken_over(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished["stopped"], run)
    dead = {"pid": 999999, "host": "elsewhere", "since": "2020-01-01 00:00:00"}
    (run / LOCK_FILE).write_text(json.dumps(dead))  # what a killed holder leaves: its record, no kernel lock
    with pytest.warns(UserWarning, match=r"\.poskit\.lock: took over the lock of process 999999 on elsewhere"):
        assert train(None, run, resume=True, quiet=True)["steps"] == 8
    assert (run / LOCK_FILE).read_text() == ""  # released on exit


def test_a_held_lock_refuses_a_second_holder_at_once_and_is_released_on_error(tmp_path):
    d = tmp_path / "d"
    with owned(d, "study"):
        with pytest.raises(RunDirError, match=rf"{LOCK_FILE}: the directory is in use by process {os.getpid()}"):
            with locked(d):
                pass
    with pytest.raises(KeyError):
        with locked(d):
            raise KeyError("the work failed")
    with locked(d):  # released on the error
        pass


@pytest.mark.slow  # three interpreter start-ups
def test_a_second_process_on_a_run_directory_is_refused_while_the_first_finishes_intact(tmp_path):
    run = tmp_path / "run"
    args = [*TRAIN[:TRAIN.index("--steps")], "--steps", "200", *TRAIN[TRAIN.index("--steps") + 2:], "log_every=10",
            "--run-dir", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "poskit.cli", *args], env=env)
    try:
        deadline = time.time() + 120
        while not (run / CHECKPOINT_FILE).exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)  # paused mid-run, its lock held, so the others meet it for sure
        assert first.poll() is None, "the first run ended before the others could start"
        second = subprocess.run([sys.executable, "-m", "poskit.cli", *args], env=env, capture_output=True, text=True,
                                timeout=120)
        resumed = subprocess.run([sys.executable, "-m", "poskit.cli", "train", "--resume", "--quiet", "--run-dir",
                                  str(run)], env=env, capture_output=True, text=True, timeout=120)
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=300) == 0
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
    for refused in (second, resumed):
        assert refused.returncode == 2, refused.stderr
        assert f"{run / LOCK_FILE}: the directory is in use by process {first.pid}" in refused.stderr
        assert refused.stderr.count("\n") == 1
    results = read_results(run / RESULTS_FILE)  # checked against config.json and the checkpoint
    assert results["steps"] == 200 and json.loads((run / CONFIG_FILE).read_text())["max_steps"] == 200
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if "train_loss" in x]
    assert steps == list(range(10, 201, 10))  # one writer: no interleaved or repeated records
    assert (run / LOCK_FILE).read_text() == ""  # released on exit
