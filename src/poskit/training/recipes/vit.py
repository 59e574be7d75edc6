"""The ViT recipe: a `ViT` classifier on scikit-learn's 8x8 digits (`poskit digits`), AdamW with a 5 % warmup
and a cosine decay to lr / 10, evaluated at the end on larger images (upsampled, and the digit on a canvas)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..files import read_metrics
from ..rng import seed_everything
from ..step import DECAY_RULE, decay_groups
from .base import Draws, EpochStream, Loop, Recipe, config_dict, slices


@config_dict
@dataclass
class ViTConfig:
    """One digits run: the encoding (in `model`), the seed, and the settings every run of a demo shares."""

    model: dict = field(default_factory=dict)
    """{"encoding": one of VIT_ENCODINGS}."""
    seed: int = 0
    settings: dict = field(default_factory=dict)
    """patch, eval_sizes, canvas_size, dim, depth, heads, epochs, batch_size, lr, weight_decay (DigitsSettings)."""
    task: str = "digits"


@torch.no_grad()
def accuracy(model, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    correct = sum(int((model(images[i:i + 256]).argmax(-1) == labels[i:i + 256]).sum())
                  for i in range(0, len(images), 256))
    return correct / len(images)


class ViTRecipe(Recipe):
    config_type = ViTConfig
    writer = "poskit's digits trainer"
    results_file = "result.json"
    state_entries = {"epoch": int, "position": int}

    def __init__(self, config: ViTConfig, data=None):
        super().__init__(config)
        self._data = data

    @property
    def data(self):
        if self._data is None:
            from ...data.digits import load_digits_splits

            self._data = load_digits_splits()
        return self._data

    def loop(self) -> Loop:
        s = self.config.settings
        per_epoch = math.ceil(len(self.data.labels["train"]) / s["batch_size"])
        self.total = s["epochs"] * per_epoch
        # the loss of every step (the last one is the run's final_train_loss), no evaluation while training,
        # a checkpoint per epoch
        return Loop(self.total, self.config.seed, 1, self.total, per_epoch)

    def identity(self) -> dict:
        return {"task": self.config.task, "encoding": self.config.model["encoding"], "seed": self.config.seed}

    def build_model(self):
        from ...models.vit import ViT

        s, seed = self.config.settings, self.config.seed
        x = self.data.images["train"]
        self.stream = EpochStream(Draws(lambda: torch.Generator().manual_seed(seed),
                                        lambda g: slices(torch.randperm(len(x), generator=g), s["batch_size"])))
        seed_everything(seed)
        return ViT(encoding=self.config.model["encoding"], patch=s["patch"], train_size=8, dim=s["dim"],
                   depth=s["depth"], heads=s["heads"])

    def model_config(self, model) -> dict:
        s = self.config.settings
        return {"encoding": self.config.model["encoding"], "patch": s["patch"], "train_size": 8, "dim": s["dim"],
                "depth": s["depth"], "heads": s["heads"]}

    def optimizer(self, model, rule: str = DECAY_RULE):
        s = self.config.settings
        return torch.optim.AdamW(decay_groups(model, s["weight_decay"], rule), lr=s["lr"])

    def lr_at(self, step: int) -> float:
        lr, total = self.config.settings["lr"], self.total
        warm = max(1, round(0.05 * total))
        if step < warm:
            return lr * (step + 1) / warm
        progress = (step - warm) / max(1, total - warm)
        return lr / 10 + (lr - lr / 10) * 0.5 * (1 + math.cos(math.pi * progress))

    def next_batch(self, step: int, procs):
        idx = self.stream.next()
        return self.data.images["train"][idx], self.data.labels["train"][idx]

    def data_state(self) -> dict:
        return self.stream.state()

    def load_data_state(self, state: dict) -> None:
        self.stream.load(state)

    def loss(self, net, batch, procs):
        loss = F.cross_entropy(net(batch[0]), batch[1])
        return loss, loss.item()

    def final_results(self, trainer) -> dict:
        """Accuracy on the validation and test splits at every evaluated size and on the canvas."""
        from ...data.digits import on_canvas, upsample

        s, data, model = self.config.settings, self.data, trainer.model
        losses = [m["train_loss"] for m in read_metrics(trainer.run_dir) if "train_loss" in m]
        result = {**self.identity(), "steps": trainer.step, "train_seconds": round(trainer.elapsed, 1),
                  "final_train_loss": losses[-1] if losses else None}
        for split in ("validation", "test"):
            for size in s["eval_sizes"]:
                result[f"{split}@{size}"] = accuracy(model, upsample(data.images[split], size), data.labels[split])
            result[f"{split}@canvas"] = accuracy(model, on_canvas(data.images[split], s["canvas_size"]),
                                                 data.labels[split])
        return {**result, "settings": s}
