"""poskit: positional encodings for transformers, exact and fast.

    enc = poskit.build_encoding("pope", head_dim=64, num_heads=8)
    out = poskit.attention(q, k, v, enc)              # (B, H, Tq, Dv)
    logits = poskit.attention_scores(q, k, enc)       # reference logits (B, H, Tq, Tk)
"""
from .attention import KVCache, attention_scores
from .attention.engine import attention  # the function; the package stays importable as poskit.attention.<module>
from .encodings import EncodingSpec, PositionalEncoding, available_encodings, build_encoding
from . import nn  # poskit.nn.Attention: a self-attention layer with the encoding as one keyword

from .util.version import __version__
__all__ = ["EncodingSpec", "KVCache", "PositionalEncoding", "attention", "attention_scores", "available_encodings", "build_encoding",
           "nn"]
