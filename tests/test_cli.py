"""The `poskit` command end to end at tiny sizes: train, compare, extrapolate, reproduce, demo, bad input."""
import json
import pytest

from poskit.training import read_metrics
import torch

from poskit.cli import build_parser, main
from poskit.training import CHECKPOINT_FILE

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "eval_every=4", "log_every=2",
        "checkpoint_every=4", "warmup_steps=1"]
FF = ["task_options.length=16", "task_options.eval_size=32", "task_options.eval_batch_size=32"]
LM = ["task_options.context=16", "final_eval_batches=1", "eval_batches=1", "batch_size=4"]


# tiny matrices: one thread is faster, and avoids OpenMP spin-waiting on a busy machine (conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("command", [[], ["train"], ["compare"], ["extrapolate"], ["demo"], ["reproduce"], ["analyze"], ["list"]])
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


def test_python_dash_m_runs_the_command():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "poskit.cli", "--version"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("poskit "), r.stderr


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
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # 4 loss lines, 2 evaluations (each of the eval split and of flip-flop's 3 curve splits, its default), and
    # beside each evaluation where PoPE's phase bias sits
    assert [sorted(r)[0] for r in records if "train_loss" not in r].count("encoding") == 2
    assert [r["split"] for r in records if "split" in r] == ["validation", "test", "ood_sparse", "ood_dense"] * 2
    assert sum("train_loss" in r for r in records) == 4 and len(records) == 4 + 2 * 4 + 2


@pytest.mark.parametrize("content,needle", [("[1, 2]", "--config must hold a JSON object of TrainConfig fields"),
                                             ("{lr: 1}", "--config must be a JSON file"),
                                             ('{"lr": "fast"}', "lr must be a number, got 'fast'")])
def test_bad_config_file(content, needle, tmp_path, capsys):
    (tmp_path / "c.json").write_text(content)
    with pytest.raises(SystemExit):
        main(["train", "--task", "flip-flop", "--encoding", "rope", "--config", str(tmp_path / "c.json"),
              "--run-dir", str(tmp_path / "r")])
    assert needle in capsys.readouterr().err and not (tmp_path / "r").exists()


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
    (["train", "--task", "sudoku", "--encoding", "rope"], "--task must be one of"),
    (["train", "--task", "flip-flop"], "--encoding is required"),
    (["train", "--task", "flip-flop", "--encoding", "rotary"], "--encoding: encoding must be one of"),
    (["train", "--task", "flip-flop", "--encoding", "rope", "model.width=3"], "unknown model config field"),
    (["train", "--task", "flip-flop", "--encoding", "rope", "oops"], "overrides must look like key=value"),
    (["compare", "--task", "flip-flop", "--encodings", "rope,rotary"], "--encodings: encoding must be one of"),
    (["compare", "--task", "flip-flop", "--encodings", "rope", "--seeds", "a,b"], "--seeds must be"),
    (["reproduce", "sorting"], "NAME must be one of"),
    (["extrapolate", "/nonexistent/run"], "runs must be"),
    (["extrapolate", "/nonexistent/run", "--rope-scaling", "cubic"], "rope scaling must be one of"),
    (["extrapolate", "/nonexistent/run", "--split", "train"], "--split must be one of ['validation', 'test']"),
])
def test_bad_input_exits_with_a_message_naming_the_argument(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


TRAIN = ["train", "--task", "flip-flop", "--encoding", "rope", "--steps", "4", "--run-dir", "{out}", "--quiet"]
COMPARE = ["compare", "--task", "flip-flop", "--encodings", "rope,alibi", "--seeds", "0", "--steps", "2",
           "--out", "{out}", "--quiet"]


@pytest.mark.parametrize("argv,needle", [
    (TRAIN + ["lr=abc"], "lr must be a number, got 'abc'"),
    (TRAIN + ["model.dropout=abc"], "model.dropout must be a number, got 'abc'"),
    (TRAIN + ["bf16=maybe"], "bf16 must be true or false, got 'maybe'"),
    (TRAIN + ["model.tie_embeddings=no"], "model.tie_embeddings must be true or false, got 'no'"),
    (TRAIN + ["batch_size=2.5"], "batch_size must be an integer, got 2.5"),
    (TRAIN + ["model.n_layers=two"], "model.n_layers must be an integer, got 'two'"),
    (TRAIN + ["beta2=5"], "beta2 must be in [0, 1), got 5.0"),
    (TRAIN + ["eval_split=train"], "eval_split must be one of the splits of task 'flip-flop': "
                                   "['validation', 'test', 'ood_sparse', 'ood_dense'], got 'train'"),
    (TRAIN + ["loss_on=first"], 'loss_on must be "task", "last" or a non-empty list of distinct target indices'),
    (TRAIN + ["loss_on=[]"], "loss_on must be"),
    (TRAIN + ["loss_on=[500]"], "loss_on=[500] keeps no target of this batch"),  # more reads than a row has
    (TRAIN + ["task_options.lenght=8"], "task_options.lenght must be a parameter of task 'flip-flop'"),
    (TRAIN + ["task_options.length=7"], "length must be even"),  # a task option's value: checked by building the task
    (TRAIN + ["model.encoding_options.bogus=1"], "bogus"),  # an encoding option: checked by building the model
    (TRAIN + ["device=gpu"], "device must be a torch device"),
    (TRAIN + ["--steps", "0"], "--steps must be a positive integer, got 0"),
    (TRAIN + ["--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
    (TRAIN + ["--lr", "-1"], "--lr must be a positive number, got -1.0"),
    (TRAIN + ["--stop-after", "0"], "--stop-after must be a positive integer, got 0"),
    (TRAIN + ["--config", "{out}.json"], "--config must be an existing JSON file"),
    (COMPARE + ["--split", "bogus"], "--split must be one of the splits of task 'flip-flop'"),
    (COMPARE + ["--workers", "0"], "--workers must be a positive integer, got 0"),
    (COMPARE + ["--steps", "0"], "--steps must be a positive integer, got 0"),
    (COMPARE + ["beta1=1"], "beta1 must be in [0, 1), got 1.0"),
    (COMPARE + ["--seeds", "0,0"], "seeds must list at least one seed, none twice"),
    (["reproduce", "counting", "--out", "{out}", "--variants", "2"],
     "--variants must be a comma-separated subset of [1, 3, 5] (n_vars), got '2'"),
    (["reproduce", "flip-flop", "--out", "{out}", "--variants", "1"], "--variants applies only to reproductions with variants"),
    (["reproduce", "counting", "--out", "{out}", "task_options.n_vars=2"], "task_options.n_vars is what the counting "
                                                                           "reproduction varies"),
    (["reproduce", "counting", "--out", "{out}", "--workers", "0"], "--workers must be a positive integer"),
    (["demo", "--out", "{out}", "--workers", "0"], "--workers must be a positive integer"),
    (["demo", "--out", "{out}", "--lengths", "1x,abc"], "--lengths must be"),
    # one encoding spec parser for every flag that names encodings: a duplicated key, an unknown option, a bad
    # bool are refused naming the flag, the option and what is allowed
    (["compare", "--task", "flip-flop", "--encodings", "rope:base=100:base=200", "--out", "{out}"],
     "--encodings: encoding option rope:base must be given once, got ['100', '200'] (in 'rope:base=100:base=200')"),
    (["train", "--task", "flip-flop", "--encoding", "rope:base=100:base=200", "--run-dir", "{out}"],
     "--encoding: encoding option rope:base must be given once"),
    (["train", "--task", "flip-flop", "--encoding", "pope:softplus=maybe", "--run-dir", "{out}"],
     "--encoding: encoding option pope:softplus must be true or false (true/false/1/0/yes/no, any case), got 'maybe'"),
    (["reproduce", "flip-flop", "--out", "{out}", "--encodings", "rope,pope:bogus=1"],
     "--encodings: encoding option pope:bogus must be one of pope's options ["),
    (["demo", "--out", "{out}", "--encodings", "rope,pope:bogus=1"],
     "--encodings: encoding option pope:bogus must be one of pope's options ["),
    (["demo", "--out", "{out}", "--encodings", "rope,rope"], "--encodings: the list must be distinct specs"),
    (["digits", "--out", "{out}", "--encodings", "rope:base=500"],
     "--encodings: digits builds its encodings itself (axial rope and pope); give names only, got 'rope:base=500'"),
    (["digits", "--out", "{out}", "--encodings", "rope,alibi"], "--encodings must be among ['none', 'learned', "),
    (["analyze", "decay", "--out", "{out}", "--encodings", "rope:base=500"],
     "--encodings: analyze decay builds each encoding with its defaults; give names only, got 'rope:base=500'"),
    (["reproduce", "--out", "{out}"], "NAME is required (one of "),
])
def test_bad_input_stops_before_anything_is_created(argv, needle, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main([a.replace("{out}", str(out)) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err  # one line, no traceback
    assert not out.exists()  # stopped before any directory (or any training)


def test_train_takes_an_encoding_spec(tmp_path, monkeypatch, capsys):
    """`--encoding` takes the spec that compare and reproduce take; its options reach the saved config, and the
    default run directory is named by the spec, so that two specs of one encoding do not share it."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--task", "flip-flop", "--encoding", "pope:delta_init=uniform:softplus=No", "--steps", "1",
                 *TINY, *FF]) == 0
    run = tmp_path / "runs" / "flip-flop-pope_delta_init_uniform_softplus_No-seed0"
    saved = json.loads((run / "config.json").read_text())["model"]
    assert saved["encoding"] == "pope" and saved["encoding_options"] == {"delta_init": "uniform", "softplus": False}
    assert "flip-flop / pope:delta_init=uniform:softplus=No: 1 steps" in capsys.readouterr().out
    # a spec's options are merged over the config's: naming fewer options than were saved is no change
    assert main(["train", "--resume", "--run-dir", str(run), "--encoding", "pope:delta_init=uniform", "--quiet"]) == 0


def test_resume_applies_a_longer_steps_and_refuses_other_changes(tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", "--task", "flip-flop", "--encoding", "pope", "--steps", "8", "--run-dir", str(run), "--quiet",
            *TINY, *FF]
    assert main(base + ["--stop-after", "4"]) == 0
    for extra, needle in ((["--lr", "0.5"], "where lr is 0.003; got 0.5"),
                          (["model.d_model=32"], "where model.d_model is 16; got 32"),
                          (["--encoding", "rope"], "where model.encoding is 'pope'; got 'rope'"),
                          (["--steps", "6"], "where max_steps is 8; got 6"),
                          (["bf16=true"], "where bf16 is False; got True")):
        with pytest.raises(SystemExit) as e:
            main(["train", "--resume", "--run-dir", str(run), "--quiet", *extra])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and "only max_steps (--steps) may change" in err, err
    assert not (run / "results.json").exists()  # nothing was trained by the refused resumes
    # flags equal to the saved values are no change; --steps above the saved max_steps extends the run
    assert main(["train", "--resume", "--run-dir", str(run), "--quiet", "--encoding", "pope", "--steps", "12"]) == 0
    assert "12 steps" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["max_steps"] == 12
    assert json.loads((run / "results.json").read_text())["steps"] == 12
    # a finished run resumed without changes reports its results and trains nothing
    mtime = (run / CHECKPOINT_FILE).stat().st_mtime_ns
    assert main(["train", "--resume", "--run-dir", str(run), "--quiet"]) == 0
    assert "12 steps" in capsys.readouterr().out and (run / CHECKPOINT_FILE).stat().st_mtime_ns == mtime


def test_resume_cannot_extend_a_time_budget_run(tmp_path, capsys):
    run = tmp_path / "budget"
    assert main(["train", "--task", "flip-flop", "--encoding", "rope", "--train-seconds", "0.5", "--stop-after", "2",
                 "--run-dir", str(run), "--quiet", *TINY, *FF]) == 0
    planned = json.loads((run / "config.json").read_text())["max_steps"]
    with pytest.raises(SystemExit):
        main(["train", "--resume", "--run-dir", str(run), "--quiet", "--steps", str(planned + 10)])
    assert "--steps cannot extend" in capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["max_steps"] == planned


def test_resume_help_states_the_rule(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--steps N with N above the saved max_steps extends the run" in text
    assert "any other flag or key=value that changes the saved config is an error" in text


def test_loss_on_list_from_the_command_line(tmp_path):
    run = tmp_path / "r"
    assert main(["train", "--task", "flip-flop", "--encoding", "rope", "--steps", "2", "--run-dir", str(run),
                 "--quiet", "loss_on=[-2,-1]", *TINY, *FF]) == 0
    assert json.loads((run / "config.json").read_text())["loss_on"] == [-2, -1]


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
    mtime = (out / "rope" / "seed0" / CHECKPOINT_FILE).stat().st_mtime_ns
    main(["compare", "--task", "flip-flop", "--encodings", "rope,pope:delta_init=uniform", "--seeds", "0,1",
          "--steps", "6", "--out", str(out), "--workers", "1", "--quiet", "--resume", *TINY, *FF])
    assert (out / "rope" / "seed0" / CHECKPOINT_FILE).stat().st_mtime_ns == mtime
    # existing runs are neither overwritten without --resume nor resumed with other settings
    for extra, needle in (([], "already holds runs"), (["--resume", "--lr", "0.5"], "where lr is 0.003; got 0.5")):
        with pytest.raises(SystemExit):
            main(["compare", "--task", "flip-flop", "--encodings", "rope,pope:delta_init=uniform", "--seeds", "0,1",
                  "--steps", "6", "--out", str(out), "--workers", "1", "--quiet", *extra, *TINY, *FF])
        assert needle in capsys.readouterr().err
    assert (out / "rope" / "seed0" / CHECKPOINT_FILE).stat().st_mtime_ns == mtime


def test_compare_keeps_each_curve_split_s_learning_curve_and_plots_them(tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", "--task", "flip-flop", "--encodings", "rope,alibi", "--seeds", "0,1", "--steps", "6",
                 "--out", str(out), "--workers", "1", "--quiet", *TINY, *FF, "eval_every=3",
                 'curve_splits=["ood_dense"]']) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["curves"]) == ["validation", "ood_dense"]
    for split, by_label in results["curves"].items():
        for label, curve in by_label.items():
            assert curve["steps"] == [3, 6]
            per_seed = [[m["accuracy"] for m in read_metrics(out / label / f"seed{s}") if m.get("split") == split]
                        for s in (0, 1)]
            assert curve["mean"] == pytest.approx([(a + b) / 2 for a, b in zip(*per_seed)], abs=1e-12)
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


REPRO_TINY = ["--steps", "3", "--encodings", "relative,cope", "--workers", "1", "--quiet", "model.d_model=16",
              "model.n_heads=2", "model.n_layers=1", "task_options.max_steps=8", "task_options.eval_size=16",
              "eval_every=3", "batch_size=4"]


def test_reproduce_counting_covers_1_3_and_5_variables(tmp_path, capsys):
    from poskit.experiments.registry import experiment

    r = experiment("counting", "reproduction").settings
    assert [v.value for v in r.variants] == [1, 3, 5] and "1 and 5 variables with 1 seed" in r.summary
    out = tmp_path / "rep"
    assert main(["reproduce", "counting", "--out", str(out), "--seeds", "0", *REPRO_TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "counting" and results["variant_field"] == "task_options.n_vars"
    assert list(results["variants"]) == ["1", "3", "5"]
    for n in (1, 3, 5):
        v = results["variants"][str(n)]
        assert set(v["encodings"]) == {"relative", "cope"} and v["config"]["task_options"]["n_vars"] == n
        assert set(v["encodings"]["cope"]["splits"]) == {"validation", "test", "ood_longer", "ood_shorter"}
        saved = json.loads((out / f"n_vars_{n}" / "cope" / "seed0" / "config.json").read_text())
        assert saved["task_options"]["n_vars"] == n
    table = (out / "results.md").read_text()
    assert table == capsys.readouterr().out.split("wrote ")[0].rstrip("\n") + "\n"  # printed as written
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| n_vars | encoding |")
    assert [line.split(" | ")[0:2] for line in lines[1:]] == [
        ["| 1", "relative"], ["| 1", "cope"], ["| 3", "relative"], ["| 3", "cope"], ["| 5", "relative"], ["| 5", "cope"]]


def test_reproduce_variants_option_and_default_seeds(tmp_path):
    out = tmp_path / "rep"
    assert main(["reproduce", "counting", "--out", str(out), "--variants", "5", *REPRO_TINY]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["variants"]) == ["5"] and not (out / "n_vars_1").exists()
    assert results["variants"]["5"]["seeds"] == [0]  # 5 variables: one seed by default (3 variables: three)


def test_reproduce_without_variants_at_tiny_size(tmp_path):
    out = tmp_path / "ff"
    assert main(["reproduce", "flip-flop", "--out", str(out), "--steps", "2", "--seeds", "0", "--encodings", "rope",
                 "--workers", "1", "--quiet", *TINY, *FF]) == 0
    assert set(json.loads((out / "results.json").read_text())["encodings"]) == {"rope"}


def test_demo_end_to_end_at_tiny_budget(tmp_path, capsys):
    main(["demo", "--out", str(tmp_path / "demo"), "--train-seconds", "0.5", "--context", "16", "--n-chars", "1024",
          "--diagnostic-steps", "2", "--workers", "1", "--encodings", "rope,pope", "--quiet"])
    out = capsys.readouterr().out
    assert "Zero-shot length extrapolation" in out and "| pope |" in out and "Diagnostic" in out
    report = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert [r["length"] for r in report["sweeps"]["rope"]] == [16, 32, 64, 128]
    assert report["steps"]["rope"] >= 1
    assert (tmp_path / "demo" / "extrapolation.png").exists() and (tmp_path / "demo" / "diagnostic" / "compare.png").exists()
    from poskit.report.record import absolute_paths, read_record

    record = read_record(tmp_path / "demo" / "results.json")  # the demo's results record
    assert (record.kind, record.name) == ("demo", "demo") and set(record.measurements["groups"]) == {"lm", "diagnostic"}
    assert [r["run"] for r in record.measurements["groups"]["lm"]["pope"]] == ["lm/pope"]
    assert [r["run"] for r in record.measurements["groups"]["diagnostic"]["rope"]] == ["diagnostic/rope/seed0"]
    assert record.details["extrapolation"]["sweeps"] == report["sweeps"] and record.arguments["context"] == 16
    assert absolute_paths(record.to_dict()) == []


def test_demo_keeps_the_options_of_its_encoding_specs(tmp_path):
    """`--encodings` options reach the language models and the diagnostic, never dropped silently."""
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--train-seconds", "0.2", "--context", "8", "--n-chars", "256",
                 "--lengths", "1x", "--diagnostic-steps", "1", "--workers", "1", "--encodings",
                 "pope:delta_init=uniform", "--quiet"]) == 0
    for run in (out / "lm" / "pope_delta_init_uniform", out / "diagnostic" / "pope_delta_init_uniform" / "seed0"):
        model = json.loads((run / "config.json").read_text())["model"]
        assert (model["encoding"], model["encoding_options"]) == ("pope", {"delta_init": "uniform"}), run
    report = json.loads((out / "demo.json").read_text())
    assert list(report["sweeps"]) == ["pope:delta_init=uniform"]


def test_list_and_reproduce_list_read_one_registry(capsys):
    from poskit.experiments.registry import experiments

    assert main(["reproduce", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    reproductions = experiments("reproduction")
    assert [line.split()[0] for line in lines] == [e.name for e in reproductions]
    assert "translation" in [e.name for e in reproductions]  # the encoder-decoder one too
    assert lines[0].endswith(reproductions[0].summary)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    sections = out.split("\nstudies:\n")
    assert "translation" in sections[0] and "translation" not in sections[1]  # listed as a reproduction
    for e in experiments("study") + experiments("demo"):
        assert e.name in sections[1] and e.summary in out


def test_parser_lists_every_command():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"train", "compare", "extrapolate", "demo", "reproduce", "study", "convert-checkpoint",
                                "analyze", "finetune-glue", "digits", "list", "data", "export", "report", "extend",
                                "passkey", "kernel"}
