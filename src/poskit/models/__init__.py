"""poskit's models, all built from one block skeleton (`block.Block`) and the attention layer behind
`poskit.nn.Attention` (`attention.Attention`):

- `Transformer` / `ModelConfig` (decoder.py): decoder-only, or a bidirectional BERT-style encoder;
- `EncoderDecoder` / `EncoderDecoderConfig` (encoder_decoder.py): Vaswani et al.'s layout, with greedy and
  beam search (beam.py);
- `ViT` (vit.py): a small image classifier with (row, column) patch positions.

Every model's entry point builds one `ModelBatch` (batch.py: inputs, positions, which tokens are real) that
its layers use unchanged.
"""
from .attention import Attention
from .batch import ModelBatch
from .decoder import ModelConfig, Transformer
from .encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from .vit import ViT

__all__ = ["Attention", "EncoderDecoder", "EncoderDecoderConfig", "ModelBatch", "ModelConfig", "Transformer", "ViT"]
