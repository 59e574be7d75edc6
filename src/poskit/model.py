"""A temporary shim: the models moved to the `poskit.models` package (decoder, encoder-decoder, ViT). This module
only re-exports their public names for code that still imports `poskit.model`; import from `poskit.models`."""
from .models.block import MLP, Block, RMSNorm  # noqa: F401
from .models.decoder import ATTENTION_KINDS, MLP_KINDS, ModelConfig, Transformer, decoder_mlp  # noqa: F401
from .models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig  # noqa: F401
