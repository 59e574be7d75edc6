"""The GLUE recipe: fine-tune the encoder of a masked-language-model run on a GLUE task, as RoFormer (paper 002,
sec. 4.3) fine-tunes its pretrained encoder: a classification head on the encoder, all weights trained, the
evaluation split's metrics after every epoch (`poskit finetune-glue`).

The head reads the mean of the encoder's final hidden states over the real tokens (BERT reads the state of
its [CLS] token, which this encoder was not pretrained with), through dropout 0.1 and one linear layer; STS-B
is a regression (one output, mean-squared error). The optimiser is BERT's fine-tuning recipe: AdamW, weight
decay 0.01, linear warmup over 10 % of the steps, then linear decay to 0, gradients clipped at norm 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..files import read_metrics
from ..rng import seed_everything
from ..step import DECAY_RULE, decay_groups
from .base import Draws, EpochStream, Loop, Recipe, config_dict, slices


class SequenceClassifier(nn.Module):
    """A pretrained `Transformer` (its output head unused) + mean pooling over real tokens + dropout + linear."""

    def __init__(self, encoder: nn.Module, num_labels: int, dropout: float = 0.1):
        super().__init__()
        self.encoder = encoder
        self.drop = nn.Dropout(dropout)
        self.classifier = nn.Linear(encoder.config.d_model, num_labels)
        nn.init.normal_(self.classifier.weight, std=encoder.config.init_std)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """tokens, attention_mask (B, T) -> (B, num_labels) logits (or (B, 1) scores)."""
        hidden = self.encoder.features(tokens, attention_mask=attention_mask)  # (B, T, d_model)
        real = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
        pooled = (hidden * real).sum(1) / real.sum(1).clamp(min=1.0)
        return self.classifier(self.drop(pooled))


@config_dict
@dataclass
class GlueConfig:
    """One fine-tune: the MLM run it starts from, the GLUE task and data, and the optimiser's settings."""

    run: str
    """Run directory of the masked-language-model run."""
    task: str
    """GLUE task (poskit.tasks.glue.GLUE_TASKS)."""
    data: str | None = None
    """A directory saved by DatasetDict.save_to_disk (hf:DIR), or a hub dataset; None: nyu-mll/glue."""
    model: dict = field(default_factory=dict)
    """{"encoding": the MLM run's encoding} (recorded to check results against)."""
    seed: int = 0
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 32
    max_length: int = 128
    max_train_examples: int | None = None


def _predict(model: SequenceClassifier, split, batch_size: int, regression: bool) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad():
        for tokens, mask, _ in split.batches(batch_size):
            logits = model(tokens, mask)
            out.append(logits[:, 0] if regression else logits.argmax(-1))
    model.train()
    return torch.cat(out).numpy()


class GlueRecipe(Recipe):
    config_type = GlueConfig
    writer = "poskit's fine-tuning trainer"
    results_file = "finetune.json"
    state_entries = {"epoch": int, "position": int}

    def loop(self) -> Loop:
        per_epoch = -(-len(self.train.ids) // self.config.batch_size)
        self.total = per_epoch * self.config.epochs
        # one loss record, evaluation and checkpoint per epoch
        return Loop(self.total, self.config.seed, per_epoch, per_epoch, per_epoch, grad_clip=1.0)

    def identity(self) -> dict:
        return {"task": self.config.task, "encoding": self.config.model.get("encoding"), "seed": self.config.seed}

    def build_model(self):
        """The MLM run's encoder (checked as a resume checks it), the GLUE splits encoded with its tokenizer,
        and the classifier's head, seeded from the config."""
        from poskit.tasks.glue import GLUE_TASKS, encode_split, load_glue

        from ..run import load_run

        c = self.config
        encoder, mlm_task, mlm_cfg = load_run(c.run)
        if not hasattr(mlm_task, "encode_text"):
            raise ValueError(f"RUN {c.run!r} was trained on task {mlm_cfg.task!r}; fine-tuning needs a "
                             "masked-language-model run (task mlm or mlm-wiki)")
        self.spec = spec = GLUE_TASKS[c.task]
        dataset = load_glue(c.task, c.data)
        rows = dataset["train"]
        if c.max_train_examples is not None and c.max_train_examples < len(rows):
            rows = rows.select(range(c.max_train_examples))
        encode = lambda r: encode_split(r, spec, mlm_task.encode_text, mlm_task.ids.eos_id, c.max_length)  # noqa: E731
        self.train, self.evaluation = encode(rows), encode(dataset[spec.eval_split])
        self.stream = EpochStream(Draws(lambda: np.random.default_rng(c.seed),
                                        lambda rng: slices(rng.permutation(len(self.train.ids)), c.batch_size)))
        seed_everything(c.seed)
        return SequenceClassifier(encoder.train(), spec.num_labels)

    def model_config(self, model) -> dict:
        return {"encoder": model.encoder.config.to_dict(), "num_labels": model.classifier.out_features}

    def optimizer(self, model, rule: str = DECAY_RULE):
        return torch.optim.AdamW(decay_groups(model, 0.01, rule), lr=self.config.lr)

    def lr_at(self, step: int) -> float:
        warmup = max(1, round(0.1 * self.total))
        factor = (step + 1) / warmup if step < warmup else max(0.0, (self.total - step) / max(1, self.total - warmup))
        return self.config.lr * factor

    def next_batch(self, step: int, procs):
        rows = self.stream.next()
        return next(self.train.batches(len(rows), order=rows))

    def data_state(self) -> dict:
        return self.stream.state()

    def load_data_state(self, state: dict) -> None:
        self.stream.load(state)

    def loss(self, net, batch, procs):
        tokens, mask, labels = batch
        logits = net(tokens, mask)
        loss = F.mse_loss(logits[:, 0], labels) if self.spec.num_labels == 1 else F.cross_entropy(logits, labels)
        return loss, loss.item()

    def evaluate(self, trainer):
        from poskit.tasks.glue import glue_metrics

        predictions = _predict(trainer.model, self.evaluation, self.config.batch_size, self.spec.num_labels == 1)
        return self.spec.eval_split, glue_metrics(self.spec, predictions, self.evaluation.labels.numpy())

    def final_results(self, trainer) -> dict:
        """finetune.json: the evaluation split's metrics after every epoch (from the metrics log) and the last."""
        c, spec, per_epoch = self.config, self.spec, trainer.loop.eval_every
        log = read_metrics(trainer.run_dir)
        losses = {m["step"]: m["train_loss"] for m in log if "train_loss" in m}
        history = [{"epoch": m["step"] // per_epoch, "train_loss": losses[m["step"]],
                    **{k: v for k, v in m.items() if k not in ("step", "split")}} for m in log if "split" in m]
        return {"run": c.run, **self.identity(), "data": c.data or "nyu-mll/glue", "eval_split": spec.eval_split,
                "metric": spec.metrics[0], "final": history[-1], "epochs": history,
                "settings": {"epochs": c.epochs, "lr": c.lr, "batch_size": c.batch_size, "max_length": c.max_length,
                             "seed": c.seed, "max_train_examples": c.max_train_examples},
                "train_examples": len(self.train.ids), "eval_examples": len(self.evaluation.ids),
                "truncated": {"train": self.train.truncated, spec.eval_split: self.evaluation.truncated},
                "wall_seconds": round(trainer.elapsed, 2)}
