"""Context extension by fine-tuning (`poskit extend`, training/recipes/extend.py, experiments/extend.py) and the
passkey command (`poskit passkey`): every scaling extends a tiny run with its encoding, provenance and exact
resume; zero-shot writes the swapped model with the parent's weights; refusals change nothing on disk; the
schedule and defaults are the papers'; an HF export is a parent too."""
import hashlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from poskit.cli import main
from poskit.experiments.extend import extend, load_decoder, passkey_report
from poskit.training import TrainConfig, train
from poskit.training.recipes.extend import LR_RATIO, ExtendConfig, ExtendRecipe, load_extend_run, lr_at

pytestmark = pytest.mark.usefixtures("one_thread")

PARENT_CONTEXT, CONTEXT = 32, 64
FAST = dict(eval_batches=1, final_eval_batches=1, checkpoint_every=1)


def tiny_run(path: Path, encoding: str, **changes) -> Path:
    """A 3-step character LM on Shakespeare at context 32 with passkey windows (1 layer, d_model 16)."""
    cfg = {"task": "shakespeare", "task_options": {"context": PARENT_CONTEXT, "passkey_fraction": 0.25},
           "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": encoding}, "batch_size": 4,
           "max_steps": 3, "eval_every": 3, "eval_batches": 1, "final_eval_batches": 1, "warmup_steps": 0,
           "checkpoint_every": 3, **changes}
    train(TrainConfig.from_dict(cfg), path, quiet=True)
    return path


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("parents") / "rope", "rope")


@pytest.fixture(scope="module")
def pope_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("parents") / "pope", "pope")


def weights(run_dir) -> dict:
    record = json.loads((Path(run_dir) / "checkpoint.json").read_text())
    return load_file(str(Path(run_dir) / record["directory"] / "model.safetensors"))


def logged(run_dir) -> list[dict]:
    """The metrics log without its wall-clock times."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed"} for line in lines]


def snapshot(root: Path) -> dict:
    """Every file under `root` with its bytes' hash (a refused call must leave all of them as they were)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ every scaling

SCALINGS = {  # spec -> (the encoding options the extension must hold beside base/layout/rotary_dim)
    "rope-linear": {"factor": 2.0},
    "rope-ntk": {"factor": 2.0},
    "rope-yarn": {"factor": 2.0, "original_max_positions": PARENT_CONTEXT},
    "rope-llama3": {"factor": 2.0, "original_max_positions": PARENT_CONTEXT, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0},
    "rope-longrope": {"factor": 2.0, "original_max_positions": PARENT_CONTEXT},
    "rope-yarn:factor=4:beta_fast=8": {"factor": 4, "original_max_positions": PARENT_CONTEXT, "beta_fast": 8},
    "rope": {},
    "pope": {},
}


@pytest.mark.parametrize("spec", list(SCALINGS))
def test_each_scaling_extends_a_run_with_its_encoding_provenance_and_exact_resume(spec, rope_run, pope_run, tmp_path):
    parent = pope_run if spec == "pope" else rope_run
    whole = extend(parent, spec, CONTEXT, 2, tmp_path / "whole", quiet=True, **FAST)
    config = json.loads((tmp_path / "whole" / "config.json").read_text())
    name = spec.split(":")[0]
    assert config["model"]["encoding"] == name
    options = config["model"]["encoding_options"]
    for key, value in SCALINGS[spec].items():
        assert options[key] == value, (key, options)
    model, task, cfg = load_extend_run(tmp_path / "whole")
    built = model.encoding_modules()[0]
    assert built.name == name and task.max_input_len == CONTEXT == cfg.context
    if name.startswith("rope"):  # the parent's rotation carries over
        assert (built.base, built.layout, built.rotary_dim) == (10000.0, "interleaved", 8)
    # provenance: the parent as given, its exact checkpoint (record hash, directory, step) and its config
    record = (parent / "checkpoint.json").read_bytes()
    prov = config["parent"]
    assert prov["path"] == str(parent) and prov["source"] == "run" and prov["step"] == 3
    assert prov["checkpoint_sha256"] == hashlib.sha256(record).hexdigest()
    assert prov["checkpoint"] == json.loads(record)["directory"]
    assert prov["config"] == json.loads((parent / "config.json").read_text()) and prov["context"] == PARENT_CONTEXT
    assert whole["steps"] == 2 and whole["parent"]["checkpoint_sha256"] == prov["checkpoint_sha256"]
    assert whole["tokens"] == {"fine_tuning": 2 * 2 * CONTEXT, "pre_training": 3 * 4 * PARENT_CONTEXT,
                               "fraction": (2 * 2 * CONTEXT) / (3 * 4 * PARENT_CONTEXT)}
    # stopped after one step and resumed: the uninterrupted run's weights and log
    assert extend(parent, spec, CONTEXT, 2, tmp_path / "split", stop_after=1, quiet=True, **FAST) is None
    split = extend(parent, spec, CONTEXT, 2, tmp_path / "split", resume=True, quiet=True, **FAST)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert split["splits"] == whole["splits"]
    assert logged(tmp_path / "split") == logged(tmp_path / "whole")
    # and the weights did move: every weight is fine-tuned
    start = weights(parent)
    assert all(not torch.equal(a[k], start[k]) for k in a if k.endswith("weight") and "norm" not in k)


def test_an_extension_directory_is_of_kind_extend(rope_run, tmp_path):
    from poskit.training.run_dir import MARKER_FILE

    extend(rope_run, "rope-yarn", CONTEXT, 0, tmp_path / "x", quiet=True, **FAST)
    assert json.loads((tmp_path / "x" / MARKER_FILE).read_text())["kind"] == ExtendRecipe.kind == "extend"
    # so a training run cannot be resumed in it, nor an extension written into a training run's directory
    trained = tiny_run(tmp_path / "trained", "rope")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"is a poskit directory of kind .extend. .*not of kind .run."):
        train(TrainConfig.from_dict(json.loads((trained / "config.json").read_text())), tmp_path / "x", quiet=True,
              resume=True)
    with pytest.raises(ValueError, match=r"is a poskit directory of kind .run. .*not of kind .extend."):
        extend(rope_run, "rope-yarn", CONTEXT, 0, trained, quiet=True, resume=True, **FAST)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ zero-shot

def test_zero_steps_writes_the_swapped_model_with_the_parents_weights_and_continues_exactly(rope_run, tmp_path):
    results = extend(rope_run, "rope-yarn", CONTEXT, 0, tmp_path / "zs", quiet=True, **FAST)
    assert results["steps"] == 0 and results["tokens"]["fine_tuning"] == 0
    record = json.loads((tmp_path / "zs" / "checkpoint.json").read_text())
    assert record["step"] == 0
    swapped, parent = weights(tmp_path / "zs"), weights(rope_run)
    assert swapped.keys() == parent.keys() and all(torch.equal(swapped[k], parent[k]) for k in parent)
    model, _, _ = load_extend_run(tmp_path / "zs")
    assert model.encoding_modules()[0].scaling == "yarn"
    # the zero-shot run is step 0 of a fine-tuning: resumed to 2 steps, it equals a 2-step run
    extend(rope_run, "rope-yarn", CONTEXT, 2, tmp_path / "zs", resume=True, quiet=True, **FAST)
    extend(rope_run, "rope-yarn", CONTEXT, 2, tmp_path / "two", quiet=True, **FAST)
    a, b = weights(tmp_path / "zs"), weights(tmp_path / "two")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_finished_extension_continues_to_more_steps_as_a_run_planned_that_long(rope_run, tmp_path):
    extend(rope_run, "rope-linear", CONTEXT, 1, tmp_path / "grown", quiet=True, **FAST)
    extend(rope_run, "rope-linear", CONTEXT, 2, tmp_path / "grown", resume=True, quiet=True, **FAST)
    extend(rope_run, "rope-linear", CONTEXT, 2, tmp_path / "planned", quiet=True, **FAST)
    a, b = weights(tmp_path / "grown"), weights(tmp_path / "planned")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the constant lr makes the length irrelevant to each step


# ------------------------------------------------------------------ refusals

@pytest.mark.parametrize("case, message", [
    ("missing", r"RUN '.*nowhere' is not a directory"),
    ("empty", r"holds no trained run"),
    ("pope-on-rope", r"--encoding 'pope' does not fit the weights of RUN '.*rope', trained with 'rope': a rope run "
                     r"extends with rope or rope-linear or .*rope-longrope"),
    ("alibi-on-rope", r"--encoding 'alibi' does not fit the weights of RUN .*trained with 'rope'"),
    ("rope-on-pope", r"--encoding 'rope' does not fit the weights of RUN '.*pope', trained with 'pope': a pope run "
                     r"extends with pope \("),
    ("layout", r"layout 'half' would pair its q/k channels differently from the layout 'interleaved'"),
    ("shorter", r"--context must be at least the training context of RUN .* \(32: an extension lengthens it\), got 16"),
    ("negative-steps", r"--steps must be an int >= 0, got -1"),
    ("unfinished", r"has not finished \(no results.json\)"),
    ("out-inside-parent", r"--out '.*rope/x' is inside the run directory"),
])
def test_refusals_name_the_problem_and_change_nothing_on_disk(case, message, rope_run, pope_run, tmp_path):
    parent, spec, context, steps, out = rope_run, "rope-yarn", CONTEXT, 2, tmp_path / "out"
    if case == "missing":
        parent = tmp_path / "nowhere"
    elif case == "empty":
        parent = tmp_path / "empty"
        parent.mkdir()
    elif case == "pope-on-rope":
        spec = "pope"
    elif case == "alibi-on-rope":
        spec = "alibi"
    elif case == "rope-on-pope":
        parent, spec = pope_run, "rope"
    elif case == "layout":
        spec = "rope-yarn:layout=half"
    elif case == "shorter":
        context = 16
    elif case == "negative-steps":
        steps = -1
    elif case == "unfinished":
        parent = tmp_path / "unfinished"
        tiny_run(parent, "rope", max_steps=6)
        (parent / "results.json").unlink()
    elif case == "out-inside-parent":
        out = rope_run / "x"
    before_parent, before_tmp = snapshot(Path(parent)) if Path(parent).exists() else {}, snapshot(tmp_path)
    with pytest.raises(ValueError, match=message):
        extend(parent, spec, context, steps, out, quiet=True, **FAST)
    assert not out.exists()
    assert snapshot(tmp_path) == before_tmp
    if Path(parent).exists():
        assert snapshot(Path(parent)) == before_parent


def test_the_command_line_refuses_with_one_line_and_writes_nothing(rope_run, tmp_path, capsys):
    out = tmp_path / "x"
    with pytest.raises(SystemExit) as e:
        main(["extend", str(rope_run), "--encoding", "pope", "--context", "64", "--steps", "1", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("poskit extend: error: --encoding 'pope' does not fit") and "\n" not in err
    with pytest.raises(SystemExit):
        main(["extend", str(rope_run), "--encoding", "rope-yarn:factor=x", "--context", "64", "--steps", "1",
              "--out", str(out)])
    assert "factor" in capsys.readouterr().err
    assert not out.exists()


def test_a_resume_keeps_its_encoding_and_its_parent(rope_run, tmp_path):
    extend(rope_run, "rope-yarn", CONTEXT, 1, tmp_path / "x", quiet=True, **FAST)
    before = snapshot(tmp_path / "x")
    with pytest.raises(ValueError, match=r"model.encoding is 'rope-yarn'; got 'rope-linear'"):
        extend(rope_run, "rope-linear", CONTEXT, 2, tmp_path / "x", resume=True, quiet=True, **FAST)
    with pytest.raises(ValueError, match="already holds a run; pass resume=True"):
        extend(rope_run, "rope-yarn", CONTEXT, 2, tmp_path / "x", quiet=True, **FAST)
    assert snapshot(tmp_path / "x") == before


# ------------------------------------------------------------------ schedule and defaults

def test_the_schedule_warms_up_from_a_tenth_over_twenty_steps_then_stays_constant(rope_run):
    cfg = ExtendConfig.from_dict({**json.loads(json.dumps(_config(rope_run))), "lr": 1e-3})
    assert [lr_at(s, cfg) for s in (0, 10, 19, 20, 21, 500)] == pytest.approx(
        [1e-4, 5.5e-4, 1e-3 * (0.1 + 0.9 * 19 / 20), 1e-3, 1e-3, 1e-3])


def _config(run) -> dict:
    from poskit.experiments.extend import extension_config

    return extension_config(load_decoder(run), "rope-yarn", CONTEXT, 5).to_dict()


def test_defaults_are_the_papers_scaled_to_the_parent(rope_run, tmp_path):
    cfg = _config(rope_run)
    parent = json.loads((rope_run / "config.json").read_text())
    assert cfg["lr"] == pytest.approx(parent["lr"] * LR_RATIO) and LR_RATIO == pytest.approx(2e-5 / 3e-4)
    assert (cfg["beta1"], cfg["beta2"], cfg["weight_decay"], cfg["grad_clip"]) == (0.9, 0.95, 0.0, 1.0)
    assert (cfg["warmup_steps"], cfg["warmup_start"], cfg["checkpoint_every"]) == (20, 0.1, 50)
    assert cfg["batch_size"] * CONTEXT == parent["batch_size"] * PARENT_CONTEXT  # the parent's tokens per step
    # plain text: the parent's passkey windows are not trained at the new context
    assert cfg["task_options"] == {"context": CONTEXT, "passkey_fraction": 0.0}
    # an extension of an extension keeps its parent's fine-tuning lr (YaRN's s=16 -> 32 continues at 2e-5)
    extend(rope_run, "rope-yarn", CONTEXT, 1, tmp_path / "first", quiet=True, **FAST)
    second = _config_of(tmp_path / "first", "rope-yarn", 128)
    assert second["lr"] == pytest.approx(cfg["lr"]) and second["parent"]["source"] == "extend"
    # YaRN's factor counts from the original context, which the first extension recorded
    assert second["model"]["encoding_options"]["factor"] == 4.0
    assert second["model"]["encoding_options"]["original_max_positions"] == PARENT_CONTEXT


def _config_of(run, spec, context) -> dict:
    from poskit.experiments.extend import extension_config

    return extension_config(load_decoder(run), spec, context, 1).to_dict()


# ------------------------------------------------------------------ an exported parent

def test_an_hf_export_is_a_parent_with_its_weights_hash_as_provenance(rope_run, tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed: pip install -c constraints.txt "
                                               '-e ".[hf]"')
    from poskit.hf.convert import export_run

    export = export_run(rope_run, tmp_path / "hf")
    results = extend(export, "rope-linear", CONTEXT, 0, tmp_path / "x", quiet=True, **FAST)
    prov = json.loads((tmp_path / "x" / "config.json").read_text())["parent"]
    assert prov["source"] == "hf" and prov["step"] is None and prov["checkpoint"] == "model.safetensors"
    assert prov["checkpoint_sha256"] == hashlib.sha256((export / "model.safetensors").read_bytes()).hexdigest()
    assert results["tokens"]["fraction"] is None  # an export does not record its steps
    a, b = weights(tmp_path / "x"), weights(rope_run)
    assert all(torch.equal(a[k], b[k]) for k in b)
    out = tmp_path / "pk"
    assert main(["passkey", str(export), "--lengths", "1x", "--depths", "0", "--trials", "1", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["source"] == "hf"


def test_an_extension_run_exports_with_its_new_encoding_context_and_parent(rope_run, tmp_path):
    """`poskit export` of a `poskit extend` run: the scaled encoding and the new context travel with the weights,
    both formats give the extension's own logits, and poskit_run.json carries the extension's provenance."""
    pytest.importorskip("transformers", reason="transformers is not installed: pip install -c constraints.txt "
                                               '-e ".[hf]"')
    import transformers

    from poskit.hf.convert import to_poskit

    ext = tmp_path / "ext"
    extend(rope_run, "rope-yarn:factor=2", CONTEXT, 1, ext, quiet=True, **FAST)
    model, _, cfg = load_extend_run(ext)
    ids = torch.randint(0, model.config.vocab_size, (2, CONTEXT))
    with torch.no_grad():
        expected = model(ids)
    assert main(["export", str(ext), "--hf", str(tmp_path / "hf"), "--quiet"]) == 0
    info = json.loads((tmp_path / "hf" / "poskit_run.json").read_text())
    assert info["train_config"]["task_options"]["context"] == CONTEXT
    assert info["extension"]["parent"]["checkpoint_sha256"] == cfg.parent["checkpoint_sha256"]
    assert info["extension"]["model"]["encoding"] == "rope-yarn" and info["extension"]["max_steps"] == 1
    back = to_poskit(tmp_path / "hf")
    assert back.config.encoding == "rope-yarn" and back.config.encoding_options["factor"] == 2.0
    with torch.no_grad():
        assert torch.allclose(back(ids), expected, atol=1e-5, rtol=0)
    # the native Llama form of an extension of a Llama-shaped run (Llama's own yarn rope_parameters)
    parent = tiny_run(tmp_path / "llama-parent", "rope",
                      model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope", "mlp": "swiglu"})
    extend(parent, "rope-yarn:factor=2", CONTEXT, 1, tmp_path / "llama-ext", quiet=True, **FAST)
    llama_model, _, _ = load_extend_run(tmp_path / "llama-ext")
    llama_dir = tmp_path / "llama"
    assert main(["export", str(tmp_path / "llama-ext"), "--hf", str(llama_dir), "--format", "llama", "--quiet"]) == 0
    llama = transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    assert llama.config.rope_parameters["rope_type"] == "yarn"
    with torch.no_grad():
        assert torch.allclose(llama(ids).logits, llama_model(ids), atol=1e-4, rtol=0)
    # a decoder reloaded from the export is the extension, for passkey and for a further extension
    assert load_decoder(tmp_path / "hf").context == CONTEXT


def test_an_hf_export_without_the_hf_extra_is_refused_naming_the_argument_and_the_extra(monkeypatch, tmp_path):
    export = tmp_path / "hf"
    export.mkdir()
    (export / "poskit_run.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "poskit.hf.convert", None)  # an import of it raises ImportError
    with pytest.raises(ValueError, match=r"RUN '.*hf' is an exported Hugging Face directory, which needs the hf "
                                         r"extra \(pip install"):
        load_decoder(export)


# ------------------------------------------------------------------ passkey command

def test_passkey_command_writes_results_and_the_heat_map(rope_run, tmp_path, capsys):
    out = tmp_path / "pk"
    assert main(["passkey", str(rope_run), "--lengths", "1x,2x", "--depths", "0,0.5,1", "--trials", "2",
                 "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["lengths"] == [PARENT_CONTEXT, 2 * PARENT_CONTEXT] and result["depths"] == [0.0, 0.5, 1.0]
    assert len(result["accuracy"]) == 2 and all(len(row) == 3 for row in result["accuracy"])
    assert result["context"] == PARENT_CONTEXT and result["encoding"] == "rope" and result["trials"] == 2
    assert (out / "passkey.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "passkey accuracy of" in capsys.readouterr().out
    # the command line as typed, with paths under the working directory relative to it (none here: tmp_path)
    assert result["command"].startswith("poskit passkey ") and "--trials 2" in result["command"]
    assert "--depths 0,0.5,1" in result["command"] and f"{rope_run.name}" in result["command"]


def test_passkey_of_an_extension_counts_lengths_from_its_new_context(rope_run, tmp_path):
    extend(rope_run, "rope-yarn", CONTEXT, 0, tmp_path / "x", quiet=True, **FAST)
    result = passkey_report(tmp_path / "x", lengths="1x", depths=[0.0], trials=1, out_dir=tmp_path / "pk")
    assert result["lengths"] == [CONTEXT] and result["source"] == "extend" and result["encoding"].startswith("rope-yarn")
    # called from Python: the equivalent command line, every setting written out
    assert result["command"] == ("poskit passkey .../x --lengths 1x --depths 0.0 --trials 1 --seed 0 "
                                 "--out .../pk")


@pytest.mark.parametrize("flags, message", [
    (["--depths", "0,x"], "--depths must be a comma-separated list of numbers"),
    (["--depths", "1.5"], r"depths must be a finite number in \[0.0, 1.0\], got 1.5"),
    (["--lengths", "1x,abc"], "lengths must be a comma-separated list"),
    (["--trials", "0"], "--trials must be an int >= 1, got 0"),
])
def test_passkey_refusals_write_nothing(flags, message, rope_run, tmp_path, capsys):
    out = tmp_path / "pk"
    with pytest.raises(SystemExit):
        main(["passkey", str(rope_run), "--out", str(out), *flags])
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()
