"""`poskit reproduce context-extension`: the grids planned into jobs and directories without training, the YaRN
band counts the config states, the passkey-context definitions, and one tiny end-to-end run of the runner (a
monkeypatched grid) through the registry, resumed without recomputing."""
import dataclasses
import json

import pytest

from poskit.experiments.configs.context_extension import CONTEXT_EXTENSION, Grid
from poskit.experiments.context_extension import passkey_contexts, plan, reproduce, yarn_bands
from poskit.experiments.registry import EXPERIMENTS, experiment

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_default_grid_plans_every_method_at_every_scale_in_its_own_directory(tmp_path):
    p = plan(CONTEXT_EXTENSION, tmp_path / "out")
    grid = CONTEXT_EXTENSION.default
    assert [job.run_dir for job in p.bases] == [str(tmp_path / "out" / "bases" / "seed0" / s) for s in grid.setups]
    configs = {name: job.config for (_, name), job in zip(p.base_keys, p.bases)}
    assert configs["rope"]["task_options"] == {"context": 64, "passkey_fraction": 0.5}
    assert configs["rope-control"]["task_options"]["passkey_fraction"] == 0.0
    assert configs["rope-b500"]["model"]["encoding_options"] == {"base": 500}
    assert configs["pope"]["model"]["encoding"] == "pope"
    assert {c["max_steps"] for c in configs.values()} == {grid.pretrain_steps}
    chains = {(c.setup, c.method, c.scale): c for c in p.chains}
    for setup in ("rope", "rope-b500"):
        for method in ("pi", "ntk", "yarn"):
            for s in (4, 8, 16):
                c = chains[(setup, method, s)]
                assert c.steps == (0, 25, 50, 100, 200, 400) and c.context == 64 * s
                assert c.run_dir == str(tmp_path / "out" / "extend" / "seed0" / setup / f"{method}-s{s}")
                assert c.eval_dir == str(tmp_path / "out" / "evals" / "seed0" / setup / f"{method}-s{s}")
        assert chains[(setup, "dynamic", 16)].steps == (0,)  # zero-shot only
    # direct fine-tuning and PoPE keep the base's encoding: their step 0 is the base itself ("none")
    assert chains[("rope", "direct", 8)].steps == chains[("pope", "pope", 8)].steps == (25, 50, 100, 200, 400)
    assert chains[("rope", "none", None)].steps == (0,) and chains[("rope", "none", None)].run_dir is None
    assert ("rope-control", "none", None) in chains and not [c for c in p.chains if c.setup == "rope-control"
                                                             and c.method != "none"]
    assert chains[("rope-b500", "yarn", 4)].encoding == "rope-yarn:beta_fast=4:beta_slow=1"
    assert chains[("rope", "yarn", 4)].encoding == "rope-yarn"
    assert chains[("rope", "pi", 4)].evaluation.lengths == (64, 128, 256, 512, 1024)
    assert not (tmp_path / "out").exists()  # planning writes nothing


def test_the_quick_grid_and_the_commands_restrictions(tmp_path):
    quick = plan(CONTEXT_EXTENSION, tmp_path, quick=True)
    assert quick.grid is CONTEXT_EXTENSION.quick and len(quick.chains) < len(plan(CONTEXT_EXTENSION, tmp_path).chains)
    p = plan(CONTEXT_EXTENSION, tmp_path, seeds=[0, 1], steps=60, scales=[2, 4], overrides=["model.d_model=64"])
    assert p.steps == (0, 25, 50, 60) and p.scales == (2, 4) and p.seeds == (0, 1)
    # the command's arguments, as the results record stores them and resolves them again
    assert p.arguments == {"quick": False, "seeds": [0, 1], "steps": 60, "variants": "2,4",
                           "overrides": ["model.d_model=64"]}
    assert quick.arguments == {"quick": True, "seeds": None, "steps": None, "variants": None, "overrides": []}
    assert {c.scale for c in p.chains} == {None, 2, 4} and {c.seed for c in p.chains} == {0, 1}
    assert all(job.config["model"]["d_model"] == 64 for job in p.bases)
    for kwargs, message in [({"seeds": [0, 0]}, "--seeds must be distinct"), ({"scales": [0]}, "--variants"),
                            ({"steps": -1}, "--steps"), ({"overrides": ["task_options.context=32"]}, "base context"),
                            ({"overrides": ["lr=-1"]}, "lr must be > 0")]:
        with pytest.raises(ValueError, match=message):
            plan(CONTEXT_EXTENSION, tmp_path, **kwargs)


def test_the_runner_refuses_what_it_does_not_take(tmp_path):
    exp = experiment("context-extension", "reproduction")
    with pytest.raises(ValueError, match="--encodings: context-extension trains its own base models"):
        reproduce(exp, out_dir=tmp_path / "x", encodings=["rope"])
    with pytest.raises(ValueError, match="--preset"):
        reproduce(exp, out_dir=tmp_path / "x", preset="paper")
    with pytest.raises(ValueError, match="--variants are the scales"):
        reproduce(exp, out_dir=tmp_path / "x", variants="a,b")
    assert not (tmp_path / "x").exists()


def test_yarn_bands_at_the_default_config_and_where_they_are_populated():
    # head_dim 32 at a 64-token context: pair 0 turns 10.2 times, so nothing reaches beta_fast = 32
    default = yarn_bands(32, 10000.0, 64, 32, 1)
    assert default["by_definition"] == {"kept": 0, "ramp": 5, "interpolated": 11}
    assert default["as_computed"] == {"kept": 1, "ramp": 4, "interpolated": 11}  # the ramp starts at dim 0
    assert default["rotations"][0] == pytest.approx(64 / (2 * 3.141592653589793), abs=1e-3)
    populated = yarn_bands(32, 500.0, 64, 4, 1)
    assert populated["by_definition"] == populated["as_computed"] == {"kept": 3, "ramp": 3, "interpolated": 10}
    # a smaller base alone leaves the kept band empty
    assert yarn_bands(32, 500.0, 64, 32, 1)["by_definition"]["kept"] == 0


def test_passkey_context_and_effective_window_definitions():
    rows = [{"length": 64, "accuracy": 1.0}, {"length": 128, "accuracy": 0.9}, {"length": 256, "accuracy": 0.5},
            {"length": 512, "accuracy": 0.85}]
    assert passkey_contexts(rows, 0.8) == (128, 512)  # PI's window stops at the first failure; YaRN's does not
    assert passkey_contexts(rows, 0.95) == (64, 64)
    assert passkey_contexts([{"length": 64, "accuracy": 0.1}], 0.8) == (0, 0)


TINY_PRETRAIN = {**CONTEXT_EXTENSION.pretrain, "task_options": {"context": 32},
                 "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope"}, "batch_size": 4,
                 "warmup_fraction": None, "warmup_steps": 0, "checkpoint_every": 2, "final_eval_batches": 1}
TINY_GRID = Grid("tiny", setups=("rope", "pope"), scales=(2,), steps=(0, 1), pretrain_steps=2, lengths=(1, 2),
                 n_chars=128, depths=(0.0,), trials=1, methods=("pi", "dynamic", "pope"))


def test_a_tiny_run_end_to_end_through_the_registry_and_its_resume(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("POSKIT_FUSED_DECODE", "0")  # PoPE's exact decode: compiling its kernel takes longer than this
    key = ("reproduction", "context-extension")
    settings = dataclasses.replace(CONTEXT_EXTENSION, pretrain=TINY_PRETRAIN, context=32, quick=TINY_GRID,
                                   checkpoint_every=1)
    monkeypatch.setitem(EXPERIMENTS, key, dataclasses.replace(EXPERIMENTS[key], settings=settings))
    out = tmp_path / "out"
    results = experiment("context-extension", "reproduction").run(out_dir=out, workers=1, quiet=True, quick=True)
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(results["rows"]))
    rows = {(r["setup"], r["method"], r["scale"], r["step"]) for r in results["rows"]}
    assert rows == {("rope", "none", None, 0), ("rope", "pi", 2, 0), ("rope", "pi", 2, 1), ("rope", "dynamic", 2, 0),
                    ("pope", "none", None, 0), ("pope", "pope", 2, 0), ("pope", "pope", 2, 1)}
    row = next(r for r in results["rows"] if (r["method"], r["step"]) == ("pi", 1))
    assert set(row["perplexity"]) == {"32", "64"} and row["passkey"]["lengths"] == [32, 64]
    assert row["encoding"]["name"] == "rope-linear" and row["encoding"]["options"]["factor"] == 2.0
    assert row["token_fraction"] == pytest.approx(1 * 2 * 64 / (2 * 4 * 32))  # the base's tokens per step
    zero = next(r for r in results["rows"] if (r["method"], r["step"]) == ("pope", 0))
    none = next(r for r in results["rows"] if (r["setup"], r["method"]) == ("pope", "none"))
    assert zero["perplexity"] == none["perplexity"] and zero["regression_1x"] == 0.0
    assert results["grid"]["name"] == "tiny" and set(results["bands"]) == {"rope"}
    for name in ("results.md", "steps-rope.png", "steps-pope.png", "passkey/rope-pi-s2-step1.png"):
        assert (out / name).is_file(), name
    assert (out / "extend" / "seed0" / "rope" / "pi-s2" / "checkpoint.json").is_file()
    _check_record(out, results)
    # resumed: every evaluation is read back, nothing is trained or evaluated again
    evals = sorted((out / "evals").rglob("step-*.json"))
    stamps = {p: p.stat().st_mtime_ns for p in evals}
    again = experiment("context-extension", "reproduction").run(out_dir=out, workers=1, quiet=True, quick=True,
                                                                 resume=True)
    assert again["rows"] == results["rows"] and {p: p.stat().st_mtime_ns for p in evals} == stamps
    with pytest.raises(ValueError, match="pass --resume to continue it"):
        experiment("context-extension", "reproduction").run(out_dir=out, workers=1, quiet=True, quick=True)


def _check_record(out, results):
    """The run's results.json is a results record (report/record.py): provenance, the resolved configuration that
    today's code resolves again (not stale), one group per (setup, s) with the numbers at the extended context."""
    from poskit.experiments.evidence import resolve_today
    from poskit.report.record import read_record
    from poskit.report.results_tables import summary_table, values_table
    from poskit.report.staleness import stale_label

    record = read_record(out / "results.json")
    assert (record.name, record.kind) == ("context-extension", "reproduction")
    assert record.command.startswith("poskit reproduce context-extension --quick --out ")
    assert record.arguments["quick"] is True and stale_label(record, resolve_today) is None
    assert set(record.resolved["encodings"]) == {"rope", "rope-linear", "rope-dynamic", "pope"}
    assert record.resolved["grid"]["steps"] == [0, 1] and record.resolved["base"]["max_steps"] == 2
    groups = record.measurements["groups"]
    assert list(groups) == ["rope s=2", "pope s=2"]
    assert list(groups["rope s=2"]) == ["none", "pi", "dynamic"] and list(groups["pope s=2"]) == ["none", "pope"]
    pi = next(r for r in results["rows"] if (r["method"], r["step"]) == ("pi", 1))
    [run] = groups["rope s=2"]["pi"]
    assert run["steps"] == 1 and run["splits"]["extended"]["perplexity"] == pi["perplexity"]["64"]
    assert run["splits"]["step 0"]["perplexity"] == next(
        r for r in results["rows"] if (r["method"], r["step"]) == ("pi", 0))["perplexity"]["64"]
    assert run["splits"]["1x"]["perplexity"] == pi["perplexity"]["32"]
    assert run["splits"]["extended"]["regression_1x"] == pi["regression_1x"]
    # the none row of a group is the base at the group's length
    [none] = groups["pope s=2"]["none"]
    assert none["splits"]["extended"]["perplexity"] == next(
        r for r in results["rows"] if (r["setup"], r["method"]) == ("pope", "none"))["perplexity"]["64"]
    # the generated tables of docs/ can be made from it
    assert "| rope s=2 | pi |" in values_table(record, split="extended")
    assert "step 1 perplexity" in summary_table(record)


def test_the_command_line_runs_the_quick_grid_and_refuses_quick_elsewhere(monkeypatch, tmp_path, capsys):
    from poskit.cli import main
    from poskit.experiments import context_extension

    planned = []

    def fake_run_plan(p, **kwargs):  # what would run, without training anything
        planned.append(p)
        p.out_dir.mkdir(parents=True)
        for name in ("results.json", "results.md"):
            (p.out_dir / name).write_text("{}")
        return {}

    monkeypatch.setattr(context_extension, "run_plan", fake_run_plan)
    assert main(["reproduce", "context-extension", "--quick", "--out", str(tmp_path / "q")]) == 0
    assert main(["reproduce", "context-extension", "--out", str(tmp_path / "d")]) == 0
    assert [p.grid.name for p in planned] == ["quick", "default"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["reproduce", "flip-flop", "--quick", "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert "--quick applies only to reproductions with a smaller grid (context-extension), not 'flip-flop'" in err
    assert not (tmp_path / "f").exists()
