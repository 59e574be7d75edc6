"""The contrast table (report/contrast.py): two values of one encoding option set against each other in every
record that ran both, paired by their resolved options (never by label), per seed, in the metric's direction."""
import re
from pathlib import Path

import pytest

from poskit.experiments.evidence import resolve, resolve_today
from poskit.report import markers
from poskit.report.contrast import contrast_table, higher_is_better, pairs
from poskit.report.record import ResultsRecord

ENCODINGS = ["pope", "pope:delta_projection=true", "pope:softplus=false", "rope"]


def _record(name: str, metric: str, values: dict, encodings=ENCODINGS, seeds=(0, 1)) -> ResultsRecord:
    """A record of `poskit reproduce ablations --encodings ...` with the given per-seed `metric` on test."""
    resolved = resolve("reproduction", "ablations", {"encodings": list(encodings)})
    runs = {label: [{"seed": s, "run": f"{label}/seed{s}", "steps": 10, "train_seconds": 1.0,
                     "splits": {"test": {metric: values[label][i]}}} for i, s in enumerate(seeds)]
            for label in encodings}
    return ResultsRecord(
        name=name, kind="reproduction", command="poskit reproduce ablations", arguments={"encodings": list(encodings)},
        code={"poskit_version": "0.1.0", "git_commit": "0" * 40, "dirty": False}, date="2026-11-26T07:00:00Z",
        machine={"cpu": "cpu", "cores": 2, "torch": "2", "python": "3", "os": "Linux"}, wall_seconds=60.0,
        resolved=resolved, measurements={"metric": metric, "split": "test", "variant_field": None,
                                         "groups": {"": runs}}, paper=None)


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_only_encodings_that_differ_in_the_option_alone_are_paired():
    record = _record("a", "accuracy", {e: [0.5, 0.5] for e in ENCODINGS})
    # pope:softplus=false differs from both rules in softplus too; rope is another encoding
    assert pairs(record, "delta_projection") == [("pope", "pope:delta_projection=true")]
    # the same rule written two ways is one rule, not a pair
    same = _record("b", "accuracy", {e: [0.5, 0.5] for e in ["pope", "pope:delta_projection=false"]},
                   encodings=["pope", "pope:delta_projection=false"])
    assert pairs(same, "delta_projection") == []


def test_a_row_gives_both_rules_the_per_seed_difference_and_who_won_in_the_metrics_direction():
    acc = _record("acc", "accuracy", {"pope": [0.9, 0.6], "pope:delta_projection=true": [0.95, 0.1],
                                      "pope:softplus=false": [0, 0], "rope": [0, 0]})
    row = _rows(contrast_table([("acc", acc)], "delta_projection"))[0]
    assert row[:4] == ["acc", "test accuracy (%)", "pope / pope:delta_projection=true", "false / true"]
    assert row[6] == "90.00 / 95.00, 60.00 / 10.00"
    assert row[7] == "-22.50"  # mean of +5 and -50 points
    assert row[8] == "1 / 1 / 0 of 2"
    # a loss: smaller is better, so the same signs count the other way
    loss = _record("loss", "loss", {"pope": [1.0, 2.0], "pope:delta_projection=true": [0.5, 1.5],
                                    "pope:softplus=false": [0, 0], "rope": [0, 0]})
    row = _rows(contrast_table([("loss", loss)], "delta_projection"))[0]
    assert row[7] == "-0.5000" and row[8] == "0 / 2 / 0 of 2"
    # values within TIE of each other are a tie, whatever their sign
    close = _record("close", "loss", {"pope": [1.0, 2.0], "pope:delta_projection=true": [1.0005, 1.9],
                                      "pope:softplus=false": [0, 0], "rope": [0, 0]})
    assert _rows(contrast_table([("close", close)], "delta_projection"))[0][8] == "0 / 1 / 1 of 2"


def test_a_missing_record_and_a_record_without_a_pair_get_a_row_that_says_so():
    lone = _record("lone", "accuracy", {"rope": [0.1, 0.2]}, encodings=["rope"])
    rows = _rows(contrast_table([("gone", None), ("lone", lone)], "delta_projection"))
    assert rows[0][0] == "gone" and rows[0][6] == "not backed: no results file committed"
    assert rows[1][0] == "lone" and rows[1][6] == "no pair differing in delta_projection"


def test_an_unknown_metric_direction_is_refused_by_name():
    assert higher_is_better("bleu") and not higher_is_better("perplexity") and not higher_is_better("test_nll")
    with pytest.raises(ValueError, match="metric must be one whose better direction is known.*'flux'"):
        higher_is_better("flux")


def test_a_contrast_marker_needs_its_option_and_takes_several_names(tmp_path: Path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# t\n<!-- report: a,b table=contrast -->\n<!-- /report -->\n")
    with pytest.raises(markers.MarkerError, match=re.escape("README.md:2: table=contrast needs the option(s) "
                                                            "['option']")):
        markers.regenerate(root, resolve_today)
    (root / "README.md").write_text("# t\n<!-- report: a,b table=contrast option=delta_projection -->\n"
                                    "<!-- /report -->\n")
    text = markers.regenerate(root, resolve_today).files[root / "README.md"]
    assert "| a | — |" in text and "| b | — |" in text and "not backed" in text
