"""The experiment registry: one record type for reproductions, studies and demos, each runner reachable, and the
commands (`poskit list`, `reproduce --list`, `reproduce NAME`, `demo`, `digits`) reading it alone."""
import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from poskit.cli import build_parser, main
from poskit.encodings.spec import EncodingSpec
from poskit.experiments import reproduce, translation
from poskit.experiments.registry import EXPERIMENTS, KINDS, Experiment, experiment, experiments


def test_every_experiment_is_one_record_with_a_runner_and_a_summary():
    assert {e.kind for e in experiments()} == set(KINDS)
    for (kind, name), e in EXPERIMENTS.items():
        assert isinstance(e, Experiment) and (e.kind, e.name) == (kind, name)
        module, _, function = e.runner.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), e.runner
        assert isinstance(e.summary, str) and e.summary and "\n" not in e.summary
    for e in experiments("reproduction"):
        EncodingSpec.parse_list(e.settings.encodings)  # every default spec parses
        assert e.table == "results.md" and e.outputs[0] == "results.json"


def test_unknown_names_and_kinds_are_refused_with_the_names_of_the_kind():
    with pytest.raises(ValueError, match=r"NAME must be one of \['indirect-indexing', 'indirect-indexing-paper'\], got 'flip-flop'"):
        experiment("flip-flop", "study", arg="NAME")
    with pytest.raises(ValueError, match="kind must be one of"):
        experiments("paper")
    with pytest.raises(ValueError, match="kind must be one of"):
        Experiment("x", "paper", None, "m:f")


def test_run_reproduction_dispatches_translation_through_the_registry(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(translation, "run_translation", lambda name, **kw: seen.update(kw, name=name) or {})
    reproduce.run_reproduction("translation", out_dir=tmp_path, preset="paper", encodings=["rope"], steps=3)
    assert seen["name"] == "translation" and seen["preset"] == "paper" and seen["steps"] == 3
    reproduce.run_reproduction("translation", out_dir=tmp_path, preset="default")
    assert seen["preset"] == "cpu"  # the CPU-scale default of an encoder-decoder reproduction
    with pytest.raises(ValueError, match="--variants does not apply to translation"):
        reproduce.run_reproduction("translation", out_dir=tmp_path, variants="1")


def test_a_new_reproduction_is_one_registry_entry(monkeypatch, tmp_path, capsys):
    """Added to the registry, a reproduction is listed, named in the help, and run by `poskit reproduce` with
    every flag passed to its runner: the command has no case of its own for any reproduction."""
    seen = {}

    def fake_runner(exp, **arguments):
        seen.update(arguments, experiment=exp)
        Path(arguments["out_dir"]).mkdir(parents=True)
        (Path(arguments["out_dir"]) / "results.md").write_text("| toy |\n")
        return {}

    flip_flop = experiment("flip-flop", "reproduction")
    toy = dataclasses.replace(flip_flop, name="toy", settings=dataclasses.replace(flip_flop.settings, summary="a toy"))
    monkeypatch.setitem(EXPERIMENTS, ("reproduction", "toy"), toy)
    monkeypatch.setattr(reproduce, "reproduce", fake_runner)
    out = tmp_path / "out"
    assert main(["reproduce", "toy", "--out", str(out), "--seeds", "3,4", "--encodings", "rope:base=500",
                 "--steps", "5", "--workers", "1", "--preset", "paper", "--resume", "--quiet", "lr=0.1"]) == 0
    assert seen["experiment"] is toy and seen["seeds"] == [3, 4] and seen["encodings"] == [EncodingSpec.parse("rope:base=500")]
    assert (seen["steps"], seen["workers"], seen["preset"], seen["resume"], seen["quiet"], seen["overrides"],
            seen["variants"]) == (5, 1, "paper", True, True, ["lr=0.1"], None)
    printed = capsys.readouterr().out
    assert printed.startswith("| toy |") and f"wrote {out / 'results.json'}, {out / 'results.md'}" in printed
    assert main(["reproduce", "--list"]) == 0
    assert any(line.split() == ["toy", "a", "toy"] for line in capsys.readouterr().out.splitlines())
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert "toy" in sub.choices["reproduce"].format_help()


def test_the_demos_flags_default_to_their_registry_settings():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    demo = experiment("demo", "demo").settings
    args = sub.choices["demo"].parse_args([])
    assert (args.encodings, args.train_seconds, args.context, args.lengths, args.n_chars, args.diagnostic_steps,
            args.workers, args.out) == (",".join(demo.encodings), demo.train_seconds, demo.context, demo.lengths,
                                        demo.n_chars, demo.diagnostic_steps, demo.workers, demo.out_dir)
    assert demo.summary in " ".join(build_parser().format_help().split())


def test_digits_runs_through_the_registry_with_the_flags_applied(monkeypatch, tmp_path, capsys):
    import poskit.experiments.digits as digits

    seen = {}

    def fake_run_digits(settings, out_dir, *, quiet):
        seen.update(settings=settings, out_dir=out_dir, quiet=quiet)
        return {"settings": dataclasses.asdict(settings), "wall_seconds": 0.0, "encodings": {}}

    monkeypatch.setattr(digits, "run_digits", fake_run_digits)
    assert main(["digits", "--out", str(tmp_path), "--encodings", "rope,none", "--seeds", "5", "--epochs", "2",
                 "--quiet"]) == 0
    settings = seen["settings"]
    assert (settings.encodings, settings.seeds, settings.epochs) == (("rope", "none"), (5,), 2)
    assert settings.dim == experiment("digits", "demo").settings.dim and seen["quiet"] is True
    assert json.dumps(dataclasses.asdict(settings))  # the summary is no field: results.json stays as it was
    assert "summary" not in dataclasses.asdict(settings)
