"""Multi-process training: `poskit train` under torchrun (2 gloo processes on CPU) against a one-process run
of the same global batch, with DDP and FSDP2, resumed across a change in the number of processes; and the
pieces (launch environment, the rank's rows, the batch split check) on their own."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.util.config_check import ConfigError
from poskit.tasks.base import Batch
from poskit.training import CONFIG_FILE, RESULTS_FILE, TrainConfig, load_run, preflight, read_metrics, train
from poskit.training.distributed import Processes, check_batch_split, local_rows, processes_from_env
from thread_helpers import single_thread

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = str(Path(__file__).resolve().parents[1] / "src")
# flip-flop rows hold different numbers of targets, so the ranks' shares of a batch do too: the loss must be
# normalised by the global target count for the runs to agree
ARGS = ["--task", "flip-flop", "--encoding", "pope", "--steps", "30", "--batch-size", "8", "--quiet",
        "model.d_model=16", "model.n_layers=2", "model.n_heads=2", "task_options.length=16",
        "task_options.eval_size=64", "task_options.eval_batch_size=64", "checkpoint_every=10", "eval_every=10",
        "log_every=1", "warmup_steps=4"]


def _cfg() -> TrainConfig:
    from poskit.cli import _base_config, build_parser

    args = build_parser().parse_args(["train", *ARGS])
    return _base_config(args, args.encoding)


def _torchrun(*argv: str) -> None:
    """`poskit <argv>` as 2 gloo processes on this machine, one thread each."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           "-m", "poskit.cli", *argv]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _losses(run: Path) -> list[float]:
    return [m["train_loss"] for m in read_metrics(run) if "train_loss" in m]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("dist") / "one"
    with single_thread():
        train(_cfg(), run, quiet=True)
    return run


def _assert_same_run(got: Path, ref: Path) -> None:
    a, b = _losses(ref), _losses(got)
    assert len(a) == len(b) == 30
    # float32 rounding differs (half batches, the all-reduce's order), nothing else does
    assert torch.allclose(torch.tensor(b), torch.tensor(a), rtol=1e-5, atol=1e-6), (a, b)
    ref_model, _, _ = load_run(ref)
    got_model, _, _ = load_run(got)
    for (name, p), q in zip(ref_model.state_dict().items(), got_model.state_dict().values()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5), name
    ra, rb = (json.loads((r / RESULTS_FILE).read_text()) for r in (ref, got))
    for split in ra["splits"]:
        assert rb["splits"][split]["loss"] == pytest.approx(ra["splits"][split]["loss"], rel=1e-4)


@pytest.mark.slow
def test_ddp_two_processes_equal_one_then_resume_with_one(one_process_run, tmp_path):
    # 20 steps as 2 DDP processes (each with 4 of the 8 rows), then the last 10 resumed by one process
    run = tmp_path / "ddp"
    _torchrun("train", *ARGS, "--run-dir", str(run), "--stop-after", "20")
    assert json.loads((run / CONFIG_FILE).read_text())["world_size"] == 2
    assert len(_losses(run)) == 20
    assert train(None, run, resume=True, quiet=True)["world_size"] == 1
    assert json.loads((run / CONFIG_FILE).read_text())["world_size"] == 1
    _assert_same_run(run, one_process_run)


@pytest.mark.slow
def test_fsdp_resumed_by_two_processes_equals_one(one_process_run, tmp_path):
    # gloo carries FSDP2's all-gathers and reduce-scatters on CPU (torch 2.13): 10 steps by one process, then
    # 20 more by 2 processes with sharded parameters and optimizer state
    run = tmp_path / "fsdp"
    from poskit.cli import main

    assert main(["train", *ARGS, "--parallel", "fsdp", "--run-dir", str(run), "--stop-after", "10"]) == 0
    _torchrun("train", "--resume", "--run-dir", str(run), "--quiet")
    assert json.loads((run / RESULTS_FILE).read_text())["world_size"] == 2
    _assert_same_run(run, one_process_run)


@pytest.mark.slow
def test_compare_runs_unchanged_under_torchrun(tmp_path):
    out = tmp_path / "cmp"
    _torchrun("compare", *[a for a in ARGS if a not in ("--encoding", "pope")], "--encodings", "rope,pope",
              "--seeds", "0", "--steps", "4", "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"rope", "pope"}
    for label in ("rope", "pope"):
        assert json.loads((out / label / "seed0" / RESULTS_FILE).read_text())["world_size"] == 2


# -- the pieces

def test_launch_environment_is_read_and_checked():
    assert processes_from_env({}) == Processes()
    assert processes_from_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Processes(1, 4, 1)
    for env, fragment in (({"WORLD_SIZE": "2"}, "RANK is unset"),
                          ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be a non-negative integer, got 'x'"),
                          ({"RANK": "2", "WORLD_SIZE": "2"}, "0 <= RANK < WORLD_SIZE")):
        with pytest.raises(ValueError, match=fragment):
            processes_from_env(env)


@settings(max_examples=50, deadline=None)
@given(world=st.integers(1, 6), per_rank=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_property_ranks_hold_disjoint_blocks_that_make_up_the_global_batch(world, per_rank, seed):
    g = torch.Generator().manual_seed(seed)
    n = world * per_rank
    batch = Batch(torch.randperm(n * 3, generator=g)[:n, None].repeat(1, 3), torch.randint(0, 5, (n, 3), generator=g))
    parts = [local_rows(batch, Processes(r, world, r)) for r in range(world)]
    assert all(p.inputs.shape[0] == per_rank for p in parts)
    assert torch.equal(torch.cat([p.inputs for p in parts]), batch.inputs)
    assert torch.equal(torch.cat([p.targets for p in parts]), batch.targets)
    rows = [set(p.inputs[:, 0].tolist()) for p in parts]  # inputs' first column is a permutation: row ids
    assert all(not (rows[i] & rows[j]) for i in range(world) for j in range(i + 1, world))


def test_a_batch_the_processes_cannot_share_is_refused_before_any_file(tmp_path):
    cfg = _cfg()
    with pytest.raises(ConfigError, match=r"batch_size must be a multiple of the number of processes \(3\).*got 8"):
        check_batch_split(cfg.batch_size, Processes(0, 3, 0))
    with pytest.raises(ConfigError, match="batch_size must be a multiple of the number of processes"):
        preflight(cfg, Processes(0, 3, 0))
    check_batch_split(8, Processes(1, 4, 1))  # 2 rows each
    odd = Batch(torch.zeros(5, 3, dtype=torch.long), torch.zeros(5, 3, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"multiple of the number of processes \(2\).*got 5"):
        local_rows(odd, Processes(0, 2, 0))  # never a silently dropped row
    with pytest.raises(ConfigError, match=r"world_size must be 1, the number of processes of this launch"):
        train(TrainConfig.from_dict({**cfg.to_dict(), "world_size": 2}), tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()


def test_cli_refuses_an_indivisible_batch_under_a_launch_with_one_line(tmp_path, monkeypatch, capsys):
    from poskit.cli import main

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "3"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        main(["train", *ARGS, "--run-dir", str(tmp_path / "r")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batch_size must be a multiple of the number of processes (3)" in err
    assert not (tmp_path / "r").exists()


def test_a_one_process_run_records_world_size_one(tmp_path):
    cfg = TrainConfig.from_dict({**_cfg().to_dict(), "max_steps": 2, "eval_every": 2, "final_eval_batches": 1})
    train(cfg, tmp_path / "r", quiet=True)
    assert json.loads((tmp_path / "r" / CONFIG_FILE).read_text())["world_size"] == 1
    assert json.loads((tmp_path / "r" / RESULTS_FILE).read_text())["world_size"] == 1


# -- a rank that dies: the others stop with one line naming themselves and what to do

GLOO_PEER_GONE = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                  "[127.0.0.1]:21930: Connection reset by peer. This is typically caused by a remote worker hanging "
                  "or bugs in the application. Check the logs of the remote worker before reporting an error.")


def test_a_collective_whose_peer_is_gone_is_one_line_naming_the_rank():
    from poskit.training.distributed import PeerLost, peers_watched

    with pytest.raises(PeerLost, match=r"^rank 1 of 2: lost contact with another process of this run \(connection "
                                       r"reset by peer\): it stopped or was killed.*launch the run again with "
                                       r"--resume") as e:
        with peers_watched(Processes(1, 2, 1)):
            raise RuntimeError(GLOO_PEER_GONE)
    assert "\n" not in str(e.value) and isinstance(e.value, OSError)  # the CLI's one-line errors


@pytest.mark.parametrize("procs, error", [
    (Processes(0, 2, 0), RuntimeError("mat1 and mat2 shapes cannot be multiplied")),  # not a lost peer
    (Processes(0, 2, 0), ValueError("Connection reset by peer")),  # not a backend's error
    (Processes(), RuntimeError(GLOO_PEER_GONE)),  # one process: no peers to lose
])
def test_other_errors_pass_unchanged(procs, error):
    from poskit.training.distributed import peers_watched

    with pytest.raises(type(error)) as e:
        with peers_watched(procs):
            raise error
    assert e.value is error


@pytest.mark.slow
def test_a_killed_rank_stops_the_other_with_one_line(tmp_path):
    """Two ranks launched by hand (torchrun would stop the survivor itself): rank 1 is killed mid-run, and rank 0
    ends at once with one line naming itself and --resume, not a gloo traceback or a hang."""
    import signal
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "r"
    argv = [sys.executable, "-m", "poskit.cli", "train", *[a if a != "30" else "100000" for a in ARGS],
            "--run-dir", str(run)]
    base = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen(argv, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while not [m for m in (read_metrics(run) if (run / "metrics.jsonl").exists() else []) if "train_loss" in m]:
            assert time.monotonic() < deadline and all(p.poll() is None for p in ranks), \
                [p.communicate() for p in ranks if p.poll() is not None]
            time.sleep(0.5)
        ranks[1].send_signal(signal.SIGKILL)
        _, err = ranks[0].communicate(timeout=120)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert ranks[0].returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poskit train: error: rank 0 of 2: lost contact with another "
                                                   "process of this run ("), err[-3000:]
    assert "--resume" in lines[0]
