"""The translation trainer's checkpoints use the shared checkpoint store (checkpoint.json + safetensors
weights + training state); legacy checkpoint.pt runs are still read and converted; a damaged file is one
RunFileError naming it, raised before the run directory changes. (Exact resume on the real corpus:
test_translation_reproduce.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from poskit.training import CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, RunFileError
from poskit.training.checkpoint_store import MODEL_CONFIG_FILE, STATE_FILE, WEIGHTS_FILE
from poskit.training.rng import rng_state
from poskit.training.recipes import seq2seq
from poskit.training.recipes.seq2seq import Seq2SeqConfig, read_seq2seq_checkpoint

from seq2seq_checkpoint_helpers import write_legacy
from extras import need

TINY_MODEL = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_encoder_layers": 1, "n_decoder_layers": 1,
              "encoding": "rope"}


def _cfg(**model) -> Seq2SeqConfig:
    return Seq2SeqConfig(model={**TINY_MODEL, **model}, vocab_size=50, max_steps=4)


def _trained_pair(cfg: Seq2SeqConfig, seed: int = 0):
    """A model and Adam optimizer with one step taken (so the optimizer has moments to save)."""
    torch.manual_seed(seed)
    model, opt = seq2seq._fresh_model(cfg)
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 6))
    ones_src, ones_tgt = torch.ones(2, 5, dtype=torch.bool), torch.ones(2, 6, dtype=torch.bool)
    model(src, tgt, ones_src, ones_tgt).float().pow(2).mean().backward()
    opt.step()
    return model, opt


def _save_checkpoint(run: Path, cfg: Seq2SeqConfig, model, opt, step: int, epoch: int, position: int) -> None:
    """A checkpoint with the entries the translation recipe saves, through the checkpoint store."""
    from poskit.training.checkpoint_store import write_checkpoint

    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "epoch": epoch,
             "position": position, "rng": rng_state(), "config": cfg.to_dict(), "world_size": 1}
    write_checkpoint(run, state, model.config.to_dict())


def _run(tmp_path: Path, legacy: bool = False, **model) -> tuple[Path, Seq2SeqConfig, object, object]:
    cfg = _cfg(**model)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    model, opt = _trained_pair(cfg)
    _save_checkpoint(run, cfg, model, opt, 3, 1, 2)
    if legacy:
        write_legacy(run, read_seq2seq_checkpoint(run)[0])
    return run, cfg, model, opt


def _assert_same_tree(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same_tree(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_tree(x, y)
    else:
        assert a == b


def _snapshot(run: Path) -> dict:
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_checkpoint_is_the_stores_format_and_reads_back_what_was_saved(tmp_path):
    run, cfg, model, opt = _run(tmp_path)
    record = json.loads((run / CHECKPOINT_FILE).read_text())
    directory = run / record["directory"]
    assert set(record["files"]) == {WEIGHTS_FILE, MODEL_CONFIG_FILE, STATE_FILE} and not (run / LEGACY_CHECKPOINT_FILE).exists()
    from safetensors.torch import load_file

    _assert_same_tree({k: v for k, v in model.state_dict().items()}, load_file(directory / WEIGHTS_FILE))
    assert json.loads((directory / MODEL_CONFIG_FILE).read_text()) == cfg.model_config().to_dict()
    state, path = read_seq2seq_checkpoint(run)
    assert path == directory / STATE_FILE
    assert (state["step"], state["epoch"], state["position"], state["config"]) == (3, 1, 2, cfg.to_dict())
    _assert_same_tree(opt.state_dict(), state["optimizer"])
    # the weights stand alone: a fresh model loaded from them computes what the saved one does
    fresh, _ = seq2seq._fresh_model(cfg)
    fresh.load_state_dict(state["model"])
    src, tgt = torch.randint(4, 50, (1, 4)), torch.randint(4, 50, (1, 3))
    masks = torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    assert torch.equal(fresh.eval()(src, tgt, *masks), model.eval()(src, tgt, *masks))


def test_a_legacy_checkpoint_reads_back_its_entries(tmp_path):
    run, cfg, model, opt = _run(tmp_path, legacy=True)
    state, path = read_seq2seq_checkpoint(run)
    assert path == run / LEGACY_CHECKPOINT_FILE
    _assert_same_tree(model.state_dict(), state["model"])
    _assert_same_tree(opt.state_dict(), state["optimizer"])


def _damage(path: Path, kind: str, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    if kind == "truncate":
        path.write_bytes(bytes(data[: offset % len(data)]))
    elif kind == "zero":
        path.write_bytes(bytes(len(data)))
    else:  # flip one byte
        data[offset % len(data)] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("pristine"))[0]


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from([WEIGHTS_FILE, MODEL_CONFIG_FILE, STATE_FILE]),
       kind=st.sampled_from(["truncate", "zero", "flip"]), offset=st.integers(0, 10**6))
def test_any_damaged_checkpoint_file_is_refused_naming_it(pristine, tmp_path_factory, name, kind, offset):
    run = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(pristine, run)
    target = run / json.loads((run / CHECKPOINT_FILE).read_text())["directory"] / name
    _damage(target, kind, offset)
    with pytest.raises(RunFileError) as e:
        read_seq2seq_checkpoint(run)
    assert e.value.path == target and str(e.value).startswith(str(target))


# (a byte flipped inside a legacy file's tensor data goes unnoticed: the old format records no hashes, which is
# one reason for the current one)
@pytest.mark.parametrize("kind", ["truncate", "zero"])
def test_a_damaged_legacy_checkpoint_is_refused_naming_it(tmp_path, kind):
    run, *_ = _run(tmp_path, legacy=True)
    _damage(run / LEGACY_CHECKPOINT_FILE, kind, offset=len((run / LEGACY_CHECKPOINT_FILE).read_bytes()) // 2)
    with pytest.raises(RunFileError) as e:
        read_seq2seq_checkpoint(run)
    assert e.value.path == run / LEGACY_CHECKPOINT_FILE


def test_a_legacy_checkpoint_without_an_entry_is_refused_naming_the_entry(tmp_path):
    run, *_ = _run(tmp_path, legacy=True)
    state = torch.load(run / LEGACY_CHECKPOINT_FILE, weights_only=True)
    del state["position"]
    torch.save(state, run / LEGACY_CHECKPOINT_FILE)
    with pytest.raises(RunFileError, match=r"checkpoint\.pt: lacks entry 'position'"):
        read_seq2seq_checkpoint(run)


@pytest.mark.parametrize("legacy", [False, True])
def test_resuming_a_damaged_run_fails_before_anything_changes(tmp_path, legacy):
    need("sacrebleu", "data", "sacrebleu (the translation trainer checks for it first)")
    run, cfg, *_ = _run(tmp_path, legacy=legacy)
    if legacy:
        target = run / LEGACY_CHECKPOINT_FILE
    else:
        target = run / json.loads((run / CHECKPOINT_FILE).read_text())["directory"] / STATE_FILE
    _damage(target, "truncate", offset=100)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "train_loss": 1.0, "lr": 1e-3, "elapsed": 1.0}) + "\n")
    (run / ".metrics.jsonl.tmp123").write_text("a killed writer's leftover")
    before = _snapshot(run)
    with pytest.raises(RunFileError) as e:
        seq2seq.train_seq2seq(cfg, run, quiet=True)
    assert e.value.path == target
    assert _snapshot(run) == before


def test_convert_checkpoint_rewrites_a_translation_run_and_keeps_its_state(tmp_path, capsys):
    from poskit.cli import main

    run, cfg, model, opt = _run(tmp_path, legacy=True)
    legacy = torch.load(run / LEGACY_CHECKPOINT_FILE, weights_only=True)
    assert main(["convert-checkpoint", str(run)]) == 0
    assert "converted" in capsys.readouterr().out
    assert not (run / LEGACY_CHECKPOINT_FILE).exists() and (run / CHECKPOINT_FILE).exists()
    state, path = read_seq2seq_checkpoint(run)
    assert path.name == STATE_FILE
    for key in ("model", "optimizer", "step", "epoch", "position", "rng"):
        _assert_same_tree(legacy[key], state[key])
    assert state["config"] == cfg.to_dict()
    # converting again: nothing left to convert, said so
    with pytest.raises(ValueError, match="no checkpoint.pt to convert"):
        seq2seq.convert_legacy_seq2seq_checkpoint(run)


def test_convert_checkpoint_refuses_another_models_legacy_checkpoint_and_changes_nothing(tmp_path):
    from poskit.training.convert import convert_checkpoint

    run, cfg, *_ = _run(tmp_path, legacy=True)
    other = _cfg(d_model=32)
    model, opt = _trained_pair(other)
    write_legacy(run, {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3, "epoch": 0,
                       "position": 3, "rng": rng_state()})
    before = _snapshot(run)
    with pytest.raises(RunFileError, match=r"checkpoint\.pt: does not fit the run's model") as e:
        convert_checkpoint(run)
    assert e.value.path == run / LEGACY_CHECKPOINT_FILE
    assert _snapshot(run) == before
