"""`poskit.nn.Attention`: a self-attention layer (projections, grouped-query heads, masks, KV cache) whose
positional encoding is one keyword, so that trying another encoding in your model changes one argument.

    attn = poskit.nn.Attention(dim=256, num_heads=8, num_kv_heads=2, encoding="rope", base=10000)
    y = attn(x, is_causal=True)                                  # x (B, T, dim) -> (B, T, dim)
"""
from __future__ import annotations

import importlib

import torch
from torch import nn

from .encodings.base import PositionalEncoding, build_encoding, encoding_class
from .validate import check_int, check_real

# the attention package's module (poskit.attention itself is the function): cached_attention, KVCache
_engine = importlib.import_module("poskit.attention.engine")
_padding = importlib.import_module("poskit.attention.padding")


class Attention(nn.Module):
    """Multi-head self-attention with a poskit positional encoding.

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
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)
        self.encoding = _layer_encoding(encoding, head_dim, num_heads, encoding_options)
        # CoPE with separate gates computes its gate logits from their own key projection (W_g)
        self.g_proj = (nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
                       if self.encoding.needs_gate_keys else None)
        self.drop = nn.Dropout(dropout)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n*hd) -> (B, n, T, hd)
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, *, attn_mask=None, is_causal: bool = False, positions=None,
                attention_mask=None, cache=None, layer_idx: int = 0) -> torch.Tensor:
        """x (B, T, dim) -> (B, T, dim).

        attn_mask: as in `F.scaled_dot_product_attention` (bool True = attend, or float added to the logits),
            broadcastable to (B, num_heads, T, T); not with a cache.
        is_causal: causal by position (default False, as SDPA and nn.MultiheadAttention); a cache needs True.
        positions: (T,) or (B, T) ints; default arange(T), after the cache's last position when decoding, and
            counting only real tokens when attention_mask is given. An encoding built with axial_dims takes
            (T, n) or (B, T, n) coordinates instead (required; not causal, no cache).
        attention_mask: (B, T) 1/True = real token, 0 = padding (Hugging Face's convention): pads are hidden
            as keys and not counted in the positions; with a cache it is stored beside the keys.
        cache: a `poskit.attention.kv_cache.KVCache` to append to (decoding); layer_idx: this layer's index in
            it (one cache serves every layer of a model).
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"x must be a (B, T, dim) tensor, got {getattr(x, 'shape', type(x).__name__)}")
        B, T, _ = x.shape
        real = None if attention_mask is None else _padding.real_token_mask(attention_mask, B, T, x.device)
        q = self._heads(self.q_proj(x), self.num_heads)  # (B, H, T, hd)
        k = self._heads(self.k_proj(x), self.num_kv_heads)  # (B, Hkv, T, hd)
        v = self._heads(self.v_proj(x), self.num_kv_heads)  # (B, Hkv, T, hd)
        g = self._heads(self.g_proj(x), self.num_kv_heads) if self.g_proj is not None else None
        if cache is not None:
            if not is_causal:
                raise ValueError("decoding with a cache is causal: pass is_causal=True with cache")
            if attn_mask is not None:
                raise ValueError("attn_mask cannot be used with a cache (it is not stored); for padding pass "
                                 "attention_mask (B, T), 1 = real token, which the cache keeps per key")
            if positions is None:
                positions = decode_positions(cache, layer_idx, real, T, x.device)
            out = _engine.cached_attention(q, k, v, self.encoding, cache, layer_idx, positions,
                                           attention_mask=real, gate_keys=g)
        else:
            if positions is None and real is not None:
                positions = _padding.padded_positions(real)
            out = _engine.attention(q, k, v, self.encoding, attn_mask=_with_padding(attn_mask, real),
                                    is_causal=is_causal, enable_gqa=True, q_positions=positions,
                                    k_positions=positions, gate_keys=g)  # (B, H, T, hd)
        return self.drop(self.o_proj(out.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)))


def _layer_encoding(encoding, head_dim: int, num_heads: int, options: dict) -> PositionalEncoding:
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


def decode_positions(cache, layer_idx: int, real: torch.Tensor | None, length: int, device) -> torch.Tensor:
    """Positions of `length` new tokens continuing `cache` (layer `layer_idx`): per row after its last real
    cached token when the batch is padded (now, or in the cache), else after the last cached position."""
    layer = cache.layer(layer_idx)
    if real is None and layer.key_mask is None:
        start = int(layer.positions.max()) + 1 if layer.length else 0  # as KVCache.next_position, this layer
        return torch.arange(start, start + length, device=device)
    start = layer.next_positions() if layer.length else None
    if real is None:
        real = torch.ones(layer.keys.shape[0], length, dtype=torch.bool, device=device)
    return _padding.padded_positions(real, start)


def _with_padding(attn_mask, real):
    """attn_mask with the padded keys of `real` (B, T) hidden as well; either may be None."""
    if real is None:
        return attn_mask
    keep = real[:, None, None, :]
    if attn_mask is None:
        return keep
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return torch.where(keep, attn_mask, float("-inf"))
