"""PoPE's phase bias delta is clamped to [-2 pi, 0] in the forward pass; the clamp passes no gradient to an
entry outside the interval. By default that is all (the clamp-only rule). With delta_projection=True delta is
also put back after each optimizer step, by the encoding itself (a step hook on every torch optimizer), so
every entry keeps its gradient in any training loop; forward numbers are unchanged for delta inside the
interval."""
import math

import pytest
import torch

import poskit
from poskit.encodings import project_parameters_
from poskit.encodings.pope import DELTA_MAX, DELTA_MIN
from poskit.models import ModelConfig, Transformer
from poskit.training import TrainConfig, make_optimizer, optimizer_step


def _train_delta(projection: bool, steps: int = 20, seed: int = 0):
    """AdamW on a PoPE attention layer's delta (zero init, the default); returns the encoding and the
    fraction of delta's entries whose gradient was nonzero at the last step."""
    torch.manual_seed(seed)
    enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, delta_projection=projection)
    opt = torch.optim.AdamW(enc.parameters(), lr=0.05, weight_decay=0.0)
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    target = torch.randn(2, 2, 16, 8)
    for _ in range(steps):  # a plain loop: nothing poskit-specific after the step
        opt.zero_grad()
        loss = (poskit.attention(q, k, v, enc) - target).pow(2).mean()
        loss.backward()
        live = (enc.delta.grad != 0).float().mean().item()
        opt.step()
    return enc, live


def test_the_clamp_alone_strands_entries_and_the_projection_keeps_every_gradient():
    _, live_clamped = _train_delta(projection=False)
    enc, live_projected = _train_delta(projection=True)
    assert live_clamped < 0.9  # about half of the zero-initialised entries stepped above 0 and stayed there
    assert live_projected == 1.0
    assert DELTA_MIN <= enc.delta.min().item() and enc.delta.max().item() <= DELTA_MAX


def test_projection_puts_out_of_range_entries_on_the_nearest_bound_and_keeps_the_others():
    enc = poskit.build_encoding("pope", head_dim=4, num_heads=1, delta_projection=True)
    with torch.no_grad():
        enc.delta.copy_(torch.tensor([[0.3, -1.0, -7.0, -2 * math.pi]]))
    assert project_parameters_(enc) == 1
    assert torch.equal(enc.delta.detach(), torch.tensor([[0.0, -1.0, -2 * math.pi, -2 * math.pi]]))  # fp32 bounds
    off = poskit.build_encoding("pope", head_dim=4, num_heads=1, delta_projection=False)
    with torch.no_grad():
        off.delta.fill_(0.5)
    project_parameters_(off)
    assert off.delta.eq(0.5).all()  # delta_projection=False: the clamp only


def test_forward_numbers_do_not_depend_on_the_projection_option_for_delta_in_range():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64) for _ in range(3))
    outs = []
    for projection in (False, True):
        enc = poskit.build_encoding("pope", head_dim=8, num_heads=2, delta_init="uniform", delta_projection=projection)
        with torch.no_grad():
            enc.delta.copy_(torch.linspace(DELTA_MIN, DELTA_MAX, 16).reshape(2, 8))
        before = enc.delta.detach().clone()
        project_parameters_(enc)
        assert torch.equal(enc.delta, before)  # in range: the projection changes nothing
        outs.append(poskit.attention(q, k, v, enc))
    assert torch.equal(outs[0], outs[1])


def test_the_default_is_the_clamp_alone():
    enc = poskit.build_encoding("pope", head_dim=4, num_heads=1)
    assert enc.delta_projection is False
    opt = torch.optim.SGD(enc.parameters(), lr=1.0)
    enc.delta.grad = torch.full_like(enc.delta, -0.5)  # one step pushes every entry to +0.5, above the bound
    opt.step()
    assert enc.delta.eq(0.5).all()  # left where the step put it: the forward pass clamps it to 0
    q = torch.randn(1, 1, 6, 4)
    zero = poskit.build_encoding("pope", head_dim=4, num_heads=1)
    assert torch.equal(poskit.attention(q, q, q, enc), poskit.attention(q, q, q, zero))


def test_the_projection_acts_only_through_optimizers_that_hold_delta():
    enc = poskit.build_encoding("pope", head_dim=4, num_heads=1, delta_projection=True)
    other = torch.nn.Parameter(torch.zeros(3))
    with torch.no_grad():
        enc.delta.fill_(0.7)
    other.grad = torch.ones(3)
    torch.optim.SGD([other], lr=0.1).step()  # an optimizer of something else: delta untouched
    assert enc.delta.eq(0.7).all()
    enc.delta.grad = torch.zeros_like(enc.delta)
    torch.optim.AdamW(enc.parameters(), lr=0.1).step()
    assert enc.delta.eq(0.0).all()  # projected onto the bound by the step itself
    enc.delta_projection = False  # the flag is read at each step
    with torch.no_grad():
        enc.delta.fill_(0.7)
    torch.optim.SGD(enc.parameters(), lr=0.1).step()
    assert enc.delta.eq(0.7).all()


@pytest.mark.parametrize("projection", [False, True])
def test_the_trainer_applies_the_encodings_rule(projection):
    options = {"delta_projection": projection}
    cfg = TrainConfig(task="flip-flop", task_options={"length": 16, "eval_size": 8}, batch_size=4, max_steps=5,
                      lr=0.05, model=ModelConfig(d_model=16, n_layers=1, n_heads=2, encoding="pope",
                                                 encoding_options=options))
    from poskit.training.step import build_model, build_task_for

    task = build_task_for(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, task)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)
    for step in range(5):
        optimizer_step(model, opt, task.train_batch(cfg.batch_size, gen, step=step), cfg, step)
    deltas = torch.cat([enc.delta.detach().flatten() for enc in model.encoding_modules()])
    if projection:
        assert deltas.max().item() <= DELTA_MAX and deltas.min().item() >= DELTA_MIN
        assert (deltas == 0).any() and (deltas < 0).any()  # some entries were pushed up and projected back
    else:
        assert deltas.max().item() > DELTA_MAX  # some entries were pushed above 0 and left there


def test_project_parameters_needs_a_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        project_parameters_([1, 2])
    model = Transformer(ModelConfig(vocab_size=8, d_model=16, n_layers=2, n_heads=2, encoding="rope"))
    assert project_parameters_(model) == 2  # one encoding per layer, nothing to project for rope


@pytest.mark.parametrize("copy_kind", ["deepcopy", "pickle"])
def test_a_copied_encoding_keeps_its_rule(copy_kind):
    import copy
    import io

    original = poskit.build_encoding("pope", head_dim=4, num_heads=1, delta_projection=True)
    if copy_kind == "deepcopy":
        enc = copy.deepcopy(original)
    else:
        buffer = io.BytesIO()
        torch.save(original, buffer)
        buffer.seek(0)
        enc = torch.load(buffer, weights_only=False)
    assert enc is not original and enc.delta_projection
    with torch.no_grad():
        enc.delta.fill_(0.5)
    enc.delta.grad = torch.zeros_like(enc.delta)
    torch.optim.SGD(enc.parameters(), lr=0.1).step()
    assert enc.delta.eq(0.0).all()  # the copy is projected by the step, as the original would be


def test_statistics_say_where_delta_sits():
    enc = poskit.build_encoding("pope", head_dim=4, num_heads=1)
    with torch.no_grad():
        enc.delta.copy_(torch.tensor([[0.5, 0.0, -1.0, -7.0]]))
    stats = enc.statistics()
    assert stats["delta_at_zero"] == 0.5 and stats["delta_at_minus_2pi"] == 0.25 and stats["delta_inside"] == 0.25
    assert stats["delta_min"] == pytest.approx(-2 * math.pi) and stats["delta_mean"] == pytest.approx(
        (0 + 0 - 1 - 2 * math.pi) / 4)
    assert poskit.build_encoding("pope", head_dim=4, num_heads=1, phase_bias=False).statistics() == {}
    assert poskit.build_encoding("rope", head_dim=4, num_heads=1).statistics() == {}


@pytest.mark.parametrize("encoding", ["pope", "rope"])
def test_the_trainer_logs_encoding_statistics_beside_each_evaluation(encoding, tmp_path):
    import json

    from poskit.training import train

    cfg = TrainConfig(task="flip-flop", task_options={"length": 16, "eval_size": 8}, batch_size=4, max_steps=4,
                      eval_every=2, eval_batches=1, final_eval_batches=1,
                      model=ModelConfig(d_model=16, n_layers=2, n_heads=2, encoding=encoding))
    train(cfg, tmp_path / "run", quiet=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    stats = [r for r in records if "encoding" in r]
    if encoding == "rope":
        assert not stats
        return
    assert [r["step"] for r in stats] == [r["step"] for r in records if "split" in r] == [2, 4]
    assert sorted(stats[-1]["encoding"]) == ["blocks.0.attn.encoding", "blocks.1.attn.encoding"]
    assert 0 <= stats[-1]["encoding"]["blocks.0.attn.encoding"]["delta_at_zero"] <= 1
