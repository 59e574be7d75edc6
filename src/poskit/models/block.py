"""The one transformer block every poskit model is built from, and the loop that runs a stack of them.

A `Block` is an attention sub-layer, optionally a cross-attention sub-layer, and an MLP sub-layer, each with its
norm and residual sum: pre-norm (x + f(norm(x)), the decoder and the ViT) or post-norm (norm(x + f(x)), the
encoder-decoder of Vaswani et al. by default). The attention sub-layers are `poskit.nn.Attention` layers
(`SelfAttention` for the block's own sequence; the cross-attention a plain `Attention` over projected keys).

`run_block` runs one block, under activation checkpointing when the model asks for it (`gradient_checkpointing`,
the attribute Hugging Face's `gradient_checkpointing_enable` sets): the block's activations are then recomputed
in the backward pass instead of stored, which gives the same gradients with less memory.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..attention import engine as _engine
from .attention import Attention

MLP_ACTIVATIONS = ("gelu", "swiglu", "relu")

# the order in which a block registers its parts (the order of its parameters: initialisation, optimizer states
# and state dicts of runs written before all follow it); each model passes its own
PRE_NORM_ORDER = ("norm1", "attn", "norm_cross", "cross_attn", "norm2", "mlp")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 so bf16 autocast does not lose the mean square
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class MLP(nn.Module):
    """dim -> hidden -> dim: Linear-activation-Linear ("gelu", "relu"), or SwiGLU ("swiglu": SiLU(x W1) * (x W3),
    then W2; w3 is built first, as checkpoints and initialisation expect)."""

    def __init__(self, dim: int, hidden: int, kind: str = "gelu", bias: bool = False):
        super().__init__()
        if kind not in MLP_ACTIVATIONS:
            raise ValueError(f"kind must be one of {list(MLP_ACTIVATIONS)}, got {kind!r}")
        self.kind = kind
        if kind == "swiglu":
            self.w3 = nn.Linear(dim, hidden, bias=bias)
        self.w1 = nn.Linear(dim, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, dim) -> (B, T, dim)
        if self.kind == "swiglu":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        if self.kind == "relu":
            return self.w2(F.relu(self.w1(x)))
        return self.w2(F.gelu(self.w1(x)))


class SelfAttention(Attention):
    """`poskit.nn.Attention` as a block's attention over its own sequence: causal or bidirectional, at a fixed
    index of the KV cache, called with the positions and real-token mask of the model's `ModelBatch`.
    linear=True: causal linear attention (RoFormer eq. 19, attention/linear.py) instead of softmax."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int | None = None, encoding="none", *,
                 causal: bool, layer_idx: int = 0, linear: bool = False, **kwargs):
        super().__init__(dim, num_heads, num_kv_heads, encoding, **kwargs)
        self.causal, self.layer_idx, self.linear = causal, layer_idx, linear
        # the names the decoder's attention layers had before they were poskit.nn.Attention
        self.n_heads, self.n_kv, self.hd = self.num_heads, self.num_kv_heads, self.head_dim

    def forward(self, x: torch.Tensor, positions, cache=None, real=None, backend: str = "auto",
                offsets=None) -> torch.Tensor:
        # x: (B, T, dim); positions: (1|B, T) (or None: the engine's default); real: (B, T) bool or None;
        # offsets: (1|B, T, n) per-token coordinate offsets from the positions (M-RoPE's vision tokens) or None
        if self.linear:
            return self._linear(x, positions, cache, real)
        if offsets is not None and self.encoding.coordinate_axes:
            return self._attend_offsets(x, positions, offsets, cache, real, backend)
        return self.attend(x, positions, real, causal=self.causal, cache=cache, layer_idx=self.layer_idx,
                           backend=backend)

    def _attend_offsets(self, x, positions, offsets, cache, real, backend):
        """attend() with q and k first rotated by their tokens' coordinate offsets (`encode`), for an encoding that
        takes coordinates (M-RoPE): the engine then applies it at the scalar positions, so that attention stays
        causal by position and the KV cache holds keys rotated to their whole coordinates (encodings/mrope.py)."""
        B, T, _ = x.shape
        q = self.encoding.encode(self._heads(self.q_proj(x), self.num_heads), offsets)
        k = self.encoding.encode(self._heads(self.k_proj(x), self.num_kv_heads), offsets)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        if cache is not None:
            out = _engine.cached_attention(q, k, v, self.encoding, cache, self.layer_idx, positions,
                                           attention_mask=real, backend=backend)
        else:
            out = _engine.attention(q, k, v, self.encoding, attn_mask=None if real is None else real[:, None, None, :],
                                    is_causal=self.causal, enable_gqa=True, q_positions=positions,
                                    k_positions=positions, backend=backend)
        return self.drop(self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)))

    def _linear(self, x, positions, cache, real):
        from ..attention.linear import linear_attention

        if cache is not None:  # the recurrent state (attention/linear.py) is not a KV cache
            raise ValueError("cache is not supported with attention='linear' (decode with "
                             "linear_attention_step from poskit.attention, or generate with use_cache=False)")
        if real is not None and not bool(real.all()):  # the prefix (or total) sums would include the pads
            raise ValueError("attention_mask with padding is not supported with attention='linear'")
        B, T, _ = x.shape
        q = self._heads(self.q_proj(x), self.num_heads)
        k = self._heads(self.k_proj(x), self.num_kv_heads)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        out = linear_attention(q, k, v, self.encoding, is_causal=self.causal, q_positions=positions, k_positions=positions)
        return self.drop(self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)))


class Context:
    """What a block's cross-attention reads: the keys and values projected once from the other sequence
    (`Attention.project_kv`), their positions and which of them are real."""

    def __init__(self, kv: tuple, positions, real):
        self.kv, self.positions, self.real = kv, positions, real


class Block(nn.Module):
    """norm, attention, residual; [norm, cross-attention, residual;] norm, MLP, residual.

    pre_norm True: x + drop(f(norm(x))) per sub-layer; False: norm(x + drop(f(x))). `order` names the parts
    in the order they are registered (see PRE_NORM_ORDER); the parts are built by the caller, in that order."""

    def __init__(self, *, attn: SelfAttention, mlp: nn.Module, norm1: nn.Module, norm2: nn.Module,
                 cross_attn: Attention | None = None, norm_cross: nn.Module | None = None, pre_norm: bool = True,
                 dropout: float = 0.0, order: tuple = PRE_NORM_ORDER):
        super().__init__()
        parts = dict(norm1=norm1, attn=attn, norm_cross=norm_cross, cross_attn=cross_attn, norm2=norm2, mlp=mlp)
        if (cross_attn is None) != (norm_cross is None):
            raise ValueError("cross_attn and norm_cross go together: give both or neither")
        given = {name for name, part in parts.items() if part is not None}
        if not given <= set(order) <= set(parts):
            raise ValueError(f"order must name every part given ({sorted(given)}) and only parts of {sorted(parts)}, "
                             f"got {order}")
        for name in order:
            setattr(self, name, parts[name])
        for name in set(parts) - set(order):
            setattr(self, name, None)
        self.pre_norm = pre_norm
        self.drop = nn.Dropout(dropout)

    def _residual(self, x, norm, branch):
        if self.pre_norm:
            return x + self.drop(branch(norm(x)))
        return norm(x + self.drop(branch(x)))

    def forward(self, x: torch.Tensor, positions, cache=None, real=None, context: Context | None = None,
                backend: str = "auto", offsets=None) -> torch.Tensor:  # (B, T, dim) -> (B, T, dim)
        # offsets: per-token coordinate offsets for an attention whose encoding takes coordinates (SelfAttention)
        extra = {} if offsets is None else {"offsets": offsets}
        x = self._residual(x, self.norm1, lambda h: self.attn(h, positions, cache, real, backend=backend, **extra))
        if self.cross_attn is not None:
            x = self._residual(x, self.norm_cross, lambda h: self.cross_attn.attend(
                h, positions, None, causal=False, kv=context.kv, kv_positions=context.positions, kv_real=context.real,
                backend=backend))
        return self._residual(x, self.norm2, self.mlp)


_checkpoint = functools.partial(checkpoint, use_reentrant=False)


def run_block(model: nn.Module, block: Block, x: torch.Tensor, *args, cache=None, **kwargs) -> torch.Tensor:
    """block(x, *args, cache=cache, **kwargs), with activation checkpointing when `model.gradient_checkpointing`
    is set and gradients are being recorded in training (never with a cache: recomputing would append twice).
    Hugging Face's gradient_checkpointing_enable sets `_gradient_checkpointing_func` (its checkpoint keywords)."""
    if cache is None and getattr(model, "gradient_checkpointing", False) and model.training \
            and torch.is_grad_enabled():
        run = getattr(model, "_gradient_checkpointing_func", None) or _checkpoint
        return run(block, x, *args, **kwargs)
    if cache is not None:
        kwargs["cache"] = cache
    return block(x, *args, **kwargs)
