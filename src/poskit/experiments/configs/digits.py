"""`poskit digits`: a ViT-style classifier on scikit-learn's 8x8 digits, trained at 8x8 and evaluated on larger
images (experiments/digits.py). Sized to train one (encoding, seed) run in well under a minute on one core."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# the encodings the demo compares (a ViT takes any encoding that can give patches 2-D positions:
# poskit.models.vit.vit_encodings())
VIT_ENCODINGS = ("none", "learned", "rope", "pope")


@dataclass(frozen=True)
class DigitsSettings:
    """The defaults of `poskit digits` (--encodings, --seeds and --epochs change them); every field but
    encodings and seeds is part of what a finished run depends on (its result.json records them)."""

    summary: ClassVar[str] = ("ViT on sklearn's 8x8 digits: learned vs axial rope vs axial pope, evaluated at "
                              "larger image sizes (needs the vision extra)")
    encodings: tuple = VIT_ENCODINGS  # none is the floor: a bag of patches
    seeds: tuple = (0, 1, 2)
    patch: int = 2  # 2 x 2 pixel patches: a 4 x 4 grid at 8 x 8, 8 x 8 at 16 x 16
    eval_sizes: tuple = (8, 12, 16)  # image sizes evaluated (8: training size; 16: twice each side)
    canvas_size: int = 16  # also: the 8x8 digit unchanged at the centre of a blank canvas this large
    dim: int = 64  # ViT width
    depth: int = 2  # blocks
    heads: int = 4  # 16 channels per head: 8 per axis for axial rope and pope
    epochs: int = 40  # passes over the 1078 training images
    batch_size: int = 64
    lr: float = 3e-3  # AdamW peak, cosine decay to lr / 10 after a 5 % warmup
    weight_decay: float = 0.05


DIGITS = DigitsSettings()
