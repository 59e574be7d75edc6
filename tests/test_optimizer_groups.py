"""One rule for the optimizer's parameter groups of every model (training.step.decay_groups): weight decay on the
weight matrices of linear layers only; and a run checkpointed under the older rule continues with its own."""
import json

import pytest
import torch

from poskit.encodings.base import PositionalEncoding
from poskit.models import ModelConfig, Transformer
from poskit.training import CHECKPOINT_FILE, LEGACY_CHECKPOINT_FILE, RESULTS_FILE, TrainConfig, read_checkpoint, train
from poskit.training.step import LEGACY_RULE, decay_groups

from checkpoint_helpers import to_legacy

pytestmark = pytest.mark.usefixtures("one_thread")


def _decayed(model, weight_decay=0.1, rule=None) -> set:
    groups = decay_groups(model, weight_decay) if rule is None else decay_groups(model, weight_decay, rule)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))  # every parameter, once
    return {names[id(p)] for g in groups if g.get("weight_decay") for p in g["params"]}


def _encoding_names(model) -> set:
    return {f"{m}.{n}" for m, mod in model.named_modules() if isinstance(mod, PositionalEncoding)
            for n, _ in mod.named_parameters()}


@pytest.mark.parametrize("encoding,tie", [("pope", False), ("pope", True), ("cope", False), ("relative", False),
                                          ("learned", False)])
def test_only_linear_weight_matrices_are_decayed(encoding, tie):
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, encoding=encoding,
                                    tie_embeddings=tie))
    decayed = _decayed(model)
    linear = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert decayed == linear - {"head.weight" if tie else ""} - _encoding_names(model)
    assert _encoding_names(model) and not decayed & _encoding_names(model)  # PoPE's delta, CoPE's/relative's tables
    assert "embed.weight" not in decayed and not any("norm" in n or n.endswith("bias") for n in decayed)


def test_the_vit_table_and_the_fine_tune_classifier_follow_the_same_rule():
    from poskit.training.recipes.glue import SequenceClassifier
    from poskit.models.vit import ViT

    vit = ViT(encoding="learned", dim=16, heads=2)
    assert "table" not in _decayed(vit) and "embed.weight" in _decayed(vit) and "head.weight" in _decayed(vit)
    pope = ViT(encoding="pope", dim=16, heads=2)
    assert _encoding_names(pope) and not _decayed(pope) & _encoding_names(pope)  # was decayed before the rule
    clf = SequenceClassifier(Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2,
                                                     encoding="pope", causal=False)), 2)
    decayed = _decayed(clf)
    assert "classifier.weight" in decayed and "encoder.embed.weight" not in decayed
    assert not decayed & _encoding_names(clf)


def test_no_weight_decay_is_one_group_and_the_legacy_rule_decays_embeddings():
    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding="pope"))
    assert len(decay_groups(model, 0.0)) == 1
    legacy = _decayed(model, rule=LEGACY_RULE)
    assert "embed.weight" in legacy and not legacy & _encoding_names(model)
    assert len(decay_groups(model, 0.0, LEGACY_RULE)) == 2  # as every checkpoint of that time holds


TINY = dict(task="flip-flop", task_options={"length": 16, "eval_size": 32, "eval_batch_size": 32},
            model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "pope", "dropout": 0.1}, batch_size=8,
            max_steps=12, lr=3e-3, warmup_steps=2, eval_every=6, log_every=3, checkpoint_every=6)


def test_a_run_checkpointed_under_the_older_rule_continues_exactly_with_it(tmp_path, monkeypatch):
    import poskit.training.loop as loop

    cfg = TrainConfig.from_dict(TINY)
    with monkeypatch.context() as m:  # what poskit before the rule trained and checkpointed
        m.setattr(loop, "DECAY_RULE", LEGACY_RULE)
        old = train(cfg, tmp_path / "old", quiet=True)
        assert train(cfg, tmp_path / "stopped", stop_after=6, quiet=True) is None
    train(cfg, tmp_path / "new", quiet=True)
    weights = {name: read_checkpoint(tmp_path / name / CHECKPOINT_FILE)["model"] for name in ("old", "new")}
    assert not torch.equal(weights["old"]["embed.weight"], weights["new"]["embed.weight"])  # the rules differ
    run = tmp_path / "stopped"
    to_legacy(run)  # a checkpoint.pt of that time: no record of its rule
    state = torch.load(run / LEGACY_CHECKPOINT_FILE, weights_only=True)
    del state["decay_rule"]
    torch.save(state, run / LEGACY_CHECKPOINT_FILE)
    resumed = train(None, run, resume=True, quiet=True)
    assert resumed["final_train_loss"] == old["final_train_loss"] and resumed["splits"] == old["splits"]
    state = read_checkpoint(run / CHECKPOINT_FILE)
    assert all(torch.equal(state["model"][k], weights["old"][k]) for k in state["model"])  # bit for bit
    assert state["decay_rule"] == LEGACY_RULE  # and keeps it from then on
    assert json.loads((run / RESULTS_FILE).read_text())["steps"] == 12


def test_no_weight_decay_means_none_in_adamw():
    """weight_decay=0 must reach AdamW, whose own default is 0.01: a parameter with a zero gradient stays put."""
    from poskit.training import make_optimizer

    model = Transformer(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding="rope"))
    opt = make_optimizer(model, TrainConfig(model=model.config, weight_decay=0.0))
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
