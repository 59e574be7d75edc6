"""`PoskitConfig`: a poskit `ModelConfig` under Hugging Face's usual field names, as a `PretrainedConfig`.

Every `ModelConfig` field has one config field here (`MODEL_FIELDS` says which); `to_model_config()` builds
the `ModelConfig`, and every error it raises names the Hugging Face field. The MLP is described as Hugging
Face describes it: `hidden_act` "gelu" is poskit's Linear-GELU-Linear MLP and "silu" its gated SwiGLU MLP
(as in Llama), and `intermediate_size` is the hidden width of one branch; poskit's `mlp_ratio` is derived
from it so that the built MLP has exactly that width.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import torch
from transformers import GenerationConfig, PretrainedConfig

import poskit
from poskit.util.config_check import ConfigError
from poskit.encodings import DEFAULT_ENCODING, rope_hf
from poskit.encodings.base import OPTION_CHECKS, encoding_class
from poskit.encodings.mrope import MultimodalRoPE
from poskit.encodings.rotary import RotaryEncoding
from poskit.encodings.spec import EncodingSpec
from poskit.models.decoder import MODEL_ENCODING, ModelConfig, decoder_mlp

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
    "layer_encodings": "layer_encodings",
}
_HF_NAME = {poskit_name: hf_name for hf_name, poskit_name in MODEL_FIELDS.items()}

#: the fields that decide what the weights compute (every model field but dropout, a training setting): an
#: export records their values (`poskit_fingerprint`), and a config whose values differ is refused
FINGERPRINT_FIELDS = tuple(name for name in MODEL_FIELDS if name != "hidden_dropout")

#: the module written beside config.json that names poskit's classes for transformers' auto classes, so that
#: `AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)` loads a saved directory where poskit
#: is installed, without `import poskit.hf` first (transformers has no other hook for installed libraries)
AUTO_MODULE = "poskit_auto"
AUTO_MAP = {"AutoConfig": f"{AUTO_MODULE}.PoskitConfig", "AutoModelForCausalLM": f"{AUTO_MODULE}.PoskitForCausalLM"}
AUTO_MODULE_SOURCE = '''"""Loads this directory with poskit, which must be installed with its hf extra:

    transformers.AutoModelForCausalLM.from_pretrained(this_directory, trust_remote_code=True)

(or `import poskit.hf` first, then no trust_remote_code is needed). The classes are poskit's own, installed with
it; this file only names them for transformers' auto classes and holds no model code."""
import poskit.hf


class PoskitConfig(poskit.hf.PoskitConfig):
    pass


class PoskitForCausalLM(poskit.hf.PoskitForCausalLM):
    config_class = PoskitConfig
'''

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

    position_encoding: any name of `poskit.available_encodings()`, or an encoding spec ("pope:delta_init=uniform",
    stored as its name, its options joining position_encoding_options); position_encoding_options: its keyword
    options (e.g. {"base": 10000}), typed as EncodingSpec types them. num_key_value_heads and head_dim default to num_attention_heads and
    hidden_size // num_attention_heads, intermediate_size to poskit's default ratio (4 x hidden_size for
    "gelu", 2/3 of that for "silu"). bias: biases in every linear layer. hidden_dropout: dropout on the
    embeddings and on each residual branch. max_position_embeddings: the context the model was trained at,
    for tools that read it (lm-evaluation-harness truncates to it); poskit models run at any length.
    is_causal: False describes a bidirectional encoder (poskit's MLM models), which PoskitForCausalLM refuses.
    attention_type: "softmax" or "linear" (RoFormer's linear attention; generate then needs use_cache=False).

    Hugging Face's RoPE fields are accepted as Llama's config takes them: rope_theta, rope_parameters (or its
    older name rope_scaling), partial_rotary_factor, original_max_position_embeddings and rope_interleave, at
    the top level or inside position_encoding_options (encodings/rope_hf.py reads them). They are stored as
    poskit's options of the rope encoding, and a rope dict's rope_type picks the variant when
    position_encoding is plain "rope" ({"rope_type": "yarn", ...} -> "rope-yarn"). Two fields that give one
    option different values are refused, naming both. For position_encoding "mrope" (Qwen2-VL's text model)
    rope_theta and a rope dict of rope_type "default" or "mrope" with mrope_section (and Qwen3-VL's
    mrope_interleaved) are read the same way.

    layer_encodings: the encoding of each attention layer where they differ (ModelConfig.layer_encodings: specs,
    "*" for position_encoding, a shorter list repeated over the layers). Hugging Face's names for schedules are
    accepted and stored as layer_encodings: Llama 4's no_rope_layers (1 = RoPE, 0 = no position, one per layer)
    or no_rope_layer_interval (no position on every k-th layer), and Gemma's sliding_window_pattern (every k-th
    layer is global, the others local) with rope_local_base_freq (the RoPE base of the local layers; the global
    ones keep position_encoding, rope_theta included). poskit reads the bases only: it has no sliding window.

    poskit_fingerprint: what the weights were trained as (`fingerprint()`, written by `poskit export`): the
    values of FINGERPRINT_FIELDS and their sha256. A config whose fields differ from it (config.json edited to
    another architecture or encoding) is refused, naming the field; remove it from config.json to load the
    weights under another architecture on purpose. save_pretrained also writes the module of AUTO_MAP.
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
    layer_encodings: list[str] | None = None
    max_position_embeddings: int | None = None
    poskit_fingerprint: dict | None = None
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        hf_rope = {key: kwargs.pop(key) for key in _HF_ROPE_FIELDS if key in kwargs}
        hf_layers = {key: kwargs.pop(key) for key in _HF_LAYER_FIELDS if key in kwargs}
        unknown = sorted(set(kwargs) - _TRANSFORMERS_KEYWORDS)
        if unknown:
            fields = sorted(f.name for f in dataclasses.fields(self) if not f.name.startswith("_"))
            raise ValueError(f"unknown PoskitConfig field(s) {unknown}; the fields are {fields}")
        if self.position_encoding_options is None:
            self.position_encoding_options = {}
        self._read_spec_text()
        self._read_hf_rope_fields(hf_rope)
        self._read_hf_layer_fields(hf_layers)
        if self.poskit_fingerprint is not None:
            self._check_fingerprint()
        kwargs["auto_map"] = {**(kwargs.get("auto_map") or {}), **AUTO_MAP}
        # the defaults that depend on other fields, written out (as Llama's config does) so config.json is explicit
        if self.num_key_value_heads is None and not isinstance(self.num_attention_heads, bool) \
                and isinstance(self.num_attention_heads, int):
            self.num_key_value_heads = self.num_attention_heads
        model_config = self.to_model_config(default_width=True)
        self.position_encoding_options = model_config.encoding_options  # typed by the spec's rules
        if self.head_dim is None:
            self.head_dim = model_config.dim_head
        if self.intermediate_size is None:
            self.intermediate_size = mlp_width(model_config)
        if self.max_position_embeddings is not None and (
                isinstance(self.max_position_embeddings, bool) or not isinstance(self.max_position_embeddings, int)
                or self.max_position_embeddings < 1):
            raise ConfigError("max_position_embeddings", "a positive int or null", self.max_position_embeddings)
        super().__post_init__(**kwargs)

    def fingerprint(self) -> dict:
        """What these weights compute under: {"fields": the values of FINGERPRINT_FIELDS, "sha256": their digest}."""
        fields = {name: _as_json(getattr(self, name)) for name in FINGERPRINT_FIELDS}
        return {"fields": fields, "sha256": _digest(fields)}

    def _check_fingerprint(self) -> None:
        record = self.poskit_fingerprint
        if not (isinstance(record, dict) and isinstance(record.get("fields"), dict)
                and isinstance(record.get("sha256"), str) and set(record) == {"fields", "sha256"}):
            raise ConfigError("poskit_fingerprint", 'null or {"fields": {...}, "sha256": "..."} as poskit export '
                              "writes it", record)
        if _digest(record["fields"]) != record["sha256"]:
            raise ValueError("poskit_fingerprint in this config was edited (its sha256 no longer matches its fields): "
                             "restore it as exported, or remove it to load the weights without the check")
        unknown = sorted(set(record["fields"]) - set(FINGERPRINT_FIELDS))
        if unknown:
            raise ValueError(f"poskit_fingerprint records field(s) {unknown} this poskit does not know")
        for name, trained in record["fields"].items():
            now = _as_json(getattr(self, name))
            if now != trained:
                raise ValueError(f"{name} is {now!r} here, but these weights were trained with {name}={trained!r} "
                                 "(poskit_fingerprint): they would compute something else under another architecture "
                                 "or encoding; restore the field, or remove poskit_fingerprint from config.json to "
                                 "load them this way on purpose")

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """config.json, and the module that AUTO_MAP names (loading without `import poskit.hf`)."""
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        if os.path.isfile(os.path.join(save_directory, "config.json")):
            with open(os.path.join(save_directory, f"{AUTO_MODULE}.py"), "w") as f:
                f.write(AUTO_MODULE_SOURCE)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig"):
        # transformers calls this on a class loaded through AUTO_MAP, after which save_pretrained would copy the
        # source file of the class into the directory: for these installed classes that would be poskit's own
        # modules. save_pretrained writes the AUTO_MAP module instead.
        if cls.__module__.split(".")[0] == "poskit":
            return
        super().register_for_auto_class(auto_class)

    def _read_spec_text(self) -> None:
        """position_encoding given as spec text ("pope:delta_init=uniform"): its name, and its options folded
        into position_encoding_options (an option given in both with another value is refused, naming both)."""
        text, options = self.position_encoding, self.position_encoding_options
        if not isinstance(text, str) or ":" not in text or not isinstance(options, dict):
            return  # a plain name (or a bad value, which to_model_config names)
        spec = EncodingSpec.parse(text, arg="position_encoding")
        for key, value in spec.options.items():
            if key in options and options[key] != value:
                raise ValueError(f"position_encoding {text!r} sets {key}={value!r} and "
                                 f"position_encoding_options[{key!r}]={options[key]!r}: give one of them")
        self.position_encoding, self.position_encoding_options = spec.name, {**options, **spec.options}

    def _read_hf_rope_fields(self, fields: dict) -> None:
        """Fold HF's RoPE fields (top level, or inside position_encoding_options) into poskit's rope options."""
        options = self.position_encoding_options
        given = {k: v for k, v in fields.items() if v is not None}
        if not isinstance(options, dict) or not isinstance(self.position_encoding, str):
            if given:
                raise ValueError(f"{sorted(given)[0]} needs position_encoding to be a rope encoding and "
                                 "position_encoding_options a dict")
            return  # to_model_config names what is wrong
        is_rope = (self.position_encoding in poskit.available_encodings()
                   and encoding_class(self.position_encoding) is RotaryEncoding)
        if (self.position_encoding in poskit.available_encodings()
                and encoding_class(self.position_encoding) is MultimodalRoPE):
            self.position_encoding_options = _mrope_options(options, given)
            return
        if given and not is_rope:
            raise ValueError(f"{sorted(given)[0]} is a RoPE field; position_encoding {self.position_encoding!r} is not "
                             "a rope encoding (rope, rope-yarn, ...)")
        if not is_rope:
            return
        merged = {**options, **given}
        both = sorted(set(options) & set(given))
        for key in both:
            if options[key] != given[key]:
                raise ValueError(f"{key}={given[key]!r} and position_encoding_options[{key!r}]={options[key]!r} "
                                 "disagree: give one of them")
        named = [rope_hf.HF_ROPE_TYPES.get(t.get("rope_type", t.get("type")))
                 for t in (merged.get(k) for k in rope_hf.HF_DICTS) if isinstance(t, dict)]
        named = [n for n in named if n is not None]
        if named and rope_hf.encoding_scaling(self.position_encoding) == "none":
            self.position_encoding = rope_hf.encoding_name(named[0])  # the dict picks the variant of plain rope
        head_dim = self.head_dim if self.head_dim is not None else _quotient(self.hidden_size, self.num_attention_heads)
        try:
            scaling = rope_hf.encoding_scaling(self.position_encoding)
            self.position_encoding_options = rope_hf.resolve_options(scaling, head_dim, merged)
        except ValueError as e:
            raise ValueError(f"position_encoding {self.position_encoding!r}: {e}") from None

    def _read_hf_layer_fields(self, fields: dict) -> None:
        """Turn HF's per-layer fields (Llama 4's NoPE layers, Gemma's local RoPE base) into layer_encodings."""
        given = {k: v for k, v in fields.items() if v is not None}
        if not given:
            return
        if self.layer_encodings is not None:
            raise ValueError(f"{sorted(given)[0]} and layer_encodings both give the encoding of each layer: give one")
        n = self.num_hidden_layers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return  # to_model_config names num_hidden_layers
        if "no_rope_layers" in given and "no_rope_layer_interval" in given:
            raise ValueError("no_rope_layers and no_rope_layer_interval both say which layers have no position: "
                             "give one")
        local = {"sliding_window_pattern", "rope_local_base_freq"} & set(given)
        if local and len(local) == 1:
            raise ValueError("sliding_window_pattern (which layers are local) and rope_local_base_freq (their RoPE "
                             "base) go together: give both (poskit reads the local base, it has no sliding window)")
        if local and len(given) > 2:
            raise ValueError(f"{sorted(set(given) - local)[0]} and sliding_window_pattern both set the encoding of "
                             "each layer: give one schedule")
        if "no_rope_layers" in given:
            flags = given["no_rope_layers"]
            if (not isinstance(flags, (list, tuple)) or len(flags) < n
                    or any(isinstance(f, bool) or f not in (0, 1) for f in flags)):
                raise ConfigError("no_rope_layers", f"a list of at least num_hidden_layers={n} flags, 1 = RoPE and "
                                  "0 = no position", flags)
            schedule = [MODEL_ENCODING if f else "none" for f in flags[:n]]
        elif "no_rope_layer_interval" in given:
            every = given["no_rope_layer_interval"]
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ConfigError("no_rope_layer_interval", "an int >= 1 (no position on every k-th layer)", every)
            schedule = [MODEL_ENCODING if (i + 1) % every else "none" for i in range(n)]  # as HF's Llama 4
        else:
            every, base = given["sliding_window_pattern"], given["rope_local_base_freq"]
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise ConfigError("sliding_window_pattern", "an int >= 1 (every k-th layer global)", every)
            if not (isinstance(self.position_encoding, str) and self.position_encoding in poskit.available_encodings()
                    and isinstance(encoding_class(self.position_encoding), type)
                    and issubclass(encoding_class(self.position_encoding), RotaryEncoding)):
                raise ValueError(f"rope_local_base_freq is the RoPE base of local layers; position_encoding "
                                 f"{self.position_encoding!r} is not a rope encoding")
            own = self.position_encoding_options if isinstance(self.position_encoding_options, dict) else {}
            local_options = {"base": base, **{k: own[k] for k in ("layout", "rotary_dim") if k in own}}
            try:
                local_spec = str(EncodingSpec("rope", local_options))
                OPTION_CHECKS["base"](base)
            except ValueError as e:
                raise ValueError(f"rope_local_base_freq: {e}") from None
            schedule = [local_spec if (i + 1) % every else MODEL_ENCODING for i in range(n)]  # as HF's Gemma 3
        # a schedule that gives every layer the model's encoding is no schedule
        self.layer_encodings = None if all(e == MODEL_ENCODING for e in schedule) else schedule

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
            field, dot, rest = e.field.partition(".")  # "encoding_options.base" -> "position_encoding_options.base"
            raise e.renamed(_HF_NAME.get(field, field) + dot + rest) from None
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


#: Hugging Face's RoPE fields a config may carry beside position_encoding_options (as Llama's config does)
_HF_ROPE_FIELDS = ("rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor",
                   "original_max_position_embeddings", "rope_interleave")
#: Hugging Face's per-layer fields, read into layer_encodings (Llama 4's NoPE layers, Gemma 3's local RoPE base)
_HF_LAYER_FIELDS = ("no_rope_layers", "no_rope_layer_interval", "sliding_window_pattern", "rope_local_base_freq")
#: the keys of an HF rope dict that a Qwen2-VL-style config gives M-RoPE -> its option (rope_type names the kind)
_MROPE_DICT_KEYS = {"rope_type": None, "type": None, "rope_theta": "base", "mrope_section": "mrope_section",
                    "mrope_interleaved": "mrope_interleaved"}


def _mrope_options(options: dict, given: dict) -> dict:
    """position_encoding_options of mrope with HF's rope_theta and rope dict (rope_type "default" or "mrope",
    rope_theta, mrope_section, mrope_interleaved), top level or inside the options, read into its own options;
    two values for one option are refused, naming both."""
    unknown = sorted(set(given) - {"rope_theta", "rope_parameters", "rope_scaling"})
    if unknown:
        raise ValueError(f"{unknown[0]} is not read for position_encoding 'mrope' (it takes rope_theta and a rope "
                         "dict with mrope_section)")
    hf = {k: options[k] for k in ("rope_theta", "rope_parameters", "rope_scaling") if options.get(k) is not None}
    for key, value in given.items():
        if key in hf and hf[key] != value:
            raise ValueError(f"{key}={value!r} and position_encoding_options[{key!r}]={hf[key]!r} disagree: give one "
                             "of them")
        hf[key] = value
    merged = {k: v for k, v in options.items() if k not in ("rope_theta", "rope_parameters", "rope_scaling")}
    sources = {k: f"position_encoding_options[{k!r}]" for k in merged}

    def put(option, value, source):
        if option in merged and merged[option] != value:
            raise ValueError(f"{source}={value!r} and {sources[option]}={merged[option]!r} disagree: give one of them")
        merged[option], sources[option] = value, source

    for name in ("rope_parameters", "rope_scaling"):
        table = hf.get(name)
        if table is None:
            continue
        if not isinstance(table, dict) or set(table) - set(_MROPE_DICT_KEYS):
            raise ValueError(f"{name} of position_encoding 'mrope' must be a dict of {sorted(_MROPE_DICT_KEYS)}, got "
                             f"{table!r}")
        rope_type = table.get("rope_type", table.get("type"))
        if rope_type not in (None, "default", "mrope"):
            raise ValueError(f"{name}['rope_type'] must be 'default' or 'mrope' for position_encoding 'mrope' "
                             f"(poskit computes no scaled M-RoPE), got {rope_type!r}")
        for key, option in _MROPE_DICT_KEYS.items():
            if option is not None and table.get(key) is not None:
                value = table[key]
                put(option, list(value) if isinstance(value, (list, tuple)) else value, f"{name}[{key!r}]")
    if hf.get("rope_theta") is not None:
        put("base", hf["rope_theta"], "rope_theta")
    return merged


def _as_json(value):
    # the value as config.json holds it (tuples become lists, ints stay ints)
    return json.loads(json.dumps(value))


def _digest(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _quotient(width, heads):
    # head_dim's default, when both are ints (otherwise None: to_model_config names the bad field)
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (width, heads))
    return width // heads if ints and heads > 0 else None


def _widen(value):
    # JSON writes 0.0 as 0 in some tools; ModelConfig's float fields take ints, but not bools
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _check_encoding(config: ModelConfig) -> None:
    """Build the encoding once so that bad options fail here, naming the config field, not at model build."""
    try:
        with torch.device("meta"):
            config.encoding_spec.build(head_dim=config.dim_head, num_heads=config.n_heads, dim=config.d_model)
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
