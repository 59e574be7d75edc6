"""The real-data reproductions (jsb, maestro, genome, text, text-cope, code, text-extrapolation, ablations):
registered, valid at both presets, `--preset paper` applying the paper's settings, and a tiny smoke run of each
(files written, NLL finite, plots written) where its corpus is present (skipped, saying why, where it is not)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from poskit.cli import main
from poskit.data import CorpusNotPresent, get_corpus
from poskit.experiments import reproduce
from poskit.encodings.spec import EncodingSpec
from poskit.experiments.registry import EXPERIMENTS, experiment
from poskit.experiments.reproduce import preset_config, run_reproduction
from poskit.training import TrainConfig
from extras import skip_without

REAL_DATA = ("jsb", "maestro", "genome", "text", "text-cope", "code", "text-extrapolation", "ablations")
CORPUS_OF_TASK = {f"lm-{c}": c for c in ("jsb", "maestro", "genome", "wiki", "plays", "code")}


def _get(cfg: dict, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


@pytest.mark.parametrize("name", REAL_DATA)
def test_registered_and_valid_at_both_presets(name):
    r = experiment(name, "reproduction").settings
    default = TrainConfig.from_dict(preset_config(r, None))
    assert default.preset == "default" and default.task in CORPUS_OF_TASK
    EncodingSpec.parse_list(r.encodings)  # every encoding spec parses (names and options exist)
    paper = preset_config(r, "paper")
    assert paper["preset"] == "paper" and r.paper_preset, f"{name} has no paper preset"
    for dotted, value in r.paper_preset.items():
        assert _get(paper, dotted) == value
    TrainConfig.from_dict(paper)  # the paper's settings are valid fields with valid values
    assert preset_config(r, None) == r.config  # the default preset leaves the record's config alone
    for key, value in r.config.get("task_options", {}).items():  # CPU task options the paper preset keeps
        if key not in ("context",) and f"task_options.{key}" not in r.paper_preset:
            assert paper["task_options"][key] == value


@pytest.mark.parametrize("name", REAL_DATA)
def test_paper_preset_reaches_the_tasks_paper_sequence_length(name):
    """The task built from the paper config has the task's paper context (or the one the preset sets), not
    the CPU default's: the CPU config's explicit context must not override it."""
    from poskit.tasks import _lookup

    r = experiment(name, "reproduction").settings
    cfg = preset_config(r, "paper")
    want = r.paper_preset.get("task_options.context", _lookup(cfg["task"]).paper_params.get("context"))
    built = {**_lookup(cfg["task"]).paper_params, **cfg["task_options"]}  # build_task's order: paper, then explicit
    assert want is not None and built["context"] == want != r.config["task_options"]["context"]


def test_jsb_paper_preset_is_the_papers_table_6_and_7_column():
    cfg = TrainConfig.from_dict(preset_config(experiment("jsb", "reproduction").settings, "paper"))
    m = cfg.model
    assert (m.d_model, m.n_heads, m.n_layers, m.dropout) == (256, 8, 6, 0.2)  # Table 6, JSB
    assert (cfg.batch_size, cfg.lr, cfg.min_lr, cfg.beta2, cfg.max_steps, cfg.warmup_steps) == (4, 6e-4, 6e-5, 0.99, 3000, 10)


def test_bad_preset_is_refused_naming_it(capsys):
    with pytest.raises(ValueError, match=r"preset must be one of \['default', 'paper'\], got 'huge'"):
        preset_config(experiment("jsb", "reproduction").settings, "huge")
    with pytest.raises(SystemExit):
        main(["reproduce", "jsb", "--preset", "huge"])
    assert "--preset" in capsys.readouterr().err


def _replace_settings(monkeypatch, name: str, **changes) -> None:
    """The registry's reproduction `name` with `changes` to its settings, for this test only."""
    key = ("reproduction", name)
    exp = EXPERIMENTS[key]
    monkeypatch.setitem(EXPERIMENTS, key, dataclasses.replace(exp, settings=dataclasses.replace(exp.settings, **changes)))


def _present(task: str) -> None:
    try:
        get_corpus(CORPUS_OF_TASK[task]).source.locate()
    except CorpusNotPresent as e:
        pytest.skip(str(e))
    except ImportError as e:  # the corpus's reader is an optional package
        skip_without("data", str(e))


TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "task_options.context=16", "eval_every=1",
        "eval_batches=1", "final_eval_batches=1", "log_every=1", "batch_size=4"]


@pytest.mark.slow  # loads (and on a fresh cache tokenises) a slice of a real corpus: 5-20 s each when loaded
@pytest.mark.parametrize("name", REAL_DATA)
def test_smoke_each_reproduction_at_tiny_size(name, tmp_path, monkeypatch):
    r = experiment(name, "reproduction").settings
    _present(r.config["task"])
    if r.extrapolation:  # a short sweep: two lengths, a few hundred tokens
        _replace_settings(monkeypatch, name, extrapolation={**r.extrapolation, "lengths": "1x,2x", "n_chars": 128})
    specs = EncodingSpec.parse_list(r.encodings)[:2]  # the first two encodings: the comparison's core
    out = tmp_path / name
    results = run_reproduction(name, out_dir=out, seeds=[0, 1], encodings=specs, steps=2, workers=1, quiet=True,
                               overrides=TINY + ["task_options.max_documents=6"])
    assert set(results["encodings"]) == {s.label for s in specs}
    for label, per_split in results["nll"].items():
        entry = per_split[r.split]
        assert len(entry["per_seed"]) == 2 and all(math.isfinite(v) and v > 0 for v in entry["per_seed"])
        # NLL is the log of the perplexity the compare reports, seed by seed
        ppl = results["encodings"][label]["splits"][r.split]["per_seed"]
        assert [math.exp(v) for v in entry["per_seed"]] == pytest.approx(ppl, rel=1e-6)
    saved = json.loads((out / "results.json").read_text())
    assert saved["nll"] == results["nll"]
    assert "NLL per token" in (out / "results.md").read_text()
    assert (out / "compare.png").stat().st_size > 0
    if r.extrapolation:
        sweep = out / "extrapolation"
        assert (sweep / "extrapolation.png").stat().st_size > 0
        rows = [row for rows in results["extrapolation"]["sweeps"].values() for row in rows]
        assert rows and all(math.isfinite(row["perplexity"]) for row in rows)
        assert "zero-shot length extrapolation" in (out / "results.md").read_text()


def test_an_extrapolation_sweep_is_checked_before_training(tmp_path, monkeypatch):
    r = experiment("text-extrapolation", "reproduction").settings
    _replace_settings(monkeypatch, "text-extrapolation", extrapolation={**r.extrapolation, "scalings": ("stretch",)})
    trained = []
    monkeypatch.setattr(reproduce, "train_and_report", lambda *a, **k: trained.append(1))
    monkeypatch.setattr(reproduce, "plan_compare", lambda *a, **k: type("P", (), {"dirs": {}})())
    with pytest.raises(ValueError, match="extrapolation scalings must be among .*'stretch'"):
        run_reproduction("text-extrapolation", out_dir=tmp_path / "x", steps=1)
    assert not trained and not (tmp_path / "x").exists()


def test_text_size_refuses_the_paper_preset_by_name():
    with pytest.raises(ValueError, match=r"--preset paper is not available here: the PoPE paper's three sizes"):
        preset_config(experiment("text-size", "reproduction").settings, "paper")


@pytest.mark.slow  # loads a slice of the Wikipedia extract and trains four tiny models
def test_text_size_sweeps_every_size_and_records_each_models_sweep(tmp_path, monkeypatch):
    """A reproduction with variants and an extrapolation sweep (text-size: one compare per width) sweeps each
    variant's runs and keeps every model's sweep in its record, named by its variant."""
    from poskit.experiments.configs import Variant
    from poskit.report.record import read_record
    from poskit.report.results_tables import extrapolation_table_of

    r = experiment("text-size", "reproduction").settings
    _present(r.config["task"])
    _replace_settings(monkeypatch, "text-size", variants=(Variant(8), Variant(16)),
                      extrapolation={**r.extrapolation, "lengths": "1x,2x", "n_chars": 128})
    tiny = [o for o in TINY if not o.startswith("model.d_model")]
    out = tmp_path / "size"
    results = run_reproduction("text-size", out_dir=out, steps=2, workers=1, quiet=True,
                               overrides=tiny + ["task_options.max_documents=6"])
    assert set(results["variants"]) == {"8", "16"}
    sweeps = results["extrapolation"]["sweeps"]
    assert {name.split(" ")[0] for name in sweeps} == {"d_model=8", "d_model=16"}
    assert len(sweeps) == 4 and all(len(rows) == 2 for rows in sweeps.values())
    for value in ("8", "16"):
        assert (out / f"d_model_{value}" / "extrapolation" / "extrapolation.png").stat().st_size > 0
    record = read_record(out / "results.json")
    assert set(record.measurements["groups"]) == {"8", "16"}
    table = extrapolation_table_of(record)
    assert "| d_model=8 " in table and "| d_model=16 " in table and "2x (32)" in table
