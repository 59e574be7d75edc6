"""poskit: positional encodings for transformers, exact and fast.

    enc = poskit.build_encoding("pope", head_dim=64, num_heads=8)
    out = poskit.attention(q, k, v, enc)              # (B, H, Tq, Dv)
    logits = poskit.attention_scores(q, k, enc)       # reference logits (B, H, Tq, Tk)
"""
from . import attention as _attention_package
from .attention import PackageFunction, attention_scores
from .encodings import PositionalEncoding, available_encodings, build_encoding
from . import nn  # poskit.nn.Attention: a self-attention layer with the encoding as one keyword

# poskit.attention(q, k, v, enc, ...) is the engine's function, and poskit.attention.<name> is still the
# package's <name> (KVCache, cached_attention, kv_cache, ...); Dynamo traces the call (attention/__init__.py)
attention = PackageFunction(_attention_package.attention, _attention_package)

__version__ = "0.1.0"
__all__ = ["PositionalEncoding", "attention", "attention_scores", "available_encodings", "build_encoding", "nn"]
