"""A small ViT-style image classifier whose positional encoding is one argument.

Images are cut into non-overlapping p x p patches (a linear patch embedding), the patch tokens go through
pre-norm transformer blocks with bidirectional attention, are mean-pooled (no class token: it would need a
position of its own) and classified. Patch (i, j) of an image has the axial position (row i, column j):

- "learned": a learned (grid, grid, dim) table added to the patch embeddings (ViT's absolute embedding). A
  larger image has a larger grid; the table is then resized bilinearly, as ViT does when fine-tuning at a
  higher resolution (without it, the new rows and columns would have no embedding at all).
- "rope" / "pope": axial encodings inside attention (`axial_dims`: half of each head's channels per axis),
  fed the (row, column) positions; they take any grid without change.
- "none": no position at all (a bag of patches), the floor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import Attention
from ..validate import check_int

VIT_ENCODINGS = ("none", "learned", "rope", "pope")


def patch_positions(grid: int, device=None) -> torch.Tensor:
    """(grid * grid, 2) int64 (row, column) of the patches in raster order."""
    r = torch.arange(grid, device=device)
    return torch.stack(torch.meshgrid(r, r, indexing="ij"), -1).reshape(-1, 2)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, encoding: str, head_dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        options = {"axial_dims": [head_dim // 2, head_dim // 2]} if encoding in ("rope", "pope") else {}
        self.attn = Attention(dim, heads, encoding="none" if encoding in ("none", "learned") else encoding,
                              **options)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, positions):
        x = x + self.attn(self.norm1(x), positions=positions)
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Square single-channel images (B, 1, S, S) -> class logits (B, classes); S a multiple of `patch`.
    `train_size`: the image size the learned table is made for (its grid is train_size // patch)."""

    def __init__(self, *, encoding: str, classes: int = 10, patch: int = 2, train_size: int = 8, dim: int = 64,
                 depth: int = 2, heads: int = 4):
        super().__init__()
        if encoding not in VIT_ENCODINGS:
            raise ValueError(f"encoding must be one of {list(VIT_ENCODINGS)}, got {encoding!r}")
        for name, value in (("classes", classes), ("patch", patch), ("train_size", train_size), ("dim", dim),
                            ("depth", depth), ("heads", heads)):
            check_int(value, name, minimum=1)
        if train_size % patch:
            raise ValueError(f"train_size must be a multiple of patch={patch}, got {train_size}")
        if dim % heads or (dim // heads) % 4:
            raise ValueError(f"dim must be a multiple of 4 * heads={4 * heads} (axial rope rotates channel pairs "
                             f"on each of two axes), got {dim}")
        self.encoding, self.patch, self.grid = encoding, patch, train_size // patch
        self.embed = nn.Linear(patch * patch, dim)
        self.table = nn.Parameter(torch.randn(self.grid, self.grid, dim) * 0.02) if encoding == "learned" else None
        self.blocks = nn.ModuleList(Block(dim, heads, encoding, dim // heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def position_table(self, grid: int) -> torch.Tensor:
        """(grid * grid, dim): the learned table, resized bilinearly when the grid differs from training's."""
        table = self.table
        if grid != self.grid:
            table = F.interpolate(table.permute(2, 0, 1)[None], size=(grid, grid), mode="bilinear",
                                  align_corners=False)[0].permute(1, 2, 0)
        return table.reshape(grid * grid, -1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != 1 \
                or images.shape[2] != images.shape[3] or images.shape[2] % self.patch:
            raise ValueError(f"images must be (B, 1, S, S) with S a multiple of patch={self.patch}, got "
                             f"{tuple(getattr(images, 'shape', ()))}")
        B, p = images.shape[0], self.patch
        grid = images.shape[2] // p
        patches = images.unfold(2, p, p).unfold(3, p, p).reshape(B, grid * grid, p * p)  # raster order
        x = self.embed(patches)
        if self.table is not None:
            x = x + self.position_table(grid)
        positions = patch_positions(grid, images.device) if self.encoding in ("rope", "pope") else None
        for block in self.blocks:
            x = block(x, positions)
        return self.head(self.norm(x).mean(1))
