"""transformers.Trainer trains a PoskitForCausalLM: a few steps on a fixed batch, the loss goes down."""
import pytest
import torch
from extras import need

need("transformers", "hf", "transformers (poskit.hf needs it)")
need("accelerate", "hf", "accelerate (transformers.Trainer needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from hf_helpers import VOCAB, hf_model  # noqa: E402


class _Repeating(torch.utils.data.Dataset):
    """One short periodic sequence, many times: a pattern a two-layer model learns in a few steps."""

    def __init__(self, n=64):
        self.n = n
        self.ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8] * 2)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": self.ids, "labels": self.ids, "attention_mask": torch.ones_like(self.ids)}


@pytest.mark.parametrize("encoding", ["pope", pytest.param("cope", marks=pytest.mark.slow)])
def test_trainer_loss_decreases(encoding, tmp_path):
    from transformers import Trainer, TrainingArguments

    model = hf_model(encoding, dtype=None).train()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=12, learning_rate=1e-2,
                             lr_scheduler_type="constant",
                             logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0,
                             disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=_Repeating())
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3
    assert losses[0] == pytest.approx(float(torch.log(torch.tensor(float(VOCAB)))), rel=0.15)  # starts near uniform


def _train(model, tmp_path, steps=6, **kw):
    from transformers import Trainer, TrainingArguments

    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=steps, learning_rate=1e-2,
                lr_scheduler_type="constant", logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0,
                disable_tqdm=True, dataloader_num_workers=0)
    args.update(kw)
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=_Repeating())
    trainer.train()
    return [log["loss"] for log in trainer.state.log_history if "loss" in log]


def test_trainer_with_gradient_checkpointing_trains_as_without(tmp_path):
    import warnings

    plain = _train(hf_model("rope", dtype=None).train(), tmp_path / "plain")
    model = hf_model("rope", dtype=None).train()
    calls = []
    model.model.blocks[0].attn.register_forward_pre_hook(lambda *a: calls.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames it activation_checkpointing
        checkpointed = _train(model, tmp_path / "checkpointed", gradient_checkpointing=True)
    assert model.model.gradient_checkpointing and len(calls) == 2 * 6  # each step's forward, then its recompute
    assert checkpointed == plain and plain[-1] < plain[0]


@pytest.mark.parametrize("projection", [False, True])
def test_trainer_and_poskits_optimizer_step_treat_popes_phase_bias_alike(projection, tmp_path):
    """The same model, data and AdamW settings: transformers' Trainer and poskit's own optimizer_step leave PoPE's
    phase bias where the encoding's rule puts it (projected into [-2 pi, 0] after each step, or clamped in the
    forward pass only), because the rule is the encoding's own, run by any torch optimizer's step."""
    from poskit.encodings.pope import DELTA_MAX, DELTA_MIN
    from poskit.tasks.base import Batch
    from poskit.training import TrainConfig, make_optimizer, optimizer_step

    lr, steps = 5e-2, 6
    options = {"delta_init": "zero", "delta_projection": projection}
    hf = hf_model("pope", dtype=None, position_encoding_options=options).train()
    own = hf_model("pope", dtype=None, position_encoding_options=options).model.train()  # the same seed: equal
    assert all(torch.equal(a, b) for a, b in zip(hf.model.state_dict().values(), own.state_dict().values()))
    _train(hf, tmp_path, steps=steps, learning_rate=lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.98,
           max_grad_norm=1.0, optim="adamw_torch")
    cfg = TrainConfig(model=own.config, lr=lr, min_lr=lr, warmup_steps=0, weight_decay=0.0, beta1=0.9, beta2=0.98,
                      grad_clip=1.0, max_steps=steps)
    opt = make_optimizer(own, cfg)
    ids = _Repeating().ids.expand(8, -1)
    for step in range(steps):  # the loss transformers takes: each token predicts the next one
        optimizer_step(own, opt, Batch(inputs=ids[:, :-1].clone(), targets=ids[:, 1:].clone()), cfg, step)
    hf_delta = torch.stack([b.attn.encoding.delta.detach() for b in hf.model.blocks])
    own_delta = torch.stack([b.attn.encoding.delta.detach() for b in own.blocks])
    torch.testing.assert_close(hf_delta, own_delta, rtol=0, atol=1e-4)  # the two losses round differently
    for delta in (hf_delta, own_delta):
        if projection:
            assert DELTA_MIN <= delta.min().item() and delta.max().item() <= DELTA_MAX
            assert (delta == DELTA_MAX).any()  # entries pushed above the bound were put back on it
        else:
            assert delta.max().item() > DELTA_MAX + 1e-3  # entries pushed above the bound stay there


def test_a_deep_copied_model_projects_popes_phase_bias_too():
    import copy

    from poskit.encodings.pope import DELTA_MAX

    model = copy.deepcopy(hf_model("pope", dtype=None, position_encoding_options={"delta_projection": True}).model)
    enc = model.blocks[0].attn.encoding
    with torch.no_grad():
        enc.delta.fill_(0.5)
    enc.delta.grad = torch.zeros_like(enc.delta)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert enc.delta.max().item() <= DELTA_MAX
