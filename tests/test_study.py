"""poskit study: the stop rule, advancing a run in intervals (and resuming it), the runner, the report, and
the attention maps used to look inside the Indirect Indexing models."""
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.experiments.configs import StopRule, Study, StudyRun
from poskit.experiments.registry import experiment
from poskit.experiments.study import advance, read_spec, run_study, validation_curve, write_spec
from poskit.report.study import write_study_report
from poskit.training import TrainConfig, train
from poskit.training.files import read_metrics

TINY = {"task": "indirect-indexing",
        "task_options": {"min_len": 6, "max_len": 8, "max_shift": 3, "eval_size": 32, "n_queries": 2},
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope"}, "batch_size": 8,
        "max_steps": 40, "eval_every": 10, "checkpoint_every": 10, "log_every": 10}


def _plateau_by_definition(curve, rule):
    """The rule written out the slow way: stop when the newest value has learned, or when, from min_steps on,
    none of the last `patience` values beat every earlier one by min_gain."""
    if curve and curve[-1][1] >= rule.learned_at:
        return "learned"
    if not curve or curve[-1][0] < rule.min_steps or len(curve) <= rule.patience:
        return None
    earlier = [v for _, v in curve[: len(curve) - rule.patience]]
    recent = [v for _, v in curve[len(curve) - rule.patience:]]
    return None if any(r >= max(earlier) + rule.min_gain for r in recent) else "plateaued"


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0, 1), max_size=25), patience=st.integers(1, 6),
       min_gain=st.floats(0, 0.3), min_steps=st.integers(0, 30), learned_at=st.floats(0.05, 1))
def test_stop_rule_matches_its_definition(values, patience, min_gain, min_steps, learned_at):
    rule = StopRule(learned_at=learned_at, patience=patience, min_gain=min_gain, min_steps=min_steps)
    curve = [(10 * (i + 1) // 5, v) for i, v in enumerate(values)]
    assert rule.verdict(curve) == _plateau_by_definition(curve, rule)


def test_stop_rule_examples():
    rule = StopRule(learned_at=0.9, patience=2, min_gain=0.05, min_steps=0)
    assert rule.verdict([(1, 0.1), (2, 0.2), (3, 0.3)]) is None  # still rising
    assert rule.verdict([(1, 0.3), (2, 0.31), (3, 0.32)]) == "plateaued"
    assert rule.verdict([(1, 0.3), (2, 0.95)]) == "learned"
    assert StopRule(patience=2, min_gain=0.05, min_steps=5).verdict([(1, 0.3), (2, 0.3), (3, 0.3)]) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"learned_at": 0}, "learned_at"), ({"learned_at": 1.5}, "learned_at"), ({"patience": 0}, "patience"),
    ({"patience": True}, "patience"), ({"min_gain": -0.1}, "min_gain"), ({"min_steps": -1}, "min_steps")])
def test_bad_stop_rules_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StopRule(**kwargs)


def test_a_study_refuses_duplicate_or_bad_run_names():
    with pytest.raises(ValueError, match="distinct"):
        Study("q", (StudyRun("a", TINY), StudyRun("a", TINY)))
    with pytest.raises(ValueError, match="name"):
        Study("q", (StudyRun("a/b", TINY),))
    with pytest.raises(ValueError, match="run must name"):
        Study("q", (StudyRun("a", TINY),)).run("b")


def test_the_indirect_indexing_study_configs_are_valid_pairs():
    study = experiment("indirect-indexing", "study").settings
    groups = {}
    for run in study.runs:
        cfg = run.train_config()  # every config is a valid TrainConfig
        assert cfg.task == "indirect-indexing"
        groups.setdefault((run.group, cfg.seed), []).append(cfg)
    for group, cfgs in groups.items():
        # each group compares rope with pope on the same seed, data and schedule (per seed)
        assert sorted(c.model.encoding for c in cfgs) == ["pope", "rope"], group
        a, b = (dict(c.to_dict(), model=None) for c in cfgs)
        assert a == b, group


def test_advance_stops_on_a_plateau_evaluates_every_split_and_is_idempotent(tmp_path):
    study = Study("tiny", (StudyRun("r", TINY, "g"),), StopRule(learned_at=1.0, patience=1, min_gain=1.0))
    out = advance(study, study.runs[0], tmp_path)
    # min_gain 1.0 can never be met: the run stops after patience + 1 evaluations, long before max_steps
    assert out["stop"] == "plateaued" and out["steps"] == 20 < out["planned_steps"]
    assert set(out["splits"]) == {"validation", "test"}
    assert out["curve"] == [list(p) for p in validation_curve(tmp_path / "r")] or \
        out["curve"] == validation_curve(tmp_path / "r")
    saved = json.loads((tmp_path / "r" / "study.json").read_text())
    assert saved["steps"] == 20
    # a second call returns the outcome without training further
    before = (tmp_path / "r" / "metrics.jsonl").read_bytes()
    assert advance(study, study.runs[0], tmp_path)["steps"] == 20
    assert (tmp_path / "r" / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
def test_advance_in_intervals_equals_one_uninterrupted_run(tmp_path):
    never = StopRule(learned_at=1.0, patience=100)
    study = Study("tiny", (StudyRun("r", TINY),), never)
    out = advance(study, study.runs[0], tmp_path / "study")
    assert out["stop"] == "max_steps" and out["steps"] == 40
    whole = train(TrainConfig.from_dict(TINY), tmp_path / "whole", quiet=True)
    assert out["splits"] == whole["splits"]
    assert validation_curve(tmp_path / "study" / "r") == validation_curve(tmp_path / "whole")


def test_spec_round_trip_and_a_damaged_spec_names_the_file(tmp_path):
    study = Study("tiny", (StudyRun("r", TINY, "g"),), StopRule(0.5, 3, 0.1, 7))
    write_spec(study, tmp_path)
    assert read_spec(tmp_path) == study
    (tmp_path / "study_spec.json").write_text('{"question": 1}')
    with pytest.raises(ValueError, match="study_spec.json"):
        read_spec(tmp_path)


def test_report_shows_finished_and_waiting_runs(tmp_path):
    pope = {**TINY, "model": {**TINY["model"], "encoding": "pope"}}
    study = Study("tiny", (StudyRun("a", TINY, "g"), StudyRun("b", pope, "g")), StopRule(1.0, 1, 1.0))
    advance(study, study.runs[0], tmp_path)
    md, png = write_study_report(study, tmp_path)
    text = md.read_text()
    assert "| g | d16 L1 H2 | rope | 0 | plateaued | 20 |" in text
    assert "| g | d16 L1 H2 | pope | 0 | waiting | 0 |" in text
    assert png.stat().st_size > 1000


def test_report_shows_a_running_run_with_its_curve_and_training_time_so_far(tmp_path):
    # a run that has trained but not stopped (no outcome yet): its steps and minutes so far, not "-"
    pope = {**TINY, "model": {**TINY["model"], "encoding": "pope"}}
    study = Study("tiny", (StudyRun("b", pope, "g"),), StopRule(1.0, 1, 1.0))
    train(TrainConfig.from_dict(pope), tmp_path / "b", quiet=True)
    elapsed = max(m["elapsed"] for m in read_metrics(tmp_path / "b") if "elapsed" in m)
    md, _ = write_study_report(study, tmp_path)
    last_step = validation_curve(tmp_path / "b")[-1][0]
    assert f"| g | d16 L1 H2 | pope | 0 | running | {last_step} | {elapsed / 60:.0f} min |" in md.read_text()


@pytest.mark.slow
def test_run_study_runs_workers_in_processes_and_resumes(tmp_path):
    pope = {**TINY, "model": {**TINY["model"], "encoding": "pope"}}
    study = Study("tiny", (StudyRun("a", TINY, "g"), StudyRun("b", pope, "g")), StopRule(1.0, 1, 1.0))
    outcomes = run_study(study, tmp_path, workers=2, nice=0, poll_seconds=0.2)
    assert [o["stop"] for o in outcomes] == ["plateaued", "plateaued"]
    assert (tmp_path / "logs" / "a.log").exists()
    # a second invocation finds every run done and starts nothing
    assert run_study(study, tmp_path, workers=2, nice=0, poll_seconds=0.2) == outcomes


def test_run_study_checks_every_config_before_starting(tmp_path):
    bad = {**TINY, "lr": -1.0}
    study = Study("tiny", (StudyRun("a", TINY), StudyRun("b", bad)))
    with pytest.raises(ValueError, match="lr"):
        run_study(study, tmp_path / "s")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("encoding", ["rope", "pope", "alibi", "cope", "relative"])
def test_attention_maps_reproduce_each_layers_output(encoding):
    """The maps times the values, through the output projection, give the attention layer's own output."""
    from poskit.evaluate.attention_maps import attention_maps
    from poskit.models import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, encoding=encoding)).double().eval()
    tokens = torch.randint(0, 11, (2, 9))
    outputs, inputs = [], []
    def record(module, args, out):
        inputs.append(args[0])
        outputs.append(out)

    hooks = [b.attn.register_forward_hook(record) for b in model.blocks]
    model(tokens)
    for h in hooks:
        h.remove()
    maps = attention_maps(model, tokens)
    for block, m, x, y in zip(model.blocks, maps, inputs, outputs):
        a = block.attn
        assert torch.allclose(m.sum(-1), torch.ones_like(m.sum(-1)))
        assert torch.all(m.triu(1) == 0)  # causal
        v = a._heads(a.v_proj(x), a.num_kv_heads).repeat_interleave(a.num_heads // a.num_kv_heads, dim=1)
        mixed = (m @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        assert torch.allclose(a.o_proj(mixed), y, atol=1e-10)


def test_lookup_attention_shapes_and_refusal():
    from poskit.evaluate.attention_maps import lookup_attention
    from poskit.models import ModelConfig, Transformer
    from poskit.tasks import build_task

    task = build_task("indirect-indexing", min_len=6, max_len=8, max_shift=3)
    model = Transformer(ModelConfig(vocab_size=len(task.vocab), d_model=16, n_layers=2, n_heads=2)).eval()
    out = lookup_attention(model, task, n=4)
    for key in ("source_match", "target_from_last", "source_from_last"):
        arr = torch.tensor(out[key])
        assert arr.shape == (2, 2) and torch.all((arr >= 0) & (arr <= 1))
    assert torch.tensor(out["left_neighbour"]).shape == (2, 2, 3)


def test_lookup_attentions_left_neighbour_mass_is_the_maps_subdiagonals():
    """For one example, recomputed the slow obvious way from the attention maps of that same example."""
    import numpy as np

    from poskit.evaluate.attention_maps import attention_maps, lookup_attention
    from poskit.models import ModelConfig, Transformer
    from poskit.tasks import build_task

    task = build_task("indirect-indexing", min_len=6, max_len=8, max_shift=3)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=len(task.vocab), d_model=16, n_layers=2, n_heads=2,
                                    encoding="pope")).eval()
    out = lookup_attention(model, task, n=1, seed=5)
    src, queries = task.sample_raw(np.random.default_rng(5))
    text = src + "".join(task.format_query(src, qi, qs) for qi, qs, _ in queries)
    maps = attention_maps(model, torch.tensor([task.vocab.encode(text)[:-1]]))
    L = len(src)
    for layer, m in enumerate(maps):
        for h in range(2):
            for k in (1, 2, 3):
                expected = sum(m[0, h, j, j - k].item() for j in range(k, L)) / (L - k)
                assert out["left_neighbour"][layer][h][k - 1] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="task"):
        lookup_attention(model, build_task("flip-flop"), n=1)


@pytest.mark.slow
def test_lookup_report_writes_json_and_png_for_trained_runs(tmp_path):
    from poskit.report.lookup_plot import write_lookup_report

    pope = {**TINY, "model": {**TINY["model"], "encoding": "pope"}}
    study = Study("tiny", (StudyRun("a", TINY, "g"), StudyRun("b", pope, "g")), StopRule(1.0, 1, 1.0))
    for run in study.runs:
        advance(study, run, tmp_path)
    js, png = write_lookup_report({"rope": tmp_path / "a", "pope": tmp_path / "b"}, tmp_path / "att", n=3)
    data = json.loads(js.read_text())
    assert set(data["runs"]) == {"rope", "pope"}
    ex = data["runs"]["rope"]["example"]
    assert len(ex["rows"]) == 1 and len(ex["rows"][0]) == ex["last"] + 1
    assert abs(sum(ex["rows"][0]) - 1) < 1e-6  # a row of attention probabilities
    assert png.stat().st_size > 1000
    with pytest.raises(ValueError, match="run_dirs"):
        write_lookup_report({}, tmp_path / "none")


def test_study_cli_refuses_an_unknown_attention_group_before_writing(tmp_path, capsys):
    from poskit.cli import main

    with pytest.raises(SystemExit):
        main(["study", "indirect-indexing", "--out", str(tmp_path / "s"), "--report-only", "--attention", "nope"])
    assert "--attention must name a group" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_study_cli_refuses_attention_for_a_group_without_runs_before_writing(tmp_path, capsys):
    from poskit.cli import main

    group = experiment("indirect-indexing", "study").settings.runs[0].group
    with pytest.raises(SystemExit):
        main(["study", "indirect-indexing", "--out", str(tmp_path / "s"), "--report-only", "--attention", group])
    assert "has no trained runs" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_second_runner_on_a_busy_study_directory_is_refused_and_changes_nothing(tmp_path):
    """The runner owns and locks its directory (training/run_dir.py): while another runner holds it, a second one
    is refused at once, pointing at --report-only, and leaves every byte as it was."""
    from poskit.experiments.study import StudyBusy
    from poskit.training.run_dir import owned

    study = Study("tiny", (StudyRun("a", TINY, "g"),), StopRule(1.0, 1, 1.0))
    out = tmp_path / "s"
    with owned(out, "study"):  # the first runner holds the directory
        before = {str(p.relative_to(out)): p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))}
        with pytest.raises(StudyBusy, match="in use by process") as err:
            run_study(study, out, workers=1, nice=0, poll_seconds=0.1)
        assert "--report-only" in str(err.value)
        after = {str(p.relative_to(out)): p.read_bytes() if p.is_file() else None for p in sorted(out.rglob("*"))}
        assert after == before  # no spec, no logs, no run started
    # released (as when the first runner exits or is killed), the directory can be owned again
    with owned(out, "study"):
        pass


def test_a_study_refuses_a_directory_that_is_not_a_study_directory_byte_for_byte(tmp_path):
    from poskit.training.run_dir import RunDirError, claim

    study = Study("tiny", (StudyRun("a", TINY, "g"),), StopRule(1.0, 1, 1.0))
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("# mine\n")
    compare = claim(tmp_path / "cmp", "compare")
    for directory, message in ((project, "was not written by poskit"), (compare, "not of kind 'study'")):
        before = {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))}
        with pytest.raises(RunDirError, match=message):
            run_study(study, directory, workers=1, nice=0, poll_seconds=0.1)
        assert {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))} == before


def test_an_older_study_directory_without_a_marker_is_adopted(tmp_path):
    from poskit.experiments.outputs import is_legacy_study
    from poskit.training.run_dir import check

    out = tmp_path / "s"
    (out / "logs").mkdir(parents=True)
    (out / "study_spec.json").write_text("{}")
    (out / ".study.lock").write_text("")
    (out / "study.md").write_text("| table |\n")
    assert is_legacy_study(out) and check(out, "study", legacy=is_legacy_study) == "legacy"
    (out / "mine.txt").write_text("not a study's")
    assert not is_legacy_study(out)


def test_a_worker_refuses_a_run_another_worker_is_training(tmp_path):
    from poskit.experiments.study import StudyBusy, exclusive, main

    study = Study("tiny", (StudyRun("a", TINY, "g"),), StopRule(1.0, 1, 1.0))
    write_spec(study, tmp_path)
    with exclusive(tmp_path / ".a.lock", "the first worker"):
        with pytest.raises(StudyBusy, match="run a of the study"):
            main([str(tmp_path), "a"])
    assert not (tmp_path / "a").exists()  # nothing trained or written by the refused worker
