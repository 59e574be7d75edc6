"""A small ViT-style image classifier whose positional encoding is one argument.

Images are cut into non-overlapping p x p patches (a linear patch embedding), the patch tokens go through
pre-norm transformer blocks with bidirectional attention, are mean-pooled (no class token: it would need a
position of its own) and classified. Patch (i, j) of an image has the axial position (row i, column j).

Where the encoding enters follows what it declares (never its name):

- kind "none": no position at all (a bag of patches), the floor;
- kind "absolute" with trainable parameters ("learned"): a learned (grid, grid, dim) table added to the patch
  embeddings (ViT's absolute embedding). A larger image has a larger grid; the table is then resized
  bilinearly, as ViT does when fine-tuning at a higher resolution;
- kind "absolute" without parameters (sinusoidal, legendre): the encoding's vectors of the row and of the
  column, half of the channels each, added to the patch embeddings;
- any encoding that takes axial positions (built with `axial_dims`, it declares `position_coords` 2: rope,
  pope): inside attention, half of each head's channels per axis, fed the (row, column) positions; it takes any
  grid without change.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..encodings.base import available_encodings, build_encoding, encoding_class
from ..encodings.spec import EncodingSpec
from ..util.validate import check_int
from .block import MLP, Block, SelfAttention, run_block


def patch_positions(grid: int, device=None) -> torch.Tensor:
    """(grid * grid, 2) int64 (row, column) of the patches in raster order."""
    r = torch.arange(grid, device=device)
    return torch.stack(torch.meshgrid(r, r, indexing="ij"), -1).reshape(-1, 2)


def _axial_options(head_dim: int) -> dict:
    return {"axial_dims": [head_dim // 2, head_dim // 2]}


def placement(encoding, head_dim: int = 8) -> str | None:
    """Where `encoding` (a name, spec text or an EncodingSpec) enters the ViT: "none", "table" (a learned 2-D
    table), "embed" (fixed vectors per axis), "attention" (axial positions inside attention), or None when it
    cannot give patches 2-D positions."""
    spec = EncodingSpec.of(encoding)
    cls = encoding_class(spec.name)
    if cls.kind == "none":
        return "none"
    with torch.device("meta"):  # probing builds on the meta device: no memory, no draw from the random generator
        if cls.kind == "absolute":
            probe = spec.build(head_dim=head_dim, num_heads=1, dim=2 * head_dim)
            return "table" if any(True for _ in probe.parameters()) else "embed"
        try:
            probe = build_encoding(spec.name, head_dim=head_dim, num_heads=1, **spec.options,
                                   **_axial_options(head_dim))
        except (TypeError, ValueError):  # the encoding takes no axial_dims, or not without other options
            return None
    return "attention" if probe.position_coords == 2 else None


def vit_encodings() -> list[str]:
    """The registered encodings a ViT takes (see the module docstring)."""
    return [name for name in available_encodings() if placement(name) is not None]


def _vit_spec(encoding) -> tuple[EncodingSpec, str]:
    """(the spec of `encoding`, where it enters the ViT), or a one-line ValueError naming `encoding`."""
    spec = None
    if isinstance(encoding, EncodingSpec):
        spec = encoding
    elif isinstance(encoding, str) and encoding.split(":")[0].strip() in available_encodings():
        spec = EncodingSpec.parse(encoding)  # a bad option: SpecError naming it
    if spec is not None and "axial_dims" in spec.options:
        raise ValueError(f"encoding option {spec.name}:axial_dims is the ViT's to set (half of each head's channels "
                         f"per axis), got {spec.options['axial_dims']!r} (in {spec.label!r})")
    where = placement(spec) if spec is not None else None
    if where is None:
        raise ValueError(f"encoding must be one of {vit_encodings()} (encodings that give patches 2-D positions: "
                         f"none, absolute ones at the embeddings, those that take axial_dims), or a spec of one, got "
                         f"{encoding if isinstance(encoding, str) else str(encoding)!r}")
    return spec, where


class ViT(nn.Module):
    """Square single-channel images (B, 1, S, S) -> class logits (B, classes); S a multiple of `patch`.
    encoding: a name, spec text ("rope:base=100") or an EncodingSpec. `train_size`: the image size the learned
    table is made for (its grid is train_size // patch)."""

    def __init__(self, *, encoding, classes: int = 10, patch: int = 2, train_size: int = 8, dim: int = 64,
                 depth: int = 2, heads: int = 4):
        super().__init__()
        spec, where = _vit_spec(encoding)
        for name, value in (("classes", classes), ("patch", patch), ("train_size", train_size), ("dim", dim),
                            ("depth", depth), ("heads", heads)):
            check_int(value, name, minimum=1)
        if train_size % patch:
            raise ValueError(f"train_size must be a multiple of patch={patch}, got {train_size}")
        if dim % heads or (dim // heads) % 4:
            raise ValueError(f"dim must be a multiple of 4 * heads={4 * heads} (axial rope rotates channel pairs "
                             f"on each of two axes), got {dim}")
        self.encoding, self.patch, self.grid = str(spec), patch, train_size // patch
        head_dim = dim // heads
        self.embed = nn.Linear(patch * patch, dim)
        self.table = nn.Parameter(torch.randn(self.grid, self.grid, dim) * 0.02) if where == "table" else None
        self.axis_encoding = (spec.build(head_dim=head_dim, num_heads=heads, dim=dim // 2)
                              if where == "embed" else None)
        layer_encoding, options = ((spec.name, {**spec.options, **_axial_options(head_dim)}) if where == "attention"
                                   else ("none", {}))
        self.blocks = nn.ModuleList(
            Block(norm1=nn.LayerNorm(dim), norm2=nn.LayerNorm(dim),
                  attn=SelfAttention(dim, heads, encoding=layer_encoding, causal=False, **options),
                  mlp=MLP(dim, 4 * dim, "gelu", bias=True), order=("norm1", "norm2", "attn", "mlp"))
            for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.gradient_checkpointing = False  # True: blocks recompute their activations in backward (block.run_block)
        self.register_load_state_dict_pre_hook(_rename_old_keys)

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
        axial = self.blocks[0].attn.encoding.position_coords > 0
        positions = patch_positions(grid, images.device) if axial or self.axis_encoding is not None else None
        if self.axis_encoding is not None:
            x = x + torch.cat([self.axis_encoding.embed(positions[:, 0]), self.axis_encoding.embed(positions[:, 1])],
                              -1).to(x.dtype)
            positions = None
        for block in self.blocks:
            x = run_block(self, block, x, positions)
        return self.head(self.norm(x).mean(1))


def _rename_old_keys(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: the MLP was an nn.Sequential (mlp.0, mlp.2) before the blocks were shared."""
    for key in list(state_dict):
        if key.startswith(f"{prefix}blocks."):
            for old, new in ((".mlp.0.", ".mlp.w1."), (".mlp.2.", ".mlp.w2.")):
                if old in key:
                    state_dict[key.replace(old, new)] = state_dict.pop(key)
                    break
