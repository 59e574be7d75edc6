"""scikit-learn's 8x8 handwritten digits (1797 images, shipped inside the package: no download), split
deterministically, and their upsampled copies for evaluation at a larger image size.

Needs the optional extra `vision` (scikit-learn).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..util.validate import check_int

SPLITS = ("train", "validation", "test")
FRACTIONS = (0.6, 0.2, 0.2)  # per class, so every split has every digit in the same proportion
SPLIT_SEED = 1234  # the split is fixed: changing the training seed must not change which images are held out


@dataclass(frozen=True)
class Digits:
    images: dict  # split -> (N, 1, 8, 8) float32 in [0, 1]
    labels: dict  # split -> (N,) int64


def load_digits_splits() -> Digits:
    """The digits split 60/20/20 per class with a fixed permutation (SPLIT_SEED); pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the digits demo needs scikit-learn: pip install -c constraints.txt "
                                  "'poskit[vision]'") from None
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixel values are 0..16
    y = torch.tensor(data.target, dtype=torch.long)
    g = torch.Generator().manual_seed(SPLIT_SEED)
    parts = {s: [] for s in SPLITS}
    for c in range(10):
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_train, n_val = round(FRACTIONS[0] * len(idx)), round(FRACTIONS[1] * len(idx))
        parts["train"].append(idx[:n_train])
        parts["validation"].append(idx[n_train:n_train + n_val])
        parts["test"].append(idx[n_train + n_val:])
    index = {s: torch.cat(p).sort().values for s, p in parts.items()}
    return Digits({s: x[i] for s, i in index.items()}, {s: y[i] for s, i in index.items()})


def upsample(images: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 1, h, w) -> (N, 1, size, size), bilinear (a larger image of the same digit: with the patch size
    fixed it has more patches, so the model meets positions it never saw in training)."""
    check_int(size, "size", minimum=1)
    if images.shape[-1] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


def on_canvas(images: torch.Tensor, size: int) -> torch.Tensor:
    """(N, 1, h, w) -> (N, 1, size, size): each image unchanged at the centre of a blank canvas (a larger image
    whose patches hold the same content as in training: only the positions are new)."""
    check_int(size, "size", minimum=images.shape[-1])
    top = (size - images.shape[-2]) // 2
    left = (size - images.shape[-1]) // 2
    out = images.new_zeros(images.shape[0], images.shape[1], size, size)
    out[:, :, top:top + images.shape[-2], left:left + images.shape[-1]] = images
    return out
