"""Native Llama both ways: a poskit decoder whose architecture is Llama's as transformers' own `LlamaForCausalLM`
(loadable with `AutoModelForCausalLM.from_pretrained` wherever transformers is installed, poskit or not), and a
Llama checkpoint as a poskit `Transformer` (whose RoPE can then be swapped, e.g. for context extension).

    llama_config(model_config)        -> the LlamaConfig of a Llama-compatible ModelConfig, or a ConfigError
                                         naming the first field Llama cannot express and what Llama needs
    to_llama(transformer)             -> LlamaForCausalLM computing what `transformer` computes
    export_llama(run_dir, directory)  -> a `poskit train` run as a LlamaForCausalLM directory
                                         (`poskit export RUN --hf DIR --format llama`)
    from_llama(directory or model)    -> poskit.models.Transformer with the Llama's weights and RoPE
    with_rope(transformer, spec)      -> the same weights under another RoPE variant ("rope-yarn:factor=4:...")

A poskit decoder is Llama when: `mlp="swiglu"` (Llama's gated SiLU MLP: w1 is gate_proj, w3 up_proj, w2
down_proj), `causal=True`, `attention="softmax"`, a RoPE variant that transformers' Llama computes (rope,
rope-linear, rope-dynamic, rope-yarn, rope-llama3, rope-longrope; not rope-ntk, which has no HF rope type)
rotating every channel of a head (no rotary_dim below head_dim, no axial_dims), the same encoding in every layer,
and d_model a multiple of n_heads (LlamaConfig requires it even with an explicit head_dim). Everything else maps
one to one: RMSNorm pre-norm blocks (poskit's decoder has no other), n_kv_heads (GQA), head_dim, norm_eps,
tie_embeddings, and `bias` (poskit's puts a bias in every linear layer but the output head: Llama's
attention_bias and mlp_bias together). Any MLP width is reachable: PoskitConfig derives the mlp_ratio that
gives exactly Llama's intermediate_size. dropout is a training setting and is not exported.

RoPE layouts: Llama rotates channel i with i + head_dim/2 ("half"); poskit's default pairs (2i, 2i+1)
("interleaved"). Export permutes the rows of q_proj and k_proj (`rotary.convert_qk_layout`) so that the Llama
computes the same logits; import keeps Llama's half layout unless asked for another.

The two differ by design only where transformers' dynamic variants meet its KV cache: HF caches keys rotated
with the frequencies of the step that produced them, while poskit's rope-dynamic and rope-longrope re-rotate
every cached key with the frequencies of the current length. A full forward computes the same either way;
a cached generation of those two variants past original_max_positions can differ.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

from poskit.encodings import build_encoding, rope_hf
from poskit.encodings.base import encoding_class
from poskit.encodings.rotary import RotaryEncoding, convert_qk_layout
from poskit.encodings.spec import EncodingSpec
from poskit.models import Transformer
from poskit.models.decoder import ModelConfig
from poskit.util.config_check import ConfigError

from .config import PoskitConfig, mlp_width

#: HF's rope_type of each poskit RoPE scaling that transformers' Llama computes (the inverse of
#: rope_hf.HF_ROPE_TYPES; poskit's "ntk" has no rope_type)
ROPE_TYPES = {scaling: next(t for t, s in rope_hf.HF_ROPE_TYPES.items() if s == scaling)  # "longrope", not "su"
              for scaling in dict.fromkeys(rope_hf.HF_ROPE_TYPES.values())}
#: the encodings a native Llama can have
LLAMA_ENCODINGS = tuple(rope_hf.encoding_name(s) for s in ROPE_TYPES)

#: poskit option -> the key of HF's rope dict that holds it (the inverse of rope_hf.HF_DICT_KEYS)
_HF_ROPE_KEY = {option: key for key, option in rope_hf.HF_DICT_KEYS.items() if option is not None}
#: options of a RoPE that are not entries of HF's rope dict: the layout is the weights' business; rotary_dim
#: and axial_dims have been refused (Llama rotates every channel, on one axis) when they differ from the default
_NOT_IN_ROPE_DICT = ("base", "layout", "rotary_dim", "axial_dims", "scaling")

#: a poskit block's module -> the Llama decoder layer's module of the same weights
_LAYER_MODULES = {"norm1": "input_layernorm", "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
                  "attn.v_proj": "self_attn.v_proj", "attn.o_proj": "self_attn.o_proj",
                  "norm2": "post_attention_layernorm", "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj",
                  "mlp.w2": "mlp.down_proj"}
#: the rest of the model: poskit name -> Llama name
_TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "head.weight": "lm_head.weight"}
_QK = ("attn.q_proj", "attn.k_proj")

#: the LlamaConfig fields that come from the poskit model (the rest may be given to to_llama / llama_config)
_ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "initializer_range",
                        "tie_word_embeddings", "attention_bias", "mlp_bias", "rope_parameters", "rope_scaling",
                        "attention_dropout")


def _refuse(field: str, need: str, value):
    return ConfigError(field, f"{need} for a native LlamaForCausalLM", value)


def _llama_rope(cfg: ModelConfig) -> tuple[dict, int | None, str]:
    """(HF rope_parameters, the max_position_embeddings the rope needs or None, poskit's layout) of cfg's RoPE,
    or a ConfigError naming the field Llama cannot express."""
    names = list(LLAMA_ENCODINGS)
    if cfg.encoding not in names:
        why = " (rope-ntk has no Hugging Face rope_type)" if cfg.encoding == "rope-ntk" else ""
        raise _refuse("encoding", f"one of {names}{why}", cfg.encoding)
    scaling = rope_hf.encoding_scaling(cfg.encoding)
    with torch.device("meta"):
        enc = build_encoding(cfg.encoding, head_dim=cfg.dim_head, num_heads=cfg.n_heads, dim=cfg.d_model,
                             **cfg.encoding_options)
    if enc.axial_dims is not None:
        raise _refuse("encoding_options", "options without axial_dims (Llama's positions are one axis)",
                      cfg.encoding_options)
    if enc.rotary_dim != cfg.dim_head:
        raise _refuse("encoding_options", f"options that rotate every channel of a head (rotary_dim = head_dim = "
                      f"{cfg.dim_head}: Llama has no partial rotary), not rotary_dim {enc.rotary_dim}",
                      cfg.encoding_options)
    options = rope_hf.resolve_options(scaling, cfg.dim_head, cfg.encoding_options)
    rope = {"rope_type": ROPE_TYPES[scaling], "rope_theta": enc.base}
    max_positions = None
    for option, value in options.items():
        if option in _NOT_IN_ROPE_DICT:
            continue
        if scaling == "dynamic" and option == "original_max_positions":
            max_positions = value  # HF's dynamic NTK grows the base past config.max_position_embeddings
            continue
        if option not in _HF_ROPE_KEY:
            raise _refuse("encoding_options", f"options Hugging Face's rope dict can hold ({option!r} has no key "
                          "there)", cfg.encoding_options)
        rope[_HF_ROPE_KEY[option]] = list(value) if isinstance(value, tuple) else value
    return rope, max_positions, enc.layout


def llama_config(model_config: ModelConfig, **config_kwargs) -> LlamaConfig:
    """The LlamaConfig of a poskit decoder config whose architecture is Llama's (see the module's docstring).

    A config Llama cannot express is refused with one ConfigError naming the first field that differs and what
    Llama needs ("mlp must be 'swiglu' (Llama's gated SiLU MLP) for a native LlamaForCausalLM, got 'gelu'").
    config_kwargs: the other LlamaConfig fields (max_position_embeddings, pad/bos/eos_token_id, ...; bos and eos
    default to None, not Llama's 1 and 2, which would stop generation at those ids of a poskit vocabulary).
    max_position_embeddings: for rope-dynamic it is the length past which HF grows the base, so it must be
    the encoding's original_max_positions (the default); otherwise the context the model is meant for, by
    default original_max_positions * factor for the variants that have both (yarn, llama3, longrope) and
    LlamaConfig's default for the others."""
    if not isinstance(model_config, ModelConfig):
        raise ValueError(f"model_config must be a poskit ModelConfig, got {type(model_config).__name__}")
    cfg = model_config
    clash = sorted(set(config_kwargs) & set(_ARCHITECTURE_FIELDS))
    if clash:
        raise ValueError(f"fields {clash} come from the poskit model; pass them through its ModelConfig")
    if cfg.causal is not True:
        raise _refuse("causal", "True (Llama is a causal decoder)", cfg.causal)
    if cfg.attention != "softmax":
        raise _refuse("attention", "'softmax'", cfg.attention)
    if cfg.mlp != "swiglu":
        raise _refuse("mlp", "'swiglu' (Llama's gated SiLU MLP)", cfg.mlp)
    if cfg.layer_encodings is not None:
        raise _refuse("layer_encodings", "null (one RoPE in every layer)", cfg.layer_encodings)
    rope, dynamic_positions, _ = _llama_rope(cfg)
    if cfg.d_model % cfg.n_heads:
        raise _refuse("d_model", f"a multiple of n_heads={cfg.n_heads} (LlamaConfig requires hidden_size % "
                      "num_attention_heads == 0, even with head_dim given)", cfg.d_model)
    given = config_kwargs.get("max_position_embeddings")
    if dynamic_positions is not None:
        if given is not None and given != dynamic_positions:
            raise ValueError(f"max_position_embeddings={given!r}: for rope-dynamic it is the length past which "
                             f"transformers grows the base, so it must be the encoding's original_max_positions "
                             f"({dynamic_positions}) or not given")
        config_kwargs["max_position_embeddings"] = dynamic_positions
    elif given is None and "original_max_position_embeddings" in rope and "factor" in rope:
        # the extended context, which is what transformers expects beside a yarn factor (it warns otherwise)
        extended = rope["original_max_position_embeddings"] * rope["factor"]
        if float(extended).is_integer():
            config_kwargs["max_position_embeddings"] = int(extended)
    config_kwargs.setdefault("bos_token_id", None)
    config_kwargs.setdefault("eos_token_id", None)
    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=mlp_width(cfg),
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.dim_head, hidden_act="silu", rms_norm_eps=cfg.norm_eps, initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.bias, mlp_bias=cfg.bias, rope_parameters=rope,
        attention_dropout=0.0, **config_kwargs)


def _check_layers(model: Transformer) -> None:
    """Every layer's encoding is the RoPE its config names (Llama has one RoPE for all layers)."""
    cfg = model.config
    with torch.device("cpu"):
        reference = build_encoding(cfg.encoding, head_dim=cfg.dim_head, num_heads=cfg.n_heads, dim=cfg.d_model,
                                   **cfg.encoding_options)
    for i, block in enumerate(model.blocks):
        enc = block.attn.encoding
        same = (type(enc) is RotaryEncoding and enc.name == reference.name and enc.layout == reference.layout
                and enc.attention_factor == reference.attention_factor
                and torch.equal(enc.inv_freq.detach().cpu().to(reference.inv_freq.dtype), reference.inv_freq))
        if not same:
            raise ValueError(f"layer {i}'s encoding is {enc.name or type(enc).__name__!r} ({enc.extra_repr()}), not "
                             f"the model's {cfg.encoding!r}: a native LlamaForCausalLM has one RoPE in every layer")


def _llama_name(name: str) -> tuple[str, bool]:
    """(the Llama name of poskit state-dict entry `name`, whether it is a q/k projection)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name], False
    parts = name.split(".")
    module, leaf = ".".join(parts[2:-1]), parts[-1]
    if parts[0] != "blocks" or module not in _LAYER_MODULES:
        raise ValueError(f"the poskit model has a tensor {name!r} that a LlamaForCausalLM has no place for")
    return f"model.layers.{parts[1]}.{_LAYER_MODULES[module]}.{leaf}", module in _QK


def to_llama(model: Transformer, **config_kwargs) -> LlamaForCausalLM:
    """A LlamaForCausalLM (eval mode, the dtype of `model`'s weights) computing what the poskit decoder `model`
    computes: weights renamed to Llama's, q/k projection rows permuted from poskit's RoPE layout to Llama's half
    layout when they differ. Refused (one ConfigError naming the field) unless the architecture is Llama's;
    config_kwargs: as llama_config."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a poskit.models.Transformer, got {type(model).__name__}")
    config = llama_config(model.config, **config_kwargs)
    _check_layers(model)
    _, _, layout = _llama_rope(model.config)
    state = {}
    for name, tensor in model.state_dict().items():
        llama_name, is_qk = _llama_name(name)
        if is_qk and layout != "half":
            tensor = convert_qk_layout(tensor, head_dim=model.config.dim_head, src=layout, dst="half")
        state[llama_name] = tensor.detach()
    dtype = model.embed.weight.dtype
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is not consumed by an initialisation
        hf = LlamaForCausalLM(config)
    hf.load_state_dict(state, strict=True)
    return hf.to(dtype=dtype, device=model.embed.weight.device).eval()


def export_llama(run_dir, directory, *, overwrite: bool = False, progress: bool = False) -> Path:
    """Write the trained run `run_dir` (a `poskit train` or `poskit extend` directory of a decoder LM) as a native
    LlamaForCausalLM directory: config.json (a LlamaConfig, max_position_embeddings the run's context), model.safetensors,
    generation_config.json and poskit_run.json (the run's config, task and vocabulary). Loads with
    `transformers.AutoModelForCausalLM.from_pretrained(directory)`, no poskit needed.

    Everything is checked before anything is written, as for the poskit format (`export_run`): the
    destination, the run's files, and that its architecture is Llama's (else one error naming the first
    model.<field> Llama cannot express). Written under a temporary name beside `directory`, renamed when whole."""
    from .convert import _check_destination, load_for_export, write_export

    directory = Path(directory)
    _check_destination(Path(run_dir), directory, overwrite)
    model, task, cfg, extension = load_for_export(run_dir)
    if not isinstance(model, Transformer):
        raise ValueError(f"run {str(run_dir)!r} holds a {type(model).__name__}, not a decoder language model: only "
                         "those have a native Llama form")
    kwargs = dict(pad_token_id=task.vocab.pad_id)
    dynamic = model.config.encoding in LLAMA_ENCODINGS and rope_hf.encoding_scaling(model.config.encoding) == "dynamic"
    if not dynamic:  # dynamic RoPE's max_position_embeddings is its original_max_positions (llama_config)
        kwargs["max_position_embeddings"] = task.max_input_len
    try:
        hf = to_llama(model, **kwargs)
    except ConfigError as e:
        raise e.renamed(f"model.{e.field}") from None
    return write_export(run_dir, directory, hf, task, cfg, overwrite=overwrite, progress=progress,
                        extension=extension)


# -- import ------------------------------------------------------------------------------------------------

def model_config_from_llama(config: LlamaConfig, *, layout: str = "half") -> ModelConfig:
    """The poskit ModelConfig of a LlamaConfig (RoPE read from its rope_parameters by rope_hf.from_hf), or a
    ValueError naming the Llama key poskit cannot compute: hidden_act other than "silu", attention_bias without
    mlp_bias or the reverse (poskit's `bias` is both), a rope_type poskit does not compute, a partial rotary.
    layout: the RoPE layout of the poskit model ('half', Llama's own; 'interleaved' permutes q/k on import)."""
    if not isinstance(config, LlamaConfig):
        raise ValueError(f"config must be a transformers LlamaConfig (model_type 'llama'), got "
                         f"{type(config).__name__} (model_type {getattr(config, 'model_type', None)!r})")
    if config.hidden_act != "silu":
        raise ConfigError("hidden_act", "'silu' (poskit's SwiGLU MLP is Llama's gated SiLU MLP)", config.hidden_act)
    if config.attention_bias != config.mlp_bias:
        key = "attention_bias" if config.attention_bias else "mlp_bias"
        raise ConfigError(key, "equal to " + ("mlp_bias" if key == "attention_bias" else "attention_bias") +
                          " (poskit's bias puts a bias in every linear layer, attention and MLP alike)",
                          getattr(config, key))
    head_dim = config.head_dim if config.head_dim is not None else config.hidden_size // config.num_attention_heads
    rope = dict(config.rope_parameters or {})
    fraction = rope.pop("partial_rotary_factor", None)
    if fraction is not None and int(head_dim * fraction) != head_dim:
        raise ConfigError("rope_parameters['partial_rotary_factor']", "1.0 (LlamaForCausalLM rotates every channel "
                          "of a head)", fraction)
    name, options = rope_hf.from_hf(rope, head_dim=head_dim, max_position_embeddings=config.max_position_embeddings,
                                    layout=layout).to_config()
    poskit_config = PoskitConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=head_dim, hidden_act="silu", intermediate_size=config.intermediate_size, position_encoding=name,
        position_encoding_options=options, tie_word_embeddings=config.tie_word_embeddings,
        bias=bool(config.attention_bias), rms_norm_eps=config.rms_norm_eps,
        initializer_range=config.initializer_range)
    return poskit_config.to_model_config()


def from_llama(source, *, layout: str = "half") -> Transformer:
    """The poskit Transformer (eval mode, float32) of a Llama: `source` a directory holding a LlamaForCausalLM
    (config.json + safetensors, from save_pretrained) or a LlamaForCausalLM. Its RoPE is the one the config's
    rope_parameters describe (rope, rope-linear, rope-dynamic, rope-yarn, rope-llama3, rope-longrope), read
    by rope_hf; logits equal the Llama's to float32 rounding. layout: 'half' keeps Llama's q/k channel order,
    'interleaved' permutes q_proj/k_proj rows to poskit's default pairing (the same logits). A config poskit
    cannot compute is refused before any weight is read, naming the key (model_config_from_llama)."""
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    if isinstance(source, LlamaForCausalLM):
        hf = source
        model_config = model_config_from_llama(hf.config, layout=layout)
    elif isinstance(source, (str, os.PathLike)):
        directory = Path(source)
        if not (directory / "config.json").is_file():
            raise ValueError(f"directory {str(directory)!r} must hold a saved LlamaForCausalLM (config.json and "
                             "model.safetensors, from save_pretrained)")
        try:
            config = AutoConfig.from_pretrained(directory)
        except Exception as e:  # whatever transformers raised about the file: name the directory
            raise ValueError(f"cannot read the config.json of {str(directory)!r}: {type(e).__name__}: {e}") from None
        model_config = model_config_from_llama(config, layout=layout)
        try:
            hf = LlamaForCausalLM.from_pretrained(directory, config=config, dtype=torch.float32)
        except Exception as e:
            raise ValueError(f"cannot load the LlamaForCausalLM weights of {str(directory)!r}: "
                             f"{type(e).__name__}: {e}") from None
    else:
        raise ValueError(f"source must be a LlamaForCausalLM directory or a LlamaForCausalLM, got "
                         f"{type(source).__name__}")
    theirs = hf.state_dict()
    state = {}
    for name in _state_names(model_config):
        llama_name, is_qk = _llama_name(name)
        if llama_name not in theirs:
            raise ValueError(f"the LlamaForCausalLM has no tensor {llama_name!r} (poskit's {name!r})")
        tensor = theirs[llama_name].detach().to(device="cpu", dtype=torch.float32)
        if is_qk and layout != "half":
            tensor = convert_qk_layout(tensor, head_dim=model_config.dim_head, src="half", dst=layout)
        state[name] = tensor
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is not consumed by an initialisation
        model = Transformer(model_config)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _state_names(config: ModelConfig) -> list[str]:
    """The state-dict names of a poskit Transformer built from `config` (built on the meta device: no memory)."""
    with torch.device("meta"):
        return list(Transformer(config).state_dict())


def with_rope(model: Transformer, spec) -> Transformer:
    """A copy of the RoPE decoder `model` with the same weights and another RoPE variant, for context extension:
    `with_rope(model, "rope-yarn:factor=4:original_max_positions=2048")` (a spec string or an EncodingSpec).

    The model's base, layout and rotary_dim are kept unless the spec gives them (another layout permutes the
    q/k projection rows to match, so it changes no logit); the old variant's own options (its factor, its
    original_max_positions) are not kept, so the spec names every option its variant needs. Only RoPE
    variants are accepted: the weights were trained with RoPE. At factor 1, rope-linear and rope-yarn compute
    what plain rope computes. Returned in the mode, device and weight dtype of `model`."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a poskit.models.Transformer, got {type(model).__name__}")
    cfg = model.config
    if encoding_class(cfg.encoding) is not RotaryEncoding:
        raise ValueError(f"model's encoding is {cfg.encoding!r}: with_rope swaps one RoPE variant for another")
    spec = EncodingSpec.of(spec)
    if encoding_class(spec.name) is not RotaryEncoding:
        raise ValueError(f"spec must name a RoPE variant ({list(rope_hf.encoding_name(s) for s in ROPE_TYPES)}, "
                         f"rope-ntk), got {spec.name!r}: the weights were trained with RoPE")
    current = rope_hf.resolve_options(rope_hf.encoding_scaling(cfg.encoding), cfg.dim_head, cfg.encoding_options)
    kept = {k: v for k, v in current.items() if k in ("base", "layout", "rotary_dim")}
    new_config = dataclasses.replace(cfg, encoding=spec.name, encoding_options={**kept, **spec.options})
    weight = model.embed.weight
    with torch.device(weight.device), torch.random.fork_rng(devices=[]):
        swapped = Transformer(new_config)
    if weight.dtype != swapped.embed.weight.dtype:
        swapped = swapped.to(weight.dtype)  # as the caller cast `model`
    state = model.state_dict()
    old_layout, new_layout = model.blocks[0].attn.encoding.layout, swapped.blocks[0].attn.encoding.layout
    if new_layout != old_layout:  # a spec may ask for the other layout: q/k rows follow, the logits stay
        state = {name: convert_qk_layout(t, head_dim=cfg.dim_head, src=old_layout, dst=new_layout,
                                         rotary_dim=swapped.blocks[0].attn.encoding.rotary_dim)
                 if name.endswith(("attn.q_proj.weight", "attn.k_proj.weight", "attn.q_proj.bias", "attn.k_proj.bias"))
                 else t for name, t in state.items()}
    swapped.load_state_dict(state, strict=True)
    return swapped.train(model.training)


__all__ = ["LLAMA_ENCODINGS", "export_llama", "from_llama", "llama_config", "model_config_from_llama", "to_llama",
           "with_rope"]
