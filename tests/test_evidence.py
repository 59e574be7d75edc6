"""The evidence machinery: the results record every experiment writes (schema, provenance, the resolved
configuration, no machine paths), `poskit report collect`, the tables `poskit report` generates between markers
and `--check`, staleness, the coverage table, and the ownership of compare directories."""
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.cli import main
from poskit.experiments.evidence import resolve, resolve_today
from poskit.report import coverage, markers
from poskit.report.record import (RecordError, ResultsRecord, absolute_paths, portable_command, read_record,
                                  resolve_encoding)
from poskit.report.staleness import differences, setting_name, stale_label, stale_reasons

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--steps", "2", "--workers", "1", "--quiet", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
        "task_options.length=16", "task_options.eval_size=16", "eval_every=2", "batch_size=4"]


def snapshot(root: Path) -> dict:
    """Every file under `root` (path -> bytes) and every directory, to compare before and after a refused call."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def flip_flop(tmp_path_factory) -> Path:
    """A tiny `poskit reproduce flip-flop` (rope and pope, 2 seeds, 2 steps) with an absolute --out."""
    out = tmp_path_factory.mktemp("repro") / "ff"
    assert main(["reproduce", "flip-flop", "--out", str(out), "--seeds", "0,1", "--encodings", "rope,pope", *TINY]) == 0
    return out


def _repo(tmp_path: Path, readme: str = "") -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(readme)
    return root


# ------------------------------------------------------------------------------------------------ the record

def test_a_reproduction_writes_one_results_record_with_provenance_and_every_seed(flip_flop):
    record = read_record(flip_flop / "results.json")
    assert (record.name, record.kind) == ("flip-flop", "reproduction")
    assert record.command.startswith("poskit reproduce flip-flop --out ") and "--seeds 0,1" in record.command
    assert record.arguments["seeds"] == [0, 1] and record.arguments["encodings"] == ["rope", "pope"]
    assert record.arguments["steps"] == 2 and "model.d_model=16" in record.arguments["overrides"]
    assert record.code["poskit_version"] and set(record.code) == {"poskit_version", "git_commit", "dirty"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record.date)
    assert set(record.machine) == {"cpu", "cores", "torch", "python", "os"} and record.machine["cores"] >= 1
    assert record.wall_seconds > 0
    # every seed of every encoding, each run's numbers exactly as its own results.json holds them
    groups = record.measurements["groups"]
    assert list(groups) == [""] and list(groups[""]) == ["rope", "pope"]
    for label in ("rope", "pope"):
        runs = groups[""][label]
        assert [r["seed"] for r in runs] == [0, 1] and [r["run"] for r in runs] == [f"{label}/seed0", f"{label}/seed1"]
        for r in runs:
            own = json.loads((flip_flop / r["run"] / "results.json").read_text())
            assert r["splits"]["test"]["accuracy"] == own["splits"]["test"]["accuracy"] and r["steps"] == 2
    # the paper's numbers beside them, and the fields compare's readers use kept
    numbers = record.paper["numbers"][0]
    assert numbers["rows"]["cope"] == [0.0, 4.9] and numbers["columns"] == ["in-distribution", "OOD"]
    data = json.loads((flip_flop / "results.json").read_text())
    assert data["metric"] == "accuracy" and set(data["encodings"]) == {"rope", "pope"}
    assert data["runs"] == {"rope": ["rope/seed0", "rope/seed1"], "pope": ["pope/seed0", "pope/seed1"]}


def test_the_record_holds_no_machine_path(flip_flop):
    text = (flip_flop / "results.json").read_text()
    assert str(flip_flop.parent) not in text and str(Path.home()) + "/" not in text
    assert absolute_paths(json.loads(text)) == []
    assert absolute_paths({"a": ["x", {"b": "poskit compare --out /tmp/x"}]}) == [".a[1].b: poskit compare --out /tmp/x"]


def test_the_resolved_configuration_has_every_option_with_its_default(flip_flop):
    from poskit.training import TrainConfig

    record = read_record(flip_flop / "results.json")
    pope = record.resolved["encodings"]["pope"]
    assert pope["options"]["delta_projection"] is False and pope["options"]["delta_init"] == "zero"
    assert pope["options"]["base"] == 10000.0 and pope["options"]["softplus"] is True
    fields = set(TrainConfig.from_dict({"task": "flip-flop"}).to_dict()) - {"seed"}
    assert set(record.resolved["base"]) == fields and record.resolved["base"]["model"]["d_model"] == 16
    assert "encoding" not in record.resolved["base"]["model"]  # set per run: in resolved["encodings"]
    # the same resolution today: not stale
    assert stale_label(record, resolve_today) is None


def test_resolve_encoding_fills_in_the_constructor_defaults_and_keeps_given_options():
    given_ = resolve_encoding("pope:delta_init=uniform")
    assert given_["spec"] == "pope:delta_init=uniform" and given_["options"]["delta_init"] == "uniform"
    assert given_["options"]["delta_projection"] is False and given_["options"]["phase_bias"] is True
    assert resolve_encoding("rope")["fixed"] == {"scaling": "none"}
    jsb = resolve("reproduction", "jsb", {})
    assert set(jsb["encodings"]) == {"rope", "pope:delta_init=uniform", "none", "alibi"}
    counting = resolve("reproduction", "counting", {"variants": "1,5"})
    assert [v["value"] for v in counting["variants"]] == [1, 5]
    assert [v["base"]["task_options"]["n_vars"] for v in counting["variants"]] == [1, 5]


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=4),
       seeds=st.lists(st.integers(0, 99), min_size=1, max_size=4, unique=True))
def test_a_record_round_trips_through_its_json_form(values, seeds):
    runs = [{"seed": s, "run": f"rope/seed{s}", "steps": 3, "train_seconds": 0.5,
             "splits": {"test": {"accuracy": v}}} for s, v in zip(seeds, values)]
    record = ResultsRecord(name="x", kind="compare", command="poskit compare", arguments={"seeds": seeds},
                           code={"poskit_version": "0", "git_commit": None, "dirty": None}, date="2026-01-01T00:00:00Z",
                           machine={"cpu": "c", "cores": 2, "torch": "t", "python": "p", "os": "o"}, wall_seconds=1.0,
                           resolved={"base": {}}, measurements={"metric": "accuracy", "split": "test",
                                                                 "variant_field": None, "groups": {"": {"rope": runs}}},
                           paper=None, files=["results.md"], details={"task": "t"})
    again = ResultsRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record and again.to_dict() == record.to_dict()


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("schema"), "schema must be 'poskit.results'"),
    (lambda d: d.update(kind="paper"), "kind must be one of"),
    (lambda d: d.update(measurements={"groups": []}), "measurements must hold groups"),
    (lambda d: d.update(wall_seconds="long"), "'wall_seconds' must be a number"),
])
def test_a_malformed_record_is_refused_naming_the_file_and_field(flip_flop, tmp_path, change, message):
    data = json.loads((flip_flop / "results.json").read_text())
    change(data)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        read_record(path)


def test_the_command_of_a_record_has_no_machine_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = portable_command(["poskit", "reproduce", "jsb", "--out", str(tmp_path / "runs" / "x"),
                             f"--config={tmp_path / 'c.json'}", "--out", "/elsewhere/y"])
    assert line == "poskit reproduce jsb --out runs/x --config=c.json --out .../y"


# ------------------------------------------------------------------------------- collect, report and --check

def test_collect_report_and_check_on_a_readme_with_markers(flip_flop, tmp_path, capsys):
    root = _repo(tmp_path, "# poskit\n\n<!-- report: flip-flop table=summary -->\n<!-- /report -->\n\ntext\n\n"
                           "<!-- report: flip-flop table=seeds -->\nold\n<!-- /report -->\n")
    assert main(["report", "collect", str(flip_flop), "--root", str(root)]) == 0
    dest = root / "docs" / "results" / "flip-flop"
    # the plots and the results, no runs, no checkpoints
    assert sorted(p.name for p in dest.iterdir()) == ["compare.png", "curves.png", "results.json"]
    assert (dest / "results.json").read_bytes() == (flip_flop / "results.json").read_bytes()
    capsys.readouterr()
    assert main(["report", "--check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "README.md:3: table flip-flop table=summary differs" in out and "README.md:8: table flip-flop table=seeds" in out
    assert main(["report", "--root", str(root)]) == 0
    assert main(["report", "--check", "--root", str(root)]) == 0
    text = (root / "README.md").read_text()
    assert text.startswith("# poskit\n\n<!-- report: flip-flop table=summary -->\n*Measured by `poskit reproduce flip-flop")
    assert "\ntext\n" in text and "old" not in text and "(docs/results/flip-flop/results.json)" in text
    summary = text[:text.index("<!-- /report -->")]
    assert "| encoding | seeds | test accuracy (%) |" in summary and "| rope | 2 |" in summary
    assert "paper: test error (%) (in-distribution / OOD)" in summary and "| 1.8 / 20.3 |" in summary
    assert "`pope/seed1`" in text  # the per-seed table names each run
    # a hand edit of a generated table, or a changed results file, fails the check, naming file and table
    (root / "README.md").write_text(text.replace("| rope | 2 |", "| rope | 3 |", 1))
    assert main(["report", "--check", "--root", str(root)]) == 1
    assert "README.md:3: table flip-flop table=summary differs" in capsys.readouterr().out
    (root / "README.md").write_text(text)
    data = json.loads((dest / "results.json").read_text())
    data["measurements"]["groups"][""]["rope"][0]["splits"]["test"]["accuracy"] = 0.123
    (dest / "results.json").write_text(json.dumps(data))
    assert main(["report", "--check", "--root", str(root)]) == 1


def test_markers_in_code_blocks_and_sentences_are_examples_not_markers(tmp_path):
    text = ("Write `<!-- report: NAME table=KIND -->` on a line.\n\n```\n<!-- report: jsb table=summary -->\n"
            "<!-- /report -->\n```\n")
    root = _repo(tmp_path, text)
    assert markers.regenerate(root, resolve_today).files == {}


def test_a_table_without_results_says_not_backed_and_a_compact_table_lists_each(tmp_path):
    root = _repo(tmp_path, "<!-- report: jsb table=summary -->\n<!-- /report -->\n"
                           "<!-- report: jsb,maestro table=compact -->\n<!-- /report -->\n")
    outcome = markers.regenerate(root, resolve_today)
    text = outcome.files[root / "README.md"]
    assert "**Not backed by a results file:** docs/results/jsb/ holds no results.json" in text
    assert "`poskit report collect runs/jsb --name jsb`" in text and "| jsb |" not in text.split("| reproduction |")[0]
    assert "| jsb | — | — | not backed: no results file committed |" in text and "| maestro |" in text


@pytest.mark.parametrize("text, message", [
    ("<!-- report: jsb table=summary -->\n", "has no <!-- /report --> before the end of the file"),
    ("<!-- report: jsb table=summary -->\n<!-- report: jsb table=seeds -->\n<!-- /report -->\n",
     "has no <!-- /report --> before the next marker"),
    ("<!-- report: jsb table=pie -->\n<!-- /report -->\n", "table must be one of"),
    ("<!-- report: jsb table=summary colour=red -->\n<!-- /report -->\n", "options of table=summary"),
    ("<!-- report: table=summary -->\n<!-- /report -->\n", "must start with a results name"),
    ("<!-- report: a,b table=summary -->\n<!-- /report -->\n", "only for table=compact"),
    ("<!-- /report -->\n", "without an opening"),
    ("<!-- report: ../x table=seeds -->\n<!-- /report -->\n", "docs/results directory name"),
])
def test_a_malformed_marker_is_an_error_naming_file_and_line(tmp_path, text, message):
    root = _repo(tmp_path, "# t\n" + text)
    with pytest.raises(markers.MarkerError, match=re.escape("README.md:2: ") + ".*" + re.escape(message)):
        markers.regenerate(root, resolve_today)


def test_collect_refuses_a_file_that_is_not_a_results_record_and_a_bad_name(flip_flop, tmp_path):
    root = _repo(tmp_path)
    run = flip_flop / "rope" / "seed0"  # a single run's results.json: not an aggregate
    with pytest.raises(RecordError, match=re.escape(str(run / "results.json")) + ".*schema must be"):
        main_collect(run, root)
    with pytest.raises(ValueError, match="--name must be letters"):
        main_collect(flip_flop, root, "../escape")
    assert not (root / "docs" / "results").exists()


def main_collect(out, root, name=None):
    from poskit.report.collect import collect

    return collect(out, root, name)


def test_the_repository_readme_and_docs_are_what_their_results_generate():
    """`poskit report --check` on this repository: every marked table equals what docs/results generates (it
    passes while there are no markers), and the coverage table has a row for every table and figure."""
    outcome = markers.regenerate(ROOT, resolve_today)
    assert [f"{p.relative_to(ROOT)}:{b.line} {b.title}" for p, b in outcome.differing] == []
    assert outcome.coverage_problems == []


# ------------------------------------------------------------------------------------------------- staleness

def _fake_jsb(root: Path, delta_projection: bool) -> Path:
    """A results record of `poskit reproduce jsb` as if measured when PoPE's delta_projection default was
    `delta_projection` (no training: the resolution of today with that one option changed)."""
    resolved = resolve("reproduction", "jsb", {})
    resolved["encodings"]["pope:delta_init=uniform"]["options"]["delta_projection"] = delta_projection
    runs = {label: [{"seed": s, "run": f"{label}/seed{s}", "steps": 400, "train_seconds": 60.0,
                     "splits": {"test": {"loss": 0.7 + s / 100, "perplexity": 2.0}}} for s in (0, 1)]
            for label in resolved["encodings"]}
    record = ResultsRecord(
        name="jsb", kind="reproduction", command="poskit reproduce jsb", arguments={"seeds": None, "encodings": None,
                                                                                    "steps": None, "overrides": [],
                                                                                    "variants": None, "preset": None},
        code={"poskit_version": "0.1.0", "git_commit": "0" * 40, "dirty": False}, date="2026-11-23T18:00:00Z",
        machine={"cpu": "cpu", "cores": 2, "torch": "2", "python": "3", "os": "Linux"}, wall_seconds=540.0,
        resolved=resolved, measurements={"metric": "perplexity", "split": "test", "variant_field": None,
                                         "groups": {"": runs}}, paper=None)
    dest = root / "docs" / "results" / "jsb"
    dest.mkdir(parents=True, exist_ok=True)
    return record.write(dest)


def test_a_changed_default_makes_its_table_visibly_stale_until_regenerated(tmp_path):
    root = _repo(tmp_path, "<!-- report: jsb table=summary metric=loss -->\n<!-- /report -->\n")
    _fake_jsb(root, delta_projection=False)  # today's default: not stale
    assert main(["report", "--root", str(root)]) == 0
    fresh = (root / "README.md").read_text()
    assert "stale" not in fresh and "| pope:delta_init=uniform | 2 | 0.7050 ± 0.0071 |" in fresh
    assert main(["report", "--check", "--root", str(root)]) == 0
    _fake_jsb(root, delta_projection=True)  # measured when the default was to project
    assert main(["report", "--check", "--root", str(root)]) == 1  # the unlabelled table is out of date
    assert main(["report", "--root", str(root)]) == 0
    stale = (root / "README.md").read_text()
    assert ("**stale: measured with pope:delta_init=uniform:delta_projection=true, today's default is false** "
            "(rerun `poskit reproduce jsb` and `poskit report collect`)") in stale
    assert main(["report", "--check", "--root", str(root)]) == 0  # regenerated: the label is in the table


def test_staleness_compares_only_settings_both_sides_have():
    recorded = {"base": {"lr": 0.003, "model": {"d_model": 64}, "gone": 1},
                "encodings": {"pope": {"options": {"delta_projection": True}}}, "variants": [{"base": {"lr": 1}}]}
    today = {"base": {"lr": 0.001, "model": {"d_model": 64, "new": 2}},
             "encodings": {"pope": {"options": {"delta_projection": False}}}, "variants": [{"base": {"lr": 2}}]}
    assert [p for p, _, _ in differences(recorded, today)] == [
        ("base", "lr"), ("encodings", "pope", "options", "delta_projection"), ("variants", 0, "base", "lr")]
    assert stale_reasons(recorded, today) == ["lr=0.003, today's default is 0.001",
                                              "pope:delta_projection=true, today's default is false",
                                              "variants[0].lr=1, today's default is 2"]
    assert setting_name(("base", "model", "d_model")) == "model.d_model"
    # a command's default list of encodings that changed is a difference too
    assert stale_reasons({"encodings": {"rope": {}}}, {"encodings": {"rope": {}, "learned": {}}}) == [
        'encodings=["rope"], today\'s default is ["rope","learned"]']


def test_a_command_that_no_longer_resolves_is_stale(flip_flop):
    record = read_record(flip_flop / "results.json")
    record.name = "flip-flop-removed"
    assert stale_label(record, resolve_today).startswith("stale: its command no longer resolves on today's code")


# ---------------------------------------------------------------------------------------------- coverage

def test_the_coverage_table_has_a_row_for_every_table_and_figure_of_the_five_papers():
    assert coverage.problems() == []
    assert {p: len(items) for p, items in coverage.ITEMS.items()} == {"000": 14, "001": 4, "002": 9, "003": 5,
                                                                       "004": 18}
    for paper, items in coverage.ITEMS.items():
        assert {r.item for r in coverage.ROWS if r.paper == paper} == set(items)


def test_coverage_problems_name_a_missing_item_a_foreign_row_and_a_bad_status():
    rows = [r for r in coverage.ROWS if (r.paper, r.item) != ("004", "Fig. 5")]
    rows.append(coverage.Row("002", "Table 9", "", "no such table", "not run (n/a)"))
    rows.append(coverage.Row("000", "Fig. 1", "extra", "a claim", "reproduced"))
    found = coverage.problems(rows)
    assert "paper 004 (CoPE) Fig. 5: no row in the coverage table" in found
    assert any("row 002 'Table 9': not a table or figure of paper 002" in p for p in found)
    assert any("status 'reproduced' is not one of the allowed forms" in p for p in found)


def test_the_coverage_table_says_not_backed_for_evidence_not_committed(tmp_path):
    root = _repo(tmp_path)
    (root / "docs" / "reproductions.md").write_text("<!-- report: coverage table=coverage -->\n<!-- /report -->\n")
    _fake_jsb(root, delta_projection=False)
    text = markers.regenerate(root, resolve_today).files[root / "docs" / "reproductions.md"]
    rows = [line for line in text.splitlines() if line.startswith("| 0")]
    assert len(rows) == len(coverage.ROWS)
    jsb = next(line for line in rows if "| Table 2, JSB |" in line)
    assert "[jsb](results/jsb/results.json) (2026-11-23, 0.1.0 (0000000))" in jsb
    maestro = next(line for line in rows if "| Table 2, MAESTRO |" in line)
    assert "not backed (no `docs/results/maestro/`)" in maestro


# ------------------------------------------------------------------------------- compare directories owned

def test_compare_refuses_a_directory_it_does_not_own_and_changes_nothing(tmp_path, capsys):
    from poskit.training.run_dir import claim

    project = tmp_path / "project"
    project.mkdir()
    (project / "results.json").write_text('{"accuracy": 0.93}')
    (project / "notes.md").write_text("# mine\n")
    study = claim(tmp_path / "study", "study")
    for directory, message in ((project, "is not empty and was not written by poskit"),
                               (study, "is a poskit directory of kind 'study'")):
        before = snapshot(directory)
        with pytest.raises(SystemExit):
            main(["reproduce", "flip-flop", "--out", str(directory), "--seeds", "0", "--encodings", "rope", *TINY])
        assert message in capsys.readouterr().err
        assert snapshot(directory) == before


def test_a_busy_compare_directory_is_refused_and_an_older_one_is_adopted(tmp_path, capsys):
    from poskit.experiments.outputs import is_legacy_compare
    from poskit.training.run_dir import check, locked

    out = tmp_path / "cmp"
    (out / "rope" / "seed0").mkdir(parents=True)
    (out / "results.md").write_text("| table |\n")
    assert is_legacy_compare(out) and check(out, "compare", legacy=is_legacy_compare) == "legacy"
    with locked(out):  # another process writing the directory
        before = snapshot(out)
        with pytest.raises(SystemExit):
            main(["reproduce", "flip-flop", "--out", str(out), "--seeds", "0", "--encodings", "rope", *TINY])
        assert "the directory is in use by process" in capsys.readouterr().err
        assert snapshot(out) == before
    (out / "mine.txt").write_text("not a compare's")
    assert not is_legacy_compare(out)


# ------------------------------------------------------------------------------------- studies and analyses

def test_a_study_report_writes_a_record_of_its_finished_runs(tmp_path):
    from poskit.experiments.registry import experiment
    from poskit.experiments.study import OUTCOME_FILE, write_report

    exp = experiment("indirect-indexing", "study")
    first = exp.settings.runs[0]
    (tmp_path / first.name).mkdir()
    (tmp_path / first.name / OUTCOME_FILE).write_text(json.dumps(
        {"name": first.name, "group": first.group, "encoding": "rope", "seed": 0, "stop": "plateaued",
         "steps": 100, "planned_steps": 200, "train_seconds": 9.0, "splits": {"test": {"accuracy": 0.07}},
         "curve": [[100, 0.06]]}))
    write_report(exp, tmp_path)
    record = read_record(tmp_path / "results.json")
    assert (record.kind, record.name) == ("study", "indirect-indexing")
    assert record.measurements["groups"] == {first.group: {"rope": [
        {"seed": 0, "run": first.name, "steps": 100, "train_seconds": 9.0, "stop": "plateaued",
         "splits": {"test": {"accuracy": 0.07}}}]}}
    assert record.paper["numbers"][0]["rows"]["pope"] == [94.82, 2.91]
    assert set(record.resolved["runs"]) == {r.name for r in exp.settings.runs}
    assert stale_label(record, resolve_today) is None


def test_an_analysis_writes_a_record(tmp_path):
    out = tmp_path / "corr"
    assert main(["analyze", "correlation", "--dim", "16", "--positions", "24", "--high-from", "8", "--anchors", "1,5",
                 "--quiet", "--out", str(out)]) == 0
    record = read_record(out / "results.json")
    assert (record.kind, record.name) == ("analysis", "correlation")
    assert set(record.measurements["groups"][""]) == {"sinusoidal", "legendre"}
    assert "mean_abs_corr_high" in record.measurements["groups"][""]["sinusoidal"][0]["splits"]["analysis"]
    assert record.resolved["encodings"]["sinusoidal"]["name"] == "sinusoidal" and record.resolved["dim"] == 16
    assert absolute_paths(record.to_dict()) == [] and stale_label(record, resolve_today) is None
    root = _repo(tmp_path, "<!-- report: analyze-correlation table=summary -->\n<!-- /report -->\n"
                           "<!-- report: analyze-correlation table=values -->\n<!-- /report -->\n")
    main_collect(out, root)
    text = markers.regenerate(root, resolve_today).files[root / "README.md"]
    assert "| sinusoidal | 1 |" in text
    # table=values: every value an analysis recorded, one column each, as the record holds it
    values = record.measurements["groups"][""]["legendre"][0]["splits"]["analysis"]
    header = next(line for line in text.splitlines() if line.startswith("| encoding | mean_abs_corr_all"))
    assert header == "| encoding | " + " | ".join(values) + " |"
    row = next(line for line in text.splitlines() if line.startswith("| legendre | ") and "±" not in line
               and line.count("|") == len(values) + 2)
    assert row == "| legendre | " + " | ".join(f"{v:.4g}" for v in values.values()) + " |"
    shutil.rmtree(root)


def test_collect_suggests_the_values_table_for_an_analysis(tmp_path, capsys):
    out = tmp_path / "corr"
    assert main(["analyze", "correlation", "--dim", "16", "--positions", "24", "--high-from", "8", "--anchors", "1,5",
                 "--quiet", "--out", str(out)]) == 0
    root = _repo(tmp_path)
    capsys.readouterr()
    assert main(["report", "collect", str(out), "--root", str(root)]) == 0
    assert "<!-- report: analyze-correlation table=values -->" in capsys.readouterr().out


def test_a_curves_table_shows_each_split_s_learning_curve_as_its_record_holds_it(flip_flop, tmp_path):
    record = read_record(flip_flop / "results.json")
    curves = record.details["curves"]
    assert list(curves) == ["validation", "test", "ood_sparse", "ood_dense"]  # flip-flop's curve_splits
    root = _repo(tmp_path, "<!-- report: flip-flop table=curves split=ood_sparse reach=0.3 -->\n<!-- /report -->\n"
                           "<!-- report: flip-flop table=curves split=nope -->\n<!-- /report -->\n")
    main_collect(flip_flop, root)
    with pytest.raises(markers.MarkerError, match="README.md:3: split must be one of \\['validation', 'test'"):
        markers.regenerate(root, resolve_today)
    (root / "README.md").write_text("<!-- report: flip-flop table=curves split=ood_sparse reach=0.3 -->\n"
                                    "<!-- /report -->\n")
    text = markers.regenerate(root, resolve_today).files[root / "README.md"]
    assert "| encoding | 2 | first step at >= 30.00 |" in text
    for label in ("rope", "pope"):
        c = curves["ood_sparse"][label]
        mean, std = 100 * c["mean"][0], 100 * c["std"][0]
        cell = f"{mean:.2f} ± {std:.2f}" if c["std"][0] else f"{mean:.2f}"
        assert f"| {label} | {cell} | {'2' if c['mean'][0] >= 0.3 else 'not reached'} |" in text


def test_a_values_table_refuses_an_unknown_split(tmp_path):
    out = tmp_path / "corr"
    assert main(["analyze", "correlation", "--dim", "16", "--positions", "24", "--high-from", "8", "--anchors", "1,5",
                 "--quiet", "--out", str(out)]) == 0
    root = _repo(tmp_path, "<!-- report: analyze-correlation table=values split=test -->\n<!-- /report -->\n")
    main_collect(out, root)
    with pytest.raises(markers.MarkerError, match="README.md:1: split must be one of \\['analysis'\\]"):
        markers.regenerate(root, resolve_today)


def test_a_record_names_the_code_its_command_started_with_and_the_code_at_its_end(tmp_path, monkeypatch):
    # a reproduction can outlast a commit: the record used to name the code when it was written
    from poskit.report import record as rec
    from poskit.report.results_tables import provenance

    codes = iter([{"poskit_version": "0.1.0", "git_commit": "aaaaaaa1", "dirty": False},
                  {"poskit_version": "0.1.0", "git_commit": "bbbbbbb2", "dirty": False}])
    monkeypatch.setattr(rec, "code_info", lambda: next(codes))
    measurements = {"metric": "m", "split": "test", "variant_field": None, "groups": {}}
    with rec.command_line(["poskit", "reproduce", "x"]):  # the code is read here, as the command starts
        made = rec.new_record(name="x", kind="reproduction", equivalent=["poskit", "reproduce", "x"], arguments={},
                              resolved={}, measurements=measurements, paper=None, wall_seconds=1.0, out_dir=tmp_path)
    assert made.code["git_commit"] == "aaaaaaa1" and made.details["code_at_end"]["git_commit"] == "bbbbbbb2"
    assert "poskit 0.1.0 (aaaaaaa), code at the end 0.1.0 (bbbbbbb)" in provenance(made)
    same = {"poskit_version": "0.1.0", "git_commit": "ccccccc3", "dirty": False}
    monkeypatch.setattr(rec, "code_info", lambda: same)
    with rec.command_line(["poskit", "reproduce", "x"]):
        unchanged = rec.new_record(name="x", kind="reproduction", equivalent=["x"], arguments={}, resolved={},
                                   measurements=measurements, paper=None, wall_seconds=1.0, out_dir=tmp_path)
    assert unchanged.code == same and "code_at_end" not in unchanged.details


def test_a_command_does_not_wait_for_git_before_it_starts(tmp_path, monkeypatch):
    # every CLI command enters command_line; only the few that write a record need the code, so git runs beside it
    import threading

    from poskit.report import record as rec

    release = threading.Event()
    code = {"poskit_version": "0.1.0", "git_commit": "ddddddd4", "dirty": False}

    def slow_git():
        assert release.wait(30)
        return code

    monkeypatch.setattr(rec, "code_info", slow_git)
    measurements = {"metric": "m", "split": "test", "variant_field": None, "groups": {}}
    with rec.command_line(["poskit", "reproduce", "x"]):
        assert not release.is_set()  # inside the command while git has not answered
        release.set()
        made = rec.new_record(name="x", kind="reproduction", equivalent=["x"], arguments={}, resolved={},
                              measurements=measurements, paper=None, wall_seconds=1.0, out_dir=tmp_path)
    assert made.code == code
