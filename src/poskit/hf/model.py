"""`PoskitForCausalLM`: `poskit.models.Transformer` as a transformers causal LM (PreTrainedModel + GenerationMixin).

The wrapped Transformer (`.model`) does all the computing, for every encoding, with no branch on the
encoding's name: left padding, positions from the attention mask, the KV cache behind `PoskitCache`. What
transformers adds on top comes from its own machinery: the loss (`loss_function`, its shift-by-one convention
and ignore index -100), generation (greedy, sampling, beam search), save/load, Trainer. Hidden states and
attention weights are read by hooks on the Transformer's modules, only for a call that asks for them.

Hugging Face conventions: `attn_implementation` "sdpa" (the default: the engine's fastest exact path) or
"eager" (poskit's reference path, materialised scores); gradient checkpointing (`activation_checkpointing_enable`,
its older name `gradient_checkpointing_enable`, `TrainingArguments(gradient_checkpointing=True)`) recomputes each
block in the backward pass. Loading is strict: a tensor missing from the saved weights, or one the model does
not have, is an error naming it (`from_pretrained(..., init_missing_weights=True)` initialises missing ones as a
new model would instead).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

import poskit
from poskit.attention.reference import softmax_rows
from poskit.util.config_check import ConfigError
from poskit.encodings.base import PositionalEncoding
from poskit.encodings.mrope import coordinates_from_hf
from poskit.encodings.spec import EncodingSpec
from poskit.models import Transformer
from poskit.models.decoder import layer_spec

from .cache import PoskitCache
from .config import PoskitConfig
from .inputs import check_position_ids, check_token_inputs

# keywords transformers' Trainer passes to a model's forward for its loss (ForCausalLMLoss accepts them)
_LOSS_KEYWORDS = ("num_items_in_batch", "ignore_index")

#: Hugging Face's attn_implementation -> the backend of poskit's attention engine for every layer
ATTN_IMPLEMENTATIONS = {"eager": "reference", "sdpa": "auto"}


def _check_attn_implementation(value) -> None:
    if isinstance(value, str) and value not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation must be one of {sorted(ATTN_IMPLEMENTATIONS)} (\"sdpa\": the attention "
                         "engine's fastest exact path for the encoding; \"eager\": poskit's reference path, with "
                         f"materialised scores), got {value!r}")


class PoskitPreTrainedModel(PreTrainedModel):
    config_class = PoskitConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    # the blocks' activations are recomputed in backward by the Transformer's block loop (models/block.py), which
    # transformers switches on through the Transformer's `gradient_checkpointing` attribute
    supports_gradient_checkpointing = True
    _supports_sdpa = True

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=None,
                                    every_n_layers: int = 1):
        if enable and every_n_layers != 1:  # refused before anything is switched on
            raise ValueError(f"every_n_layers must be 1 for a poskit model (its block loop checkpoints every block), "
                             f"got {every_n_layers!r}")
        func = gradient_checkpointing_func
        super()._set_gradient_checkpointing(enable=enable, every_n_layers=every_n_layers,
                                            **({} if func is None else {"gradient_checkpointing_func": func}))

    def _check_and_adjust_attn_implementation(self, attn_implementation, is_init_check: bool = False, **kwargs):
        _check_attn_implementation(attn_implementation)
        return super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, init_missing_weights: bool = False,
                        **kwargs):
        """transformers' from_pretrained, strict: every tensor of the model must be in the saved weights and every
        saved tensor must be one of the model's, or a ValueError names them (transformers would leave a missing
        tensor as uninitialised memory). init_missing_weights=True: missing tensors get the values that
        `poskit.models.Transformer(config)` built instead of this call would have (from the random generator's
        state at the call); unexpected ones are still refused."""
        _check_attn_implementation(kwargs.get("attn_implementation"))
        want_info = kwargs.pop("output_loading_info", False)
        seed_state = torch.get_rng_state()  # missing tensors get what a model built now would have
        model, info = super().from_pretrained(pretrained_model_name_or_path, *model_args, output_loading_info=True,
                                              **kwargs)
        _check_loaded(model, info, init_missing_weights, pretrained_model_name_or_path, seed_state)
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers logs an error and returns without saving when the path is a file: a silent loss
        path = Path(save_directory)
        for p in (path, *path.parents):
            if p.exists():
                if not p.is_dir():
                    raise ValueError(f"save_directory {str(save_directory)!r} is a file or lies under one "
                                     f"({str(p)!r}): save_pretrained writes a directory (config.json, "
                                     "model.safetensors); choose a directory path")
                break
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _init_weights(self, module):
        # poskit's Transformer initialises its weights itself when built (GPT-2-style scaled residual projections,
        # each encoding's own parameters such as PoPE's phase bias): transformers' generic initialisation would
        # undo that. What transformers does need from here are the encodings' non-persistent buffers (frequencies,
        # slopes), which from_pretrained leaves empty because no checkpoint holds them.
        if isinstance(module, PositionalEncoding):
            _recompute_derived_buffers(module, self._spec_of(module), self.config.hidden_size)

    def _spec_of(self, encoding: PositionalEncoding) -> EncodingSpec:
        """The spec `encoding` was built from: its layer's (`layer_spec`: layers of a schedule differ) where it is
        the encoding of an attention layer of the model's Transformer, else the model's own; a "none" standing
        in for an absolute encoding inside the layers was built without options."""
        cfg = self.config.to_model_config()
        for transformer in (m for m in self.modules() if isinstance(m, Transformer)):
            for i, block in enumerate(transformer.blocks):
                if block.attn.encoding is encoding:
                    spec = layer_spec(cfg, i)
                    return spec if spec.name == encoding.name else EncodingSpec(encoding.name)
        return cfg.encoding_spec if encoding.name == cfg.encoding else EncodingSpec(encoding.name)


class PoskitForCausalLM(PoskitPreTrainedModel, GenerationMixin):
    """A poskit decoder-only Transformer for transformers' AutoModelForCausalLM, generate() and Trainer.

    forward(input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
    labels=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None)
    -> CausalLMOutputWithPast.
    attention_mask (B, T), or (B, cached + T) with a cache: 1 = real token, 0 = padding, left or right; a
    token's position counts only the real tokens before it, so a padded row computes what it computes alone.
    position_ids (B, T) or (1, T) integers >= 0, when given, are the new tokens' positions instead (for every
    encoding: an absolute one added at the embeddings, q/k rotations, biases, the cache). A model whose layers
    take coordinates (position_encoding "mrope") also takes Qwen2-VL's (3, B, T) or (3, 1, T) position_ids
    (time, height, width: `poskit.encodings.mrope.mrope_positions`, then `coordinates_to_hf`); text after them is
    decoded without position_ids, continuing at cache position + rope_deltas as Qwen2-VL does. inputs_embeds
    (B, T, hidden_size) replaces input_ids (exactly one of the two).
    """

    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}

    def __init__(self, config: PoskitConfig):
        if not isinstance(config, PoskitConfig):
            raise ValueError(f"config must be a PoskitConfig, got {type(config).__name__}")
        if config.is_causal is not True:
            raise ConfigError("is_causal", "True (a causal LM; a bidirectional MLM encoder cannot generate)",
                              config.is_causal)
        super().__init__(config)
        self.model = Transformer(config.to_model_config())
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.head

    def set_output_embeddings(self, value):
        self.model.head = value

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: PoskitCache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None, **kwargs):
        unknown = sorted(set(kwargs) - set(_LOSS_KEYWORDS))
        if unknown:
            raise TypeError(f"PoskitForCausalLM.forward got unexpected keyword(s) {unknown}; it takes input_ids, "
                            "attention_mask, position_ids, past_key_values, inputs_embeds, labels, use_cache, "
                            "output_attentions, output_hidden_states, return_dict and the loss keywords "
                            f"{list(_LOSS_KEYWORDS)}")
        check_token_inputs(input_ids, inputs_embeds, self.config.hidden_size, self.config.vocab_size)
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        coordinates = _coordinates(position_ids, batch, length)
        if coordinates is None:
            check_position_ids(position_ids, batch, length)
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (self.config.output_hidden_states if output_hidden_states is None
                                else output_hidden_states)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if use_cache is None:  # a cache only where it serves: decoding, not training steps
            use_cache = self.config.use_cache and not self.training
        if past_key_values is not None and not isinstance(past_key_values, PoskitCache):
            raise ValueError(f"past_key_values must be a poskit.hf.PoskitCache (generate() creates one), got "
                             f"{type(past_key_values).__name__}: poskit caches what each encoding needs (rotated "
                             "keys, PoPE magnitudes, padding), not transformers' raw key/value states")
        if past_key_values is None and use_cache:
            past_key_values = PoskitCache(self.config.num_hidden_layers)
        if output_attentions and past_key_values is not None and past_key_values.get_seq_length():
            raise ValueError("output_attentions needs the raw keys of every cached token, which the poskit cache "
                             "does not keep for every encoding (it stores rotated keys or PoPE magnitudes): pass "
                             "use_cache=False (generate(..., use_cache=False)) to get attention weights")
        kv = past_key_values.kv if past_key_values is not None else None
        implementation = self.config._attn_implementation
        _check_attn_implementation(implementation)
        with _recording(self.model, output_hidden_states, output_attentions) as recorded:
            logits = self.model(input_ids, position_ids if coordinates is None else coordinates, cache=kv, attention_mask=attention_mask,
                                inputs_embeds=inputs_embeds, backend=ATTN_IMPLEMENTATIONS[implementation])

        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        out = CausalLMOutputWithPast(
            loss=loss, logits=logits, past_key_values=past_key_values if use_cache else None,
            hidden_states=tuple(recorded["hidden_states"]) if output_hidden_states else None,
            attentions=tuple(recorded["attentions"]) if output_attentions else None)
        return out if return_dict else out.to_tuple()

    def _prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs):
        # generate() would derive position_ids from the attention mask itself (cumsum - 1, pads at 0) and then
        # count on from the last column, which is wrong after right padding; None leaves positions to the
        # model, which derives them from the mask and the cache (the default of forward). position_ids a caller
        # passes to generate() are still used, and extended by one per new token by transformers.
        return None

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size,
                                      max_cache_length):
        # generate() would create a DynamicCache (raw key/value states); a poskit model decodes with its own cache
        if model_kwargs.get("past_key_values") is not None or generation_config.use_cache is False:
            return super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode,
                                                         batch_size, max_cache_length)
        if generation_config.cache_implementation not in (None, "dynamic"):
            raise ValueError(f"cache_implementation={generation_config.cache_implementation!r} is not available for "
                             "poskit models, which decode with their own cache (PoskitCache): leave it unset")
        model_kwargs["past_key_values"] = PoskitCache(self.config.num_hidden_layers, max_length=max_cache_length + 1)


def _coordinates(position_ids, batch: int, length: int) -> torch.Tensor | None:
    """Qwen2-VL's (3, 1|B, T) M-RoPE position_ids as poskit's coordinates (1|B, T, 3); None for other position_ids
    (check_position_ids names what is wrong with them). Whether the model takes coordinates, the model says."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 3:
        return None
    coordinates = coordinates_from_hf(position_ids)  # refuses a non-integer tensor or a first axis other than 3
    if coordinates.shape[1] != length or coordinates.shape[0] not in (1, batch):
        raise ValueError(f"position_ids must have shape (3, {batch}, {length})" + (f" or (3, 1, {length})" if batch != 1
                         else "") + f" (time, height, width per new token), got {tuple(position_ids.shape)}")
    if coordinates.numel() and int(coordinates.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got a minimum of {int(coordinates.min())}")
    return coordinates


def _check_loaded(model: PoskitForCausalLM, info: dict, init_missing: bool, source, seed_state) -> None:
    """Raise ValueError naming every tensor that from_pretrained found missing, unexpected or of another shape;
    with `init_missing`, give the missing ones a newly built model's values instead."""
    unexpected = sorted(info["unexpected_keys"])
    mismatched = sorted(str(m[0] if isinstance(m, tuple) else m) for m in info["mismatched_keys"])
    missing = sorted(info["missing_keys"])
    where = f"the weights of {str(source)!r}"
    if unexpected or mismatched:
        problems = ([f"unexpected tensors {unexpected} (the model has no such parameter: was config.json edited, or "
                     "the weights saved by another model?)"] if unexpected else []) + \
                   ([f"tensors of another shape {mismatched}"] if mismatched else [])
        raise ValueError(f"{where} do not fit this model's config: " + "; ".join(problems))
    if missing and not init_missing:
        raise ValueError(f"{where} lack the tensors {missing} (was config.json edited, e.g. its position_encoding, or "
                         "the weights file truncated?); pass init_missing_weights=True to from_pretrained to give them "
                         "the values of a newly built model instead")
    if missing:
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.set_rng_state(seed_state)
            fresh = Transformer(model.config.to_model_config()).state_dict()
        with torch.no_grad():
            for name in missing:
                target = model.get_parameter_or_buffer(name)
                target.copy_(fresh[name.removeprefix("model.")].to(target.dtype))


def _recompute_derived_buffers(encoding: PositionalEncoding, spec: EncodingSpec, dim: int) -> None:
    """Fill `encoding`'s non-persistent buffers with the values a freshly built twin of `spec` has: they are
    functions of the encoding's options (which poskit checkpoints do not store either: poskit rebuilds them at
    construction)."""
    derived = [(name, buf) for name, buf in _non_persistent_buffers(encoding)]
    if not derived:
        return
    with torch.device("cpu"):  # from_pretrained builds under the meta device: the twin needs real values
        twin = spec.build(head_dim=encoding.head_dim, num_heads=encoding.num_heads, dim=dim)
    fresh = dict(_non_persistent_buffers(twin))
    with torch.no_grad():
        for name, buf in derived:
            buf.copy_(fresh[name].to(buf.dtype))


def _non_persistent_buffers(module: torch.nn.Module):
    for prefix, sub in module.named_modules():
        for name in sub._non_persistent_buffers_set:
            buf = sub._buffers.get(name)
            if buf is not None:
                yield (f"{prefix}.{name}" if prefix else name), buf


@contextlib.contextmanager
def _recording(model: Transformer, hidden_states: bool, attentions: bool):
    """Collect, during one forward of `model`, transformers' `hidden_states` (the embeddings, each block's
    output, the last one after the final norm) and `attentions` (each layer's softmax weights (B, H, T, Tk),
    recomputed from the layer's inputs by the float64-checkable reference scores)."""
    recorded = {"hidden_states": [], "attentions": []}
    handles = []
    if hidden_states:
        blocks = list(model.blocks)

        def keep(module, args, output):
            recorded["hidden_states"].append(output)

        # model.drop runs once, on the embeddings (the blocks have their own dropout modules)
        handles.append(model.drop.register_forward_hook(keep))
        handles += [b.register_forward_hook(keep) for b in blocks[:-1]]
        handles.append(model.norm.register_forward_hook(keep))
    if attentions:
        for block in model.blocks:
            handles.append(block.attn.register_forward_pre_hook(
                lambda module, args: recorded["attentions"].append(_attention_weights(module, *args))))
    try:
        yield recorded
    finally:
        for h in handles:
            h.remove()


def _attention_weights(attn, x, positions, cache=None, real=None) -> torch.Tensor:
    """(B, H, T, T) softmax weights of one poskit attention layer on its input x (B, T, d_model)."""
    q = attn._heads(attn.q_proj(x), attn.num_heads)
    k = attn._heads(attn.k_proj(x), attn.num_kv_heads)
    v = attn._heads(attn.v_proj(x), attn.num_kv_heads)
    g = attn._heads(attn.g_proj(x), attn.num_kv_heads) if attn.g_proj is not None else None
    mask = None if real is None else real[:, None, None, :]
    logits = poskit.attention_scores(q, k, attn.encoding, is_causal=True, enable_gqa=True, q_positions=positions,
                                     k_positions=positions, attn_mask=mask, v=v, gate_keys=g)
    return softmax_rows(logits, logits > float("-inf"))


__all__ = ["PoskitForCausalLM", "PoskitPreTrainedModel"]
