"""Interleaved RoPE and NoPE layers (Llama 4's iRoPE): RoPE in most attention layers, no position at all in every
k-th one, named as one encoding so that a comparison row, a run directory or an HF config can say it in one spec
("irope:nope_every=4").

Inside one attention layer it is RoPE. The layers are a model's business: the class declares the pattern
(`layer_pattern`) that the decoder expands into its per-layer encodings (models/decoder.py `layer_schedule`),
the same expansion an explicit `ModelConfig.layer_encodings` goes through, so that both spell one schedule.
"""
from __future__ import annotations

from ..util.validate import check_int
from .base import register
from .rotary import RotaryEncoding

#: the entry of a layer pattern that stands for the model's own encoding (models/decoder.py MODEL_ENCODING)
_OWN = "*"


@register("irope")
class InterleavedRoPE(RotaryEncoding):
    """RoPE in three of every four layers and no positional encoding in the fourth (nope_every=4): the layers
    whose 1-based index is a multiple of `nope_every` attend without position, the others with RoPE.

    In a model (poskit.models.Transformer, the HF bridge) layer i (0-based) has no position when
    (i + 1) % nope_every == 0, as HF's Llama 4 config derives `no_rope_layers` from `no_rope_layer_interval`; its
    other layers are this encoding, which is RoPE with the options below. A model with fewer than `nope_every`
    layers has no layer without position, as HF counts (it is then RoPE throughout). Built alone (as
    `poskit.attention`'s encoding) it is one RoPE layer. The general form, any encoding on any layer, is
    `ModelConfig.layer_encodings`; this is its iRoPE pattern ["*"] * (nope_every - 1) + ["none"].

    Paper: Meta AI, "The Llama 4 herd" (2025: iRoPE, interleaved attention layers without positional
    embeddings), after Yang, Wang, Zhu, Zhou, Wei, Lou, Fu, Zhang, Wang, Ge, Fei, Luo, Sun, "Rope to Nope and Back
    Again: A New Hybrid Attention Strategy" (arXiv 2501.18795: RoPE layers interleaved with NoPE layers).

    Options (defaults):
        nope_every=4: every nope_every-th layer has no position (an int >= 2; Llama 4's no_rope_layer_interval).
        base=10000.0: the RoPE frequency base of the other layers.
        layout='interleaved': RoPE's channel pairs, 'interleaved' (x_2i, x_2i+1) or 'half' (x_i, x_i+d/2).
        rotary_dim=None: channels rotated per head (even); None is head_dim.
    """

    def __init__(self, *, head_dim: int, num_heads: int, nope_every: int = 4, base: float = 10000.0,
                 layout: str = "interleaved", rotary_dim: int | None = None):
        super().__init__(head_dim=head_dim, num_heads=num_heads, base=base, layout=layout, rotary_dim=rotary_dim)
        self.nope_every = check_int(nope_every, "nope_every", minimum=2)

    @classmethod
    def layer_pattern(cls, options: dict) -> list[str]:
        """The per-layer pattern a model repeats over its layers: this encoding, and "none" on every
        nope_every-th layer."""
        every = check_int(options.get("nope_every", 4), "nope_every", minimum=2)
        return [_OWN] * (every - 1) + ["none"]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", nope_every={self.nope_every}"
