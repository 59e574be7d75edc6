"""`poskit finetune-glue RUN --task T`: fine-tune a masked-language-model run (`poskit reproduce mlm`, or
`poskit train --task mlm-wiki`) on a GLUE task, as RoFormer (paper 002, sec. 4.3) fine-tunes its pretrained
encoder: a classification head on the encoder, all weights trained, the evaluation split's metrics per epoch.

The head reads the mean of the encoder's final hidden states over the real tokens (BERT reads the state of
its [CLS] token, which this encoder was not pretrained with), through dropout 0.1 and one linear layer; STS-B
is a regression (one output, mean-squared error). The optimiser is BERT's fine-tuning recipe: AdamW, weight
decay 0.01, linear warmup over 10 % of the steps, then linear decay to 0.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from poskit.tasks.glue import GLUE_TASKS, encode_split, glue_metrics, load_glue
from poskit.training import atomic_write_json, check_writable_dir, load_run
from poskit.validate import check_choice, check_int, check_real

__all__ = ["SequenceClassifier", "finetune_glue", "FINETUNE_JSON"]

FINETUNE_JSON = "finetune.json"


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


def _predict(model: SequenceClassifier, split, batch_size: int, regression: bool) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad():
        for tokens, mask, _ in split.batches(batch_size):
            logits = model(tokens, mask)
            out.append(logits[:, 0] if regression else logits.argmax(-1))
    model.train()
    return torch.cat(out).numpy()


def finetune_glue(run_dir, task: str, *, data: str | None = None, out_dir=None, epochs: int = 3, lr: float = 5e-5,
                  batch_size: int = 32, max_length: int = 128, seed: int = 0, max_train_examples: int | None = None,
                  quiet: bool = False) -> dict:
    """Fine-tune the encoder of MLM run `run_dir` on GLUE `task`; writes `out_dir`/finetune.json and returns it."""
    check_choice(task, "task", list(GLUE_TASKS))
    epochs = check_int(epochs, "epochs", minimum=1)
    lr = check_real(lr, "lr", minimum=0.0, strict=True)
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    max_length = check_int(max_length, "max_length", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    if max_train_examples is not None:
        check_int(max_train_examples, "max_train_examples", minimum=1)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / f"glue-{task}"
    check_writable_dir(out, "out")
    encoder, mlm_task, cfg = load_run(run_dir)
    if not hasattr(mlm_task, "encode_text"):
        raise ValueError(f"RUN {str(run_dir)!r} was trained on task {cfg.task!r}; fine-tuning needs a "
                         "masked-language-model run (task mlm or mlm-wiki)")
    spec = GLUE_TASKS[task]
    dataset = load_glue(task, data)
    train_rows = dataset["train"]
    if max_train_examples is not None and max_train_examples < len(train_rows):
        train_rows = train_rows.select(range(max_train_examples))
    encode = lambda rows: encode_split(rows, spec, mlm_task.encode_text, mlm_task.ids.eos_id, max_length)  # noqa: E731
    train, evaluation = encode(train_rows), encode(dataset[spec.eval_split])

    torch.manual_seed(seed)
    model = SequenceClassifier(encoder.train(), spec.num_labels)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr)
    steps_per_epoch = -(-len(train.ids) // batch_size)
    total = steps_per_epoch * epochs
    warmup = max(1, round(0.1 * total))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    regression = spec.num_labels == 1
    rng = np.random.default_rng(seed)
    history, t0 = [], time.perf_counter()
    for epoch in range(1, epochs + 1):
        losses = []
        for tokens, mask, labels in train.batches(batch_size, order=rng.permutation(len(train.ids))):
            logits = model(tokens, mask)
            loss = F.mse_loss(logits[:, 0], labels) if regression else F.cross_entropy(logits, labels)
            if not torch.isfinite(loss):
                raise ValueError(f"fine-tuning loss is {loss.item()} in epoch {epoch}: stopped before the update")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        metrics = glue_metrics(spec, _predict(model, evaluation, batch_size, regression), evaluation.labels.numpy())
        history.append({"epoch": epoch, "train_loss": float(np.mean(losses)), **metrics})
        if not quiet:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            print(f"finetune {task} epoch {epoch}/{epochs}: train loss {np.mean(losses):.4f}, {spec.eval_split} "
                  f"{shown}", file=sys.stderr, flush=True)
    results = {"run": str(run_dir), "task": task, "encoding": cfg.model.encoding, "data": data or "nyu-mll/glue",
               "eval_split": spec.eval_split, "metric": spec.metrics[0], "final": history[-1], "epochs": history,
               "settings": {"epochs": epochs, "lr": lr, "batch_size": batch_size, "max_length": max_length,
                            "seed": seed, "max_train_examples": max_train_examples},
               "train_examples": len(train.ids), "eval_examples": len(evaluation.ids),
               "truncated": {"train": train.truncated, spec.eval_split: evaluation.truncated},
               "wall_seconds": round(time.perf_counter() - t0, 2)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / FINETUNE_JSON, results)
    return results
