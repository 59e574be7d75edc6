"""`poskit.nn.Attention`: an attention layer (projections, grouped-query heads, masks, KV cache) whose positional
encoding is one keyword, so that trying another encoding in your model changes one argument.

    attn = poskit.nn.Attention(dim=256, num_heads=8, num_kv_heads=2, encoding="rope", base=10000)
    y = attn(x, is_causal=True)                                  # self-attention: x (B, T, dim) -> (B, T, dim)
    y = attn(x, context=memory, context_mask=keep)               # cross-attention over memory (B, S, dim)

Every model of poskit builds its attention sub-layers from this class (models/block.py), the encoder-decoder's
cross-attention included.
"""
from __future__ import annotations

import torch
from torch import nn

from ..encodings.base import PositionalEncoding, build_encoding, encoding_class
from ..util.validate import check_int, check_real
from ..attention import engine as _engine
from .batch import positions_for, real_tokens


class Attention(nn.Module):
    """Multi-head attention with a poskit positional encoding.

    dim: model width; num_heads: query heads; num_kv_heads: key/value heads (grouped-query attention),
    default num_heads, must divide it; encoding: a name from `poskit.available_encodings()` (built with
    `encoding_options`, e.g. base=10000) or a built `PositionalEncoding`; head_dim: default dim // num_heads;
    dropout: on the output (after the output projection; attention weights are not dropped: no poskit path
    implements attention dropout); bias: biases in the four projections.

    Absolute encodings (sinusoidal, learned, legendre) are refused: they add vectors to the token embeddings,
    not to attention; build one with `poskit.build_encoding(name, head_dim=, num_heads=, dim=)`, add
    `enc.embed(positions)` to your embeddings and use encoding="none" here.
    CoPE with gates="separate" gets its own gate-key projection (`g_proj`).
    """

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int | None = None, encoding="pope", *,
                 head_dim: int | None = None, dropout: float = 0.0, bias: bool = False, **encoding_options):
        super().__init__()
        check_int(dim, "dim", minimum=1)
        check_int(num_heads, "num_heads", minimum=1)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_int(num_kv_heads, "num_kv_heads", minimum=1)
        if num_heads % num_kv_heads:
            allowed = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
            raise ValueError(f"num_kv_heads must divide num_heads={num_heads}: one of {allowed}, got {num_kv_heads}")
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}, or give head_dim")
            head_dim = dim // num_heads
        check_int(head_dim, "head_dim", minimum=1)
        check_real(dropout, "dropout", minimum=0)
        if not dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.dim = dim
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)
        self.encoding = _attention_encoding(encoding, head_dim, num_heads, encoding_options)
        # CoPE with separate gates computes its gate logits from their own key projection (W_g)
        self.g_proj = (nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
                       if self.encoding.needs_gate_keys else None)
        self.drop = nn.Dropout(dropout)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n*hd) -> (B, n, T, hd)
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)

    def check_input(self, x, name: str = "x") -> None:
        """ValueError naming `name` unless x is a (B, T, dim) tensor of this layer's width."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"{name} must be a (B, T, dim) tensor, got {getattr(x, 'shape', type(x).__name__)}")
        if x.shape[-1] != self.dim:
            raise ValueError(f"{name} has width {x.shape[-1]} but this attention layer takes dim={self.dim}: {name} "
                             f"must be (B, T, {self.dim}), got {tuple(x.shape)}")

    def project_kv(self, context: torch.Tensor) -> tuple:
        """The keys and values (and CoPE's gate keys, when the layer has them) of `context` (B, S, dim), each
        (B, num_kv_heads, S, head_dim): computed once, they serve every query of a cross-attention (e.g. every
        decoding step of an encoder-decoder)."""
        kv = (self._heads(self.k_proj(context), self.num_kv_heads),
              self._heads(self.v_proj(context), self.num_kv_heads))
        if self.g_proj is not None:
            kv += (self._heads(self.g_proj(context), self.num_kv_heads),)
        return kv

    def forward(self, x: torch.Tensor, *, attn_mask=None, is_causal: bool = False, positions=None,
                attention_mask=None, cache=None, layer_idx: int = 0, context=None, context_positions=None,
                context_mask=None) -> torch.Tensor:
        """x (B, T, dim) -> (B, T, dim).

        attn_mask: as in `F.scaled_dot_product_attention` (bool True = attend, or float added to the logits),
            broadcastable to (B, num_heads, T, Tk); not with a cache.
        is_causal: causal by position (default False, as SDPA and nn.MultiheadAttention); a cache needs True.
        positions: (T,) or (B, T) ints; default arange(T), after the cache's last position when decoding, and
            counting only real tokens when attention_mask is given. An encoding built with axial_dims takes
            (T, n) or (B, T, n) coordinates instead (required; not causal, no cache).
        attention_mask: (B, T) 1/True = real token, 0 = padding (Hugging Face's convention): pads are hidden
            as keys and not counted in the positions; with a cache it is stored beside the keys.
        cache: a `poskit.KVCache` to append to (decoding); layer_idx: this layer's index in
            it (one cache serves every layer of a model).
        context: (B, S, dim) cross-attention: keys and values come from `context` instead of x (no cache).
            context_positions: the keys' positions (as `positions`; default arange(S), counting only real
            tokens when context_mask is given); context_mask: (B, S) 1/True = real context token. The encoding
            sees x's positions for queries and context_positions for keys (as if both started on one axis);
            give encoding="none" for a cross-attention without positions.
        """
        self.check_input(x)
        B, T, _ = x.shape
        if context is not None:
            self.check_input(context, "context")
            if context.shape[0] != B:
                raise ValueError(f"context must have x's batch size {B}, got {tuple(context.shape)}")
            if cache is not None:
                raise ValueError("cache is for self-attention: a cross-attention's keys (context) do not grow; "
                                 "project them once with project_kv and pass cache=None")
            S = context.shape[1]
            kv_real = real_tokens(context_mask, B, S, x.device, name="context_mask")
            if context_positions is None:
                context_positions = positions_for(S, x.device, real=kv_real, arange=False)
            return self.attend(x, positions, None, causal=is_causal, attn_mask=attn_mask, kv=self.project_kv(context),
                               kv_positions=context_positions, kv_real=kv_real)
        if context_positions is not None or context_mask is not None:
            raise ValueError("context_positions and context_mask describe a context: pass context too")
        real = real_tokens(attention_mask, B, T, x.device)
        if cache is not None:
            if not is_causal:
                raise ValueError("decoding with a cache is causal: pass is_causal=True with cache")
            if attn_mask is not None:
                raise ValueError("attn_mask cannot be used with a cache (it is not stored); for padding pass "
                                 "attention_mask (B, T), 1 = real token, which the cache keeps per key")
        if positions is None:
            positions = positions_for(T, x.device, real=real, cache=cache, layer_idx=layer_idx, arange=False)
        return self.attend(x, positions, real, causal=is_causal, attn_mask=attn_mask, cache=cache,
                           layer_idx=layer_idx)

    def attend(self, x: torch.Tensor, positions, real, *, causal: bool, attn_mask=None, cache=None,
               layer_idx: int = 0, kv: tuple | None = None, kv_positions=None, kv_real=None,
               backend: str = "auto") -> torch.Tensor:
        """The layer on inputs a model has already checked (its `ModelBatch`): x (B, T, dim), positions as
        the engine takes them (None: its default), real (B, T) bool or None. With `kv` (from `project_kv`)
        it is a cross-attention over those keys, at kv_positions, hiding the keys where kv_real is False."""
        B, T, _ = x.shape
        q = self._heads(self.q_proj(x), self.num_heads)  # (B, H, T, hd)
        if kv is None:
            k = self._heads(self.k_proj(x), self.num_kv_heads)  # (B, Hkv, T, hd)
            v = self._heads(self.v_proj(x), self.num_kv_heads)  # (B, Hkv, T, hd)
            g = self._heads(self.g_proj(x), self.num_kv_heads) if self.g_proj is not None else None
            kv_positions, kv_real = positions, real
        else:
            k, v, g = kv if len(kv) == 3 else (*kv, None)
        if cache is not None:
            out = _engine.cached_attention(q, k, v, self.encoding, cache, layer_idx, positions,
                                           attention_mask=real, gate_keys=g, backend=backend)
        else:
            out = _engine.attention_with_key_mask(q, k, v, self.encoding, key_mask=kv_real, attn_mask=attn_mask,
                                                  is_causal=causal, enable_gqa=True, q_positions=positions,
                                                  k_positions=kv_positions, gate_keys=g,
                                                  backend=backend)  # (B, H, T, hd)
        return self.drop(self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)))


def _attention_encoding(encoding, head_dim: int, num_heads: int, options: dict) -> PositionalEncoding:
    if isinstance(encoding, PositionalEncoding):
        if options:
            raise ValueError(f"encoding options {sorted(options)} apply only to an encoding given by name, not to a "
                             "built PositionalEncoding")
        if (encoding.head_dim, encoding.num_heads) != (head_dim, num_heads):
            raise ValueError(f"encoding must be built with head_dim={head_dim} and num_heads={num_heads}, got "
                             f"{encoding.head_dim} and {encoding.num_heads}")
        enc = encoding
    elif isinstance(encoding, str):
        # refused before building: an absolute encoding would first ask for `dim`, the wrong advice here
        kind = encoding_class(encoding).kind
        enc = None if kind == "absolute" else build_encoding(encoding, head_dim=head_dim, num_heads=num_heads,
                                                             **options)
    else:
        raise ValueError(f"encoding must be a name from poskit.available_encodings() or a PositionalEncoding, got "
                         f"{type(encoding).__name__}")
    if enc is None or enc.kind == "absolute":
        name = encoding if enc is None else enc.name or type(enc).__name__
        raise ValueError(f"the absolute encoding {name!r} adds vectors to the token "
                         "embeddings, not to attention: build it with poskit.build_encoding(name, head_dim=, "
                         "num_heads=, dim=), add enc.embed(positions) to your embeddings and use encoding='none' here")
    return enc

