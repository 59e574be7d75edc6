"""`poskit.nn.Attention`: an attention layer whose positional encoding is one keyword (the layer lives in
poskit/models/attention.py; this is its documented public name).

    attn = poskit.nn.Attention(dim=256, num_heads=8, num_kv_heads=2, encoding="rope", base=10000)
    y = attn(x, is_causal=True)                                  # x (B, T, dim) -> (B, T, dim)
"""
from .models.attention import Attention

__all__ = ["Attention"]
