"""`poskit export RUN --hf DIR`: a destination that is the run, inside it or above it is refused (with
--overwrite too) and leaves everything as it was; a --hf path that cannot be a directory, or cannot be written,
is one line naming --hf; the export records what the run was trained as, and a config.json edited to another
architecture or encoding is refused on load, naming the field; --quiet prints nothing, progress bars included."""
import json
import os

import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from poskit.cli import main  # noqa: E402
from poskit.hf import PoskitConfig, PoskitForCausalLM, to_poskit  # noqa: E402
from poskit.training import TrainConfig  # noqa: E402
from poskit.training.run import train  # noqa: E402
from thread_helpers import single_thread  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("project") / "runs" / "r"
    cfg = TrainConfig.from_dict(dict(
        task="flip-flop", task_options={"length": 16, "eval_size": 16, "eval_batch_size": 16},
        model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope", "encoding_options": {"base": 500.0}},
        batch_size=4, max_steps=2, warmup_steps=1, eval_every=2, log_every=2, checkpoint_every=2))
    with single_thread():
        train(cfg, d, quiet=True)
    return d


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "hf"
    assert main(["export", str(run_dir), "--hf", str(out), "--quiet"]) == 0
    return out


def snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["the run", "inside the run", "inside the run, deeper", "above the run",
                                   "two levels above the run"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_export_refuses_the_run_itself_and_paths_inside_or_above_it(run_dir, where, overwrite, capsys):
    dest = {"the run": run_dir, "inside the run": run_dir / "hf", "inside the run, deeper": run_dir / "a" / "hf",
            "above the run": run_dir.parent, "two levels above the run": run_dir.parent.parent}[where]
    project = run_dir.parent.parent
    before = snapshot(project)
    with pytest.raises(SystemExit) as e:
        main(["export", str(run_dir), "--hf", str(dest), *(["--overwrite"] if overwrite else []), "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and "--hf" in err[-1] and "the run" in err[-1], err
    assert snapshot(project) == before  # nothing written, nothing removed
    assert not (run_dir / "hf").exists() and not (run_dir / "a").exists()


def test_export_under_a_file_names_hf_in_one_line(run_dir, tmp_path, capsys):
    blocker = tmp_path / "FILE"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit):
        main(["export", str(run_dir), "--hf", str(blocker / "sub"), "--quiet"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--hf" in last and "FILE" in last and "is a file" in last, last
    assert blocker.read_text() == "not a directory" and sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_export_to_an_unwritable_place_names_hf_not_a_staging_path(run_dir, tmp_path, capsys):
    target = "/proc/poskit-export-test"
    with pytest.raises(SystemExit):
        main(["export", str(run_dir), "--hf", target, "--quiet"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--hf" in last and target in last, last
    assert ".poskit-export-test." not in last  # the temporary staging directory's name is an implementation detail


def test_export_quiet_prints_nothing(run_dir, tmp_path, capfd):
    capfd.readouterr()
    assert main(["export", str(run_dir), "--hf", str(tmp_path / "q"), "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


# -- the fingerprint of what the run was trained as ---------------------------------------------------------

def test_the_export_records_the_training_config_and_loads(exported, run_dir):
    config = json.loads((exported / "config.json").read_text())
    trained = config["poskit_fingerprint"]
    assert trained["fields"]["position_encoding"] == "rope"
    assert trained["fields"]["position_encoding_options"] == {"base": 500.0}
    assert trained["fields"]["hidden_size"] == 16 and len(trained["sha256"]) == 64
    model = to_poskit(exported)
    assert model.config.encoding == "rope"


@pytest.mark.parametrize("field, value", [
    ("position_encoding", "alibi"), ("position_encoding", "rope-linear"),
    ("position_encoding_options", {"base": 10000.0}), ("num_hidden_layers", 2), ("hidden_act", "silu"),
    ("tie_word_embeddings", "flip"), ("num_key_value_heads", 1), ("is_causal", False),
])
def test_a_config_edited_to_another_architecture_or_encoding_is_refused_naming_the_field(exported, tmp_path, field,
                                                                                          value):
    from transformers import AutoModelForCausalLM

    edited = tmp_path / "edited"
    edited.mkdir()
    for p in exported.iterdir():
        (edited / p.name).write_bytes(p.read_bytes())
    config = json.loads((edited / "config.json").read_text())
    assert config[field] != value
    config[field] = (not config[field]) if value == "flip" else value
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"\b{field}\b.*poskit_fingerprint"):
        AutoModelForCausalLM.from_pretrained(edited)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        to_poskit(edited)


def test_an_edited_fingerprint_is_refused_and_a_removed_one_is_an_explicit_opt_out(exported, tmp_path):
    config = json.loads((exported / "config.json").read_text())
    config["position_encoding"], config["position_encoding_options"] = "alibi", {}
    config["poskit_fingerprint"]["fields"]["position_encoding"] = "alibi"  # edited along, but not its digest
    with pytest.raises(ValueError, match=r"poskit_fingerprint .* was edited"):
        PoskitConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    del config["poskit_fingerprint"]
    assert PoskitConfig(**{k: v for k, v in config.items()
                           if k not in ("architectures", "transformers_version")}).position_encoding == "alibi"


def test_fields_that_do_not_change_the_computation_may_be_edited(exported):
    config = PoskitConfig.from_pretrained(exported, hidden_dropout=0.1, eos_token_id=3)
    assert config.hidden_dropout == 0.1 and config.poskit_fingerprint is not None
    PoskitForCausalLM.from_pretrained(exported, hidden_dropout=0.1)


def test_a_resaved_export_keeps_its_fingerprint(exported, tmp_path):
    model = PoskitForCausalLM.from_pretrained(exported)
    model.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["poskit_fingerprint"] == json.loads((exported / "config.json").read_text())["poskit_fingerprint"]
    ids = torch.randint(1, 5, (1, 8))
    assert torch.equal(PoskitForCausalLM.from_pretrained(tmp_path / "again")(ids).logits, model(ids).logits)
    assert os.listdir(tmp_path / "again")
