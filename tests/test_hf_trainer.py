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
