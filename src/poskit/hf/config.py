"""`PoskitConfig`: a poskit `ModelConfig` under Hugging Face's usual field names, as a `PretrainedConfig`.

Every `ModelConfig` field has one config field here (`MODEL_FIELDS` says which); `to_model_config()` builds
the `ModelConfig`, and every error it raises names the Hugging Face field. The MLP is described as Hugging
Face describes it: `hidden_act` "gelu" is poskit's Linear-GELU-Linear MLP and "silu" its gated SwiGLU MLP
(as in Llama), and `intermediate_size` is the hidden width of one branch; poskit's `mlp_ratio` is derived
from it so that the built MLP has exactly that width.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from transformers import GenerationConfig, PretrainedConfig

import poskit
from poskit.config_check import ConfigError
from poskit.encodings import DEFAULT_ENCODING
from poskit.models.decoder import ModelConfig, decoder_mlp

_DEFAULT = ModelConfig()

#: Hugging Face field -> ModelConfig field (intermediate_size -> mlp_ratio and hidden_act -> mlp are converted)
MODEL_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "hidden_act": "mlp",
    "intermediate_size": "mlp_ratio",
    "position_encoding": "encoding",
    "position_encoding_options": "encoding_options",
    "hidden_dropout": "dropout",
    "tie_word_embeddings": "tie_embeddings",
    "bias": "bias",
    "rms_norm_eps": "norm_eps",
    "initializer_range": "init_std",
    "is_causal": "causal",
    "attention_type": "attention",
}
_HF_NAME = {poskit_name: hf_name for hf_name, poskit_name in MODEL_FIELDS.items()}

#: hidden_act -> ModelConfig.mlp
ACTIVATIONS = {"gelu": "gelu", "silu": "swiglu"}
_ACTIVATION_OF_MLP = {mlp: act for act, mlp in ACTIVATIONS.items()}

# keyword arguments that transformers itself passes to a config (from config.json files it wrote, from
# from_pretrained's keywords) and handles in PretrainedConfig.__post_init__; any other unknown keyword is refused
_TRANSFORMERS_KEYWORDS = frozenset({
    "model_type", "torch_dtype", "num_labels", "name_or_path", "_name_or_path", "_commit_hash", "output_attentions",
    "attn_implementation", "experts_implementation", "per_layer_config", "_attn_implementation_internal",
    "_experts_implementation_internal", "auto_map", "tie_encoder_decoder",
}) | frozenset(GenerationConfig._get_default_generation_params())


class PoskitConfig(PretrainedConfig):
    """A poskit decoder (`poskit.models.Transformer`) described with Hugging Face's field names.

    position_encoding: any name of `poskit.available_encodings()`; position_encoding_options: its keyword
    options (e.g. {"base": 10000}). num_key_value_heads and head_dim default to num_attention_heads and
    hidden_size // num_attention_heads, intermediate_size to poskit's default ratio (4 x hidden_size for
    "gelu", 2/3 of that for "silu"). bias: biases in every linear layer. hidden_dropout: dropout on the
    embeddings and on each residual branch. max_position_embeddings: the context the model was trained at,
    for tools that read it (lm-evaluation-harness truncates to it); poskit models run at any length.
    is_causal: False describes a bidirectional encoder (poskit's MLM models), which PoskitForCausalLM refuses.
    attention_type: "softmax" or "linear" (RoFormer's linear attention; generate then needs use_cache=False).
    """

    model_type = "poskit"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = _DEFAULT.vocab_size
    hidden_size: int = _DEFAULT.d_model
    num_hidden_layers: int = _DEFAULT.n_layers
    num_attention_heads: int = _DEFAULT.n_heads
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    hidden_act: str = _ACTIVATION_OF_MLP[_DEFAULT.mlp]
    position_encoding: str = DEFAULT_ENCODING
    position_encoding_options: dict | None = None
    hidden_dropout: float | int = _DEFAULT.dropout
    tie_word_embeddings: bool = _DEFAULT.tie_embeddings
    bias: bool = _DEFAULT.bias
    rms_norm_eps: float | int = _DEFAULT.norm_eps
    initializer_range: float | int = _DEFAULT.init_std
    is_causal: bool = _DEFAULT.causal
    attention_type: str = _DEFAULT.attention
    max_position_embeddings: int | None = None
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        unknown = sorted(set(kwargs) - _TRANSFORMERS_KEYWORDS)
        if unknown:
            fields = sorted(f.name for f in dataclasses.fields(self) if not f.name.startswith("_"))
            raise ValueError(f"unknown PoskitConfig field(s) {unknown}; the fields are {fields}")
        if self.position_encoding_options is None:
            self.position_encoding_options = {}
        # the defaults that depend on other fields, written out (as Llama's config does) so config.json is explicit
        if self.num_key_value_heads is None and not isinstance(self.num_attention_heads, bool) \
                and isinstance(self.num_attention_heads, int):
            self.num_key_value_heads = self.num_attention_heads
        model_config = self.to_model_config(default_width=True)
        if self.head_dim is None:
            self.head_dim = model_config.dim_head
        if self.intermediate_size is None:
            self.intermediate_size = mlp_width(model_config)
        if self.max_position_embeddings is not None and (
                isinstance(self.max_position_embeddings, bool) or not isinstance(self.max_position_embeddings, int)
                or self.max_position_embeddings < 1):
            raise ConfigError("max_position_embeddings", "a positive int or null", self.max_position_embeddings)
        super().__post_init__(**kwargs)

    def to_model_config(self, *, default_width: bool = False) -> ModelConfig:
        """The `ModelConfig` of this config (validated; errors name the Hugging Face field)."""
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError("hidden_act", f"one of {sorted(ACTIVATIONS)} (gelu MLP or gated SiLU MLP)",
                              self.hidden_act)
        fields = {poskit_name: getattr(self, hf_name) for hf_name, poskit_name in MODEL_FIELDS.items()
                  if hf_name not in ("intermediate_size", "hidden_act")}
        fields["mlp"] = ACTIVATIONS[self.hidden_act]
        fields["init_std"] = _widen(fields["init_std"])
        fields["norm_eps"] = _widen(fields["norm_eps"])
        fields["dropout"] = _widen(fields["dropout"])
        fields["mlp_ratio"] = _DEFAULT.mlp_ratio
        try:
            config = ModelConfig(**fields)
        except ConfigError as e:
            raise e.renamed(_HF_NAME.get(e.field, e.field)) from None
        _check_encoding(config)
        if self.intermediate_size is None and default_width:
            return config
        return dataclasses.replace(config, mlp_ratio=_ratio_for_width(config, self.intermediate_size))

    @classmethod
    def from_model_config(cls, model_config: ModelConfig, **kwargs) -> "PoskitConfig":
        """The PoskitConfig of a poskit `ModelConfig` (kwargs: other PretrainedConfig fields, e.g. eos_token_id)."""
        if not isinstance(model_config, ModelConfig):
            raise ValueError(f"model_config must be a poskit ModelConfig, got {type(model_config).__name__}")
        fields = {hf_name: getattr(model_config, poskit_name) for hf_name, poskit_name in MODEL_FIELDS.items()
                  if hf_name not in ("intermediate_size", "hidden_act")}
        fields["hidden_act"] = _ACTIVATION_OF_MLP[model_config.mlp]
        fields["intermediate_size"] = mlp_width(model_config)
        fields["num_key_value_heads"] = model_config.kv_heads
        fields["head_dim"] = model_config.dim_head
        clash = sorted(set(fields) & set(kwargs))
        if clash:
            raise ValueError(f"fields {clash} come from model_config; pass them there, not as keywords")
        return cls(**fields, **kwargs)


def _widen(value):
    # JSON writes 0.0 as 0 in some tools; ModelConfig's float fields take ints, but not bools
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_encoding(config: ModelConfig) -> None:
    """Build the encoding once so that bad options fail here, naming the config field, not at model build."""
    try:
        with torch.device("meta"):
            poskit.build_encoding(config.encoding, head_dim=config.dim_head, num_heads=config.n_heads,
                                  dim=config.d_model, **config.encoding_options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"position_encoding_options {config.encoding_options!r} do not fit position_encoding "
                         f"{config.encoding!r}: {e}") from None


def mlp_width(config: ModelConfig) -> int:
    """The hidden width of one MLP branch that `poskit.models.decoder.decoder_mlp` builds for `config` (on the meta
    device: no memory), so this module never restates the MLP's sizing rule."""
    with torch.device("meta"):
        return decoder_mlp(config).w1.out_features


def _ratio_for_width(config: ModelConfig, width) -> float:
    """An mlp_ratio for which poskit's MLP is `width` wide (checked by building it), or a ConfigError."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError("intermediate_size", "a positive int or null", width)
    # SwiGLU keeps 2/3 of int(mlp_ratio * d_model): the smallest such hidden size is ceil(3 * width / 2)
    hidden = width if config.mlp == "gelu" else math.ceil(3 * width / 2)
    ratio = hidden / config.d_model
    for candidate in (ratio, math.nextafter(ratio, math.inf)):  # int(ratio * d) may round down by one ulp
        if mlp_width(dataclasses.replace(config, mlp_ratio=candidate)) == width:
            return candidate
    raise ConfigError("intermediate_size", f"a width poskit's {config.mlp} MLP can have at hidden_size "
                      f"{config.d_model}", width)
