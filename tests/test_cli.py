"""The `poskit` command end to end at tiny sizes: train, compare, extrapolate, reproduce, demo, bad input."""
import json
import pytest
import torch

from poskit.cli import build_parser, main

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "eval_every=4", "log_every=2",
        "checkpoint_every=4", "warmup_steps=1"]
FF = ["task_options.length=16", "task_options.eval_size=32", "task_options.eval_batch_size=32"]
LM = ["task_options.context=16", "final_eval_batches=1", "eval_batches=1", "batch_size=4"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("command", [[], ["train"], ["compare"], ["extrapolate"], ["demo"], ["reproduce"], ["list"]])
def test_help_everywhere(command, capsys):
    with pytest.raises(SystemExit) as e:
        main(command + ["--help"])
    assert e.value.code == 0
    assert "usage: poskit" in capsys.readouterr().out


def test_console_script_is_installed(capsys):
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "poskit"]
    assert ep.value == "poskit.cli:main" and ep.load() is main
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "pope" in out and "indirect-indexing" in out


def test_train_writes_a_run_directory_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--task", "flip-flop", "--encoding", "pope", "--steps", "8", "--run-dir", str(run), "--quiet",
            *TINY, *FF]
    assert main(argv + ["--stop-after", "4"]) == 0
    assert "continue with" in capsys.readouterr().out
    assert not (run / "results.json").exists()
    assert main(["train", "--resume", "--run-dir", str(run), "--quiet"]) == 0  # the run's own config is used
    out = capsys.readouterr().out
    assert "8 steps" in out and "ood_sparse accuracy" in out
    results = json.loads((run / "results.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert results["steps"] == 8 and config["model"]["encoding"] == "pope" and config["model"]["d_model"] == 16
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4 + 2  # 4 loss lines, 2 evaluations


def test_config_file_and_overrides(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"lr": 1e-3, "model": {"d_model": 24, "mlp": "swiglu"}}))
    run = tmp_path / "r"
    main(["train", "--task", "flip-flop", "--encoding", "alibi", "--config", str(cfg), "--steps", "2",
          "--run-dir", str(run), "--quiet", "model.n_heads=2", "model.n_layers=1", *FF])
    saved = json.loads((run / "config.json").read_text())
    assert saved["lr"] == 1e-3 and saved["model"]["d_model"] == 24 and saved["model"]["mlp"] == "swiglu"
    assert saved["model"]["n_heads"] == 2


@pytest.mark.parametrize("argv,needle", [
    (["train", "--task", "sudoku", "--encoding", "rope"], "task must be one of"),
    (["train", "--task", "flip-flop"], "--encoding is required"),
    (["train", "--task", "flip-flop", "--encoding", "rotary"], "encoding must be one of"),
    (["train", "--task", "flip-flop", "--encoding", "rope", "model.width=3"], "unknown model config field"),
    (["train", "--task", "flip-flop", "--encoding", "rope", "oops"], "overrides must look like key=value"),
    (["compare", "--task", "flip-flop", "--encodings", "rope,rotary"], "encodings must name one of"),
    (["compare", "--task", "flip-flop", "--encodings", "rope", "--seeds", "a,b"], "--seeds must be"),
    (["reproduce", "sorting"], "NAME must be one of"),
    (["extrapolate", "/nonexistent/run"], "runs must be"),
    (["extrapolate", "/nonexistent/run", "--rope-scaling", "cubic"], "rope scaling must be one of"),
])
def test_bad_input_exits_with_a_message_naming_the_argument(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_compare_end_to_end(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--task", "flip-flop", "--encodings", "rope,pope:delta_init=uniform", "--seeds", "0,1",
                 "--steps", "6", "--out", str(out), "--workers", "1", "--quiet", *TINY, *FF]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "flip-flop" and results["metric"] == "accuracy"
    assert set(results["encodings"]) == {"rope", "pope:delta_init=uniform"}
    for e in results["encodings"].values():
        assert len(e["per_seed"]) == 2 and 0 <= e["mean"] <= 1 and e["std"] >= 0
        assert abs(e["mean"] - sum(e["per_seed"]) / 2) < 1e-12
    pope_cfg = json.loads((out / "pope_delta_init_uniform" / "seed1" / "config.json").read_text())
    assert pope_cfg["model"]["encoding_options"] == {"delta_init": "uniform"} and pope_cfg["seed"] == 1
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "results.md").read_text()
    assert "| rope |" in table and "ood_sparse" in table
    # resuming a finished compare reuses its runs instead of retraining
    mtime = (out / "rope" / "seed0" / "checkpoint.pt").stat().st_mtime_ns
    main(["compare", "--task", "flip-flop", "--encodings", "rope,pope:delta_init=uniform", "--seeds", "0,1",
          "--steps", "6", "--out", str(out), "--workers", "1", "--quiet", "--resume", *TINY, *FF])
    assert (out / "rope" / "seed0" / "checkpoint.pt").stat().st_mtime_ns == mtime


def test_compare_in_parallel_processes(tmp_path):
    out = tmp_path / "par"
    main(["compare", "--task", "flip-flop", "--encodings", "none,alibi", "--seeds", "0", "--steps", "4",
          "--out", str(out), "--workers", "2", "--quiet", *TINY, *FF])
    assert set(json.loads((out / "results.json").read_text())["encodings"]) == {"none", "alibi"}


def test_extrapolate_end_to_end(tmp_path, capsys):
    runs = []
    for enc in ("rope", "pope"):
        run = tmp_path / enc
        main(["train", "--task", "shakespeare", "--encoding", enc, "--steps", "3", "--run-dir", str(run), "--quiet",
              *TINY, *LM])
        runs.append(str(run))
    main(["extrapolate", *runs, "--lengths", "1x,2x,64", "--rope-scaling", "yarn,linear", "--n-chars", "2048",
          "--workers", "1", "--out", str(tmp_path / "ex"), "--quiet"])
    report = json.loads((tmp_path / "ex" / "extrapolation.json").read_text())
    assert set(report["sweeps"]) == {"rope", "rope+yarn", "rope+linear", "pope"}
    rows = report["sweeps"]["pope"]
    assert [r["length"] for r in rows] == [16, 32, 64] and [r["multiple"] for r in rows] == [1, 2, 4]
    assert all(r["perplexity"] > 1 and r["last_perplexity"] > 1 for r in rows)
    # at 1x the scaled variants (factor 1) equal plain rope
    assert abs(report["sweeps"]["rope+linear"][0]["perplexity"] - report["sweeps"]["rope"][0]["perplexity"]) < 1e-6
    assert abs(report["sweeps"]["rope+yarn"][-1]["perplexity"] - report["sweeps"]["rope"][-1]["perplexity"]) > 1e-6
    assert (tmp_path / "ex" / "extrapolation.png").exists()
    assert "| rope+yarn |" in capsys.readouterr().out


def test_reproduce_end_to_end_at_tiny_size(tmp_path):
    out = tmp_path / "rep"
    main(["reproduce", "counting", "--steps", "3", "--out", str(out), "--encodings", "relative,cope", "--workers", "1",
          "--quiet", "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "task_options.max_steps=8",
          "task_options.eval_size=16", "eval_every=3", "batch_size=4"])
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "counting" and set(results["encodings"]) == {"relative", "cope"}
    assert set(results["encodings"]["cope"]["splits"]) == {"validation", "test", "ood_longer", "ood_shorter"}


def test_demo_end_to_end_at_tiny_budget(tmp_path, capsys):
    main(["demo", "--out", str(tmp_path / "demo"), "--train-seconds", "0.5", "--context", "16", "--n-chars", "1024",
          "--diagnostic-steps", "2", "--workers", "1", "--encodings", "rope,pope", "--quiet"])
    out = capsys.readouterr().out
    assert "Zero-shot length extrapolation" in out and "| pope |" in out and "Diagnostic" in out
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert [r["length"] for r in report["sweeps"]["rope"]] == [16, 32, 64, 128]
    assert report["steps"]["rope"] >= 1
    assert (tmp_path / "demo" / "extrapolation.png").exists() and (tmp_path / "demo" / "diagnostic" / "compare.png").exists()


def test_parser_lists_every_command():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"train", "compare", "extrapolate", "demo", "reproduce", "list"}
