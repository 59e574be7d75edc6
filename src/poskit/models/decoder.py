"""A small decoder-only Transformer that takes any poskit encoding (or, with `causal=False`, a BERT-style encoder).

The architecture is the PoPE paper's (App. B.2): pre-norm blocks with RMSNorm, causal self-attention, an MLP
(GELU or SwiGLU), a final RMSNorm and a linear head. `ModelConfig.causal=False` makes the same stack
bidirectional (every token sees every real token), which is what a masked-language model needs; such a model
has no KV cache and no `generate`. The positional encoding enters in one of two places:

- absolute encodings (sinusoidal, learned, legendre): one instance per model, its vectors are added to the
  token embeddings; attention inside the layers then uses no positional encoding;
- every other encoding: one instance per attention layer (PoPE's phase bias delta, CoPE's position
  embeddings and relative tables are per layer), applied inside `poskit.attention`.

Attention goes through `poskit.attention`, so the model gets whatever fast path the engine picks.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from poskit.attention.kv_cache import KVCache, undone_on_error
from poskit.util.config_check import ConfigError, check_field_types, from_known_fields
from poskit.encodings import DEFAULT_ENCODING, build_encoding
from poskit.encodings.base import as_position_tensor, encoding_class
from poskit.encodings.mrope import text_positions
from poskit.encodings.spec import EncodingSpec, SpecError

from .batch import ModelBatch, build_batch, real_tokens
from .block import MLP, Block, RMSNorm, SelfAttention, run_block

MLP_KINDS = ("gelu", "swiglu")
ATTENTION_KINDS = ("softmax", "linear")  # linear: RoFormer eq. 19 (attention/linear.py), causal
#: the entry of ModelConfig.layer_encodings that stands for the model's own encoding (encoding, encoding_options)
MODEL_ENCODING = "*"


@dataclass
class ModelConfig:
    """Every knob of `Transformer`. Defaults are the demo's character-level LM (about 415 k parameters)."""

    vocab_size: int = 128
    """Number of token ids (the task's vocabulary size, padding included)."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 2
    """Number of transformer blocks."""
    n_heads: int = 4
    """Query heads per attention layer."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None = n_heads. Must divide n_heads."""
    head_dim: int | None = None
    """Channels per head; None = d_model // n_heads."""
    mlp: str = "gelu"
    """MLP kind: "gelu" (Linear-GELU-Linear) or "swiglu" (SiLU(x W1) * (x W3), then W2)."""
    mlp_ratio: float = 4.0
    """Hidden width of the MLP as a multiple of d_model (SwiGLU uses 2/3 of it per branch, as in Llama)."""
    encoding: str = DEFAULT_ENCODING
    """Name of the positional encoding (see `poskit.available_encodings()`)."""
    encoding_options: dict = field(default_factory=dict)
    """Keyword options for `poskit.build_encoding` (e.g. {"base": 10000} or {"delta_init": "uniform"})."""
    dropout: float = 0.0
    """Dropout on the embeddings and on each residual branch (attention weights are not dropped)."""
    tie_embeddings: bool = False
    """Share the token embedding matrix with the output head."""
    bias: bool = False
    """Biases in the linear layers (the PoPE paper's models use none)."""
    norm_eps: float = 1e-6
    """Epsilon of RMSNorm."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights; output projections are scaled by 1/sqrt(2 n_layers)."""
    causal: bool = True
    """True: decoder (each token sees the tokens before it). False: bidirectional encoder (BERT-style, every
    token sees every real token), e.g. for masked-language modelling; it cannot use a KV cache or generate."""
    attention: str = "softmax"
    """"softmax" (poskit.attention) or "linear": causal linear attention with elu(x) + 1 features and the encoding
    applied after the feature map (RoFormer eq. 19; linear_attention in attention/linear.py). Linear needs an encoding
    that declares a linear_form (rope family, pope, none, absolute); no KV cache (generate with use_cache=False)."""
    layer_encodings: list[str] | None = None
    """The encoding inside each attention layer, where layers differ (Llama 4's layers without position, Gemma's
    local and global RoPE bases): encoding specs ("rope:base=10000", "none"), one per layer, or a shorter pattern
    repeated over the layers (layer i takes entry i % len, as HF's no_rope_layer_interval and
    sliding_window_pattern count); "*" is the model's own encoding (`encoding` with `encoding_options`). None:
    every layer uses the model's encoding (or the pattern that encoding declares, as irope does). E.g.
    ["*", "*", "*", "none"]: no position on every 4th layer."""

    def __post_init__(self):
        check_field_types(self)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "a positive int", getattr(self, name))
        if self.mlp not in MLP_KINDS:
            raise ConfigError("mlp", f"one of {list(MLP_KINDS)}", self.mlp)
        self.encoding_options = self.encoding_spec.options  # checked and typed (bool words become bools)
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ConfigError("d_model", f"divisible by n_heads={self.n_heads} (or set head_dim)", self.d_model)
        elif self.head_dim < 1:
            raise ConfigError("head_dim", "a positive int or null", self.head_dim)
        kv = self.kv_heads
        if kv < 1 or self.n_heads % kv:
            allowed = [d for d in range(1, self.n_heads + 1) if self.n_heads % d == 0]
            raise ConfigError("n_kv_heads", f"one of {allowed} (divisors of n_heads={self.n_heads}) or null",
                              self.n_kv_heads)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", "in [0, 1)", self.dropout)
        if not self.mlp_ratio > 0:
            raise ConfigError("mlp_ratio", "> 0", self.mlp_ratio)
        if not self.norm_eps > 0:
            raise ConfigError("norm_eps", "> 0", self.norm_eps)
        if not self.init_std > 0:
            raise ConfigError("init_std", "> 0", self.init_std)
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError("attention", f"one of {list(ATTENTION_KINDS)}", self.attention)
        _check_layer_encodings(self)
        if self.attention == "linear":
            _check_linear_forms(self)

    @property
    def encoding_spec(self) -> EncodingSpec:
        """The encoding and its options as one EncodingSpec; a bad one is a ConfigError naming the field."""
        return EncodingSpec.from_config(self.encoding, self.encoding_options, fields=("encoding", "encoding_options"))

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return from_known_fields(cls, d, "model config")


def decoder_mlp(cfg: ModelConfig) -> MLP:
    """The decoder's MLP: hidden width int(mlp_ratio * d_model); SwiGLU keeps 2/3 of it per branch (as in
    Llama), the same parameter count as the GELU MLP."""
    hidden = int(cfg.mlp_ratio * cfg.d_model)
    if cfg.mlp == "swiglu":
        hidden = max(1, int(2 * hidden / 3))
    return MLP(cfg.d_model, hidden, cfg.mlp, bias=cfg.bias)


def layer_schedule(cfg: ModelConfig) -> list[str] | None:
    """The per-layer pattern of `cfg`: its layer_encodings, or the one its encoding declares (`layer_pattern`,
    e.g. irope's), or None when every layer uses the model's encoding."""
    if cfg.layer_encodings is not None:
        return cfg.layer_encodings
    declared = encoding_class(cfg.encoding).layer_pattern
    return None if declared is None else declared(cfg.encoding_options)


def layer_spec(cfg: ModelConfig, layer_idx: int) -> EncodingSpec:
    """The EncodingSpec of the encoding inside attention layer `layer_idx` as the config gives it ("*" entries and
    layers without a schedule: the model's `encoding_spec`, absolute ones included; `_layer_encoding` turns those
    into "none")."""
    schedule = layer_schedule(cfg)
    entry = MODEL_ENCODING if schedule is None else schedule[layer_idx % len(schedule)]
    if entry == MODEL_ENCODING:
        return cfg.encoding_spec
    return EncodingSpec.parse(entry)


def _layer_field(cfg: ModelConfig, layer_idx: int) -> tuple[str, object]:
    """The config field that sets layer `layer_idx`'s encoding, and its value (for errors)."""
    schedule = layer_schedule(cfg)
    if schedule is None or schedule[layer_idx % len(schedule)] == MODEL_ENCODING:
        return "encoding", cfg.encoding
    n = layer_idx % len(schedule)
    return (f"layer_encodings[{n}]", schedule[n]) if cfg.layer_encodings is not None else ("encoding", cfg.encoding)


def _check_layer_encodings(cfg: ModelConfig) -> None:
    """ConfigError naming the field for a schedule that cannot be built: not a list of 1..n_layers specs, an
    unknown encoding or option, an absolute encoding inside a layer, a second pattern. Each entry is built on the
    meta device, which draws nothing from the random generator."""
    schedule, declared = cfg.layer_encodings, encoding_class(cfg.encoding).layer_pattern
    if schedule is None:  # a declared pattern counts layers as HF does: a shorter model has no layer that differs
        if declared is not None:
            declared(cfg.encoding_options)
        return
    if declared is not None:
        raise ConfigError("layer_encodings", f"null with encoding {cfg.encoding!r}, which declares its own layer "
                          "pattern (give one of the two)", schedule)
    if not 1 <= len(schedule) <= cfg.n_layers:
        raise ConfigError("layer_encodings", f"a list of 1 to n_layers={cfg.n_layers} encoding specs (one per layer, "
                          "or a pattern repeated over the layers), or null", schedule)
    for i, text in enumerate(schedule):
        if text == MODEL_ENCODING:
            continue
        field = f"layer_encodings[{i}]"
        try:  # the one parser and error format of encoding specs, naming this entry as encoding_options are named
            spec = EncodingSpec.parse(text)
        except SpecError as e:
            raise ConfigError(field if e.option is None else f"{field}.{e.option}", e.requirement, e.value) from None
        cls = encoding_class(spec.name)
        if cls.kind == "absolute":
            raise ConfigError(field, "an encoding inside attention (an absolute encoding is added once, at the "
                              "embeddings: make it the model's `encoding`)", text)
        if cls.layer_pattern is not None:
            raise ConfigError(field, "the encoding of one layer (this one declares a pattern over layers)", text)
        try:
            with torch.device("meta"):
                spec.build(head_dim=cfg.dim_head, num_heads=cfg.n_heads, dim=cfg.d_model)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{field} {text!r}: {e}") from None


def _check_linear_forms(cfg: ModelConfig) -> None:
    """ConfigError naming the field unless every layer's encoding enters linear attention (`linear_form`)."""
    if layer_schedule(cfg) is None:  # one probe, built as before (models seeded as before draw the same numbers)
        probes = [_layer_encoding(cfg)]
    else:  # one per layer, on the meta device: they draw nothing from the random generator
        with torch.device("meta"):
            probes = [_layer_encoding(cfg, i) for i in range(cfg.n_layers)]
    for i, probe in enumerate(probes):
        if probe.linear_form is None:
            field, value = _layer_field(cfg, i)
            raise ConfigError(field, "an encoding that declares a linear_form with attention='linear' (rope family "
                              "but rope-dynamic, pope with softplus, none, absolute ones)", value)


def _layer_encoding(cfg: ModelConfig, layer_idx: int = 0):
    """The encoding used inside attention layer `layer_idx`: its spec (`layer_spec`), or "none" where that is the
    model's absolute encoding.

    The probe is built (not only looked up by kind) for every layer: building an encoding with trainable
    parameters draws from the random generator, and models seeded as before must initialise as before."""
    probe = layer_spec(cfg, layer_idx).build(head_dim=cfg.dim_head, num_heads=cfg.n_heads, dim=cfg.d_model)
    if probe.kind == "absolute":
        return build_encoding("none", head_dim=cfg.dim_head, num_heads=cfg.n_heads)
    return probe


def decoder_block(cfg: ModelConfig, layer_idx: int) -> Block:
    """One pre-norm block of the decoder (RMSNorm, attention, RMSNorm, MLP), parts built in this order."""
    return Block(norm1=RMSNorm(cfg.d_model, cfg.norm_eps),
                 attn=SelfAttention(cfg.d_model, cfg.n_heads, cfg.kv_heads, _layer_encoding(cfg, layer_idx),
                                    head_dim=cfg.dim_head,
                                    bias=cfg.bias, causal=cfg.causal, layer_idx=layer_idx,
                                    linear=cfg.attention == "linear"),
                 norm2=RMSNorm(cfg.d_model, cfg.norm_eps), mlp=decoder_mlp(cfg), pre_norm=True,
                 dropout=cfg.dropout, order=("norm1", "attn", "norm2", "mlp"))


class Transformer(nn.Module):
    """Decoder-only Transformer: tokens (B, T) -> logits (B, T, vocab_size).

    `model.gradient_checkpointing = True` recomputes each block's activations in the backward pass instead of
    storing them (activation checkpointing: the same gradients, less memory, one more forward per step); it acts
    in training with gradients only, never when decoding with a cache."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = cfg = config
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        enc = cfg.encoding_spec.build(head_dim=cfg.dim_head, num_heads=cfg.n_heads, dim=cfg.d_model)
        # absolute encodings live once, at the embeddings; others live inside each attention layer
        self.abs_encoding = enc if enc.kind == "absolute" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(decoder_block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        # True: each block's activations are recomputed in the backward pass instead of stored (same gradients,
        # less memory); Hugging Face's gradient_checkpointing_enable sets it too
        self.gradient_checkpointing = False

    def _init_weights(self):
        std = self.config.init_std
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                # residual-branch outputs scaled down so the stream's variance does not grow with depth (GPT-2)
                s = std / math.sqrt(2 * self.config.n_layers) if name.endswith(("o_proj", "w2")) else std
                nn.init.normal_(m.weight, std=s)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encoding_modules(self) -> list[nn.Module]:
        """The positional-encoding modules of the model (the absolute one, or one per layer)."""
        if self.abs_encoding is not None:
            return [self.abs_encoding]
        return [b.attn.encoding for b in self.blocks]

    def forward(self, tokens: torch.Tensor | None, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, attention_mask: torch.Tensor | None = None, *,
                inputs_embeds: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
        """tokens (B, T) int64 -> logits (B, T, vocab_size): the output head on `features` (same arguments)."""
        return self.head(self.features(tokens, positions, cache, attention_mask, inputs_embeds=inputs_embeds,
                                       backend=backend))

    def features(self, tokens: torch.Tensor | None, positions: torch.Tensor | None = None,
                 cache: KVCache | None = None, attention_mask: torch.Tensor | None = None, *,
                 inputs_embeds: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
        """tokens (B, T) int64 -> the final normalised hidden states (B, T, d_model), what the output head reads
        (a sequence-classification head reads them too).

        positions: (T,) or (B, T) int64; default arange(T), continuing after the cache's last position, and
        with padding counting only real tokens (a padded sequence gets the positions it has alone). A model whose
        layers take coordinates (mrope, encodings/mrope.py) also takes (1|B, T, 3) (time, height, width)
        coordinates: attention then runs at their text positions (`mrope.text_positions`: the default positions
        plus rope_deltas on a new sequence, continuing the cache's otherwise), and each token's offsets from its
        text position rotate its query and key, so that decoding after a multimodal prompt needs no positions.
        cache: a `KVCache(n_layers)` that this call appends to (incremental decoding).
        attention_mask: (B, T) 1/True = real token, 0 = padding (Hugging Face's convention), left or right
        padding alike; with a cache also (B, cached + T), whose cached part must be the one already stored.
        Pads are hidden as keys from every query (their own logits are meaningless), for every encoding.
        inputs_embeds: (B, T, d_model) vectors to use instead of the token embeddings (tokens None then); an
        absolute encoding is still added to them, at `positions`, as it is to embedded tokens.
        backend: the attention engine's backend for every layer ("auto": the fastest exact path;
        "reference": materialised scores; see poskit.attention).
        """
        batch = self.batch(tokens, positions, cache, attention_mask, inputs_embeds=inputs_embeds)
        x = self.embed(batch.inputs) if inputs_embeds is None else batch.inputs  # (B, T, d_model)
        if batch.length == 0:  # no token: empty outputs for every encoding, the cache untouched (nothing to append)
            return self.norm(x)  # (B, 0, d_model)
        if self.abs_encoding is not None:
            x = x + self.abs_encoding.embed(batch.positions).to(x.dtype)  # (1|B, T, d_model)
        x = self.drop(x)
        # coordinates (M-RoPE): each token's offsets from its text position, rotated into q and k by the layers
        extra = {} if not _are_coordinates(positions) else {
            "offsets": torch.as_tensor(positions, device=x.device).long() - batch.positions.unsqueeze(-1)}
        with undone_on_error(cache):  # a later layer failing takes the earlier layers' new tokens back out of the cache
            for block in self.blocks:
                x = run_block(self, block, x, batch.positions, cache=cache, real=batch.real, backend=backend, **extra)
        return self.norm(x)  # (B, T, d_model)

    def batch(self, tokens: torch.Tensor | None, positions: torch.Tensor | None = None,
              cache: KVCache | None = None, attention_mask: torch.Tensor | None = None, *,
              inputs_embeds: torch.Tensor | None = None) -> ModelBatch:
        """The `ModelBatch` of a call (arguments as `features`): inputs checked against this model (token ids
        in its vocabulary, embeddings of its width), the real tokens and the positions, built once."""
        if inputs_embeds is not None:
            if tokens is not None:
                raise ValueError("pass tokens or inputs_embeds, not both")
            d = self.config.d_model
            if (not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != d
                    or not inputs_embeds.is_floating_point()):
                raise ValueError(f"inputs_embeds must be a floating (B, T, {d}) tensor, got "
                                 f"{getattr(inputs_embeds, 'shape', type(inputs_embeds).__name__)}")
            inputs = inputs_embeds
        else:
            check_token_ids(tokens, "tokens", self.config.vocab_size)
            inputs = tokens
        if cache is not None and not self.config.causal:
            raise ValueError("cache: a bidirectional model (ModelConfig.causal=False) has no KV cache: every token "
                             "attends to later tokens too, so run it on the whole sequence with cache=None")
        if cache is not None and cache.num_layers != len(self.blocks):
            raise ValueError(f"cache must have num_layers={len(self.blocks)}, got {cache.num_layers}")
        if not _are_coordinates(positions):
            return build_batch(inputs, positions=positions, attention_mask=attention_mask, cache=cache)
        coordinates = self._check_coordinates(positions, inputs)
        batch = build_batch(inputs, attention_mask=attention_mask, cache=cache)  # the order of the new tokens
        if cache is not None and cache.length:  # a continuation: its text positions continue the cache's
            return batch
        return ModelBatch(batch.inputs, text_positions(coordinates, batch.positions, batch.real), batch.real)

    def _check_coordinates(self, positions, inputs: torch.Tensor) -> torch.Tensor:
        """positions (1|B, T, n) validated as the coordinates this model's layers take (ValueError otherwise)."""
        axes = {b.attn.encoding.coordinate_axes for b in self.blocks
                if b.attn.encoding.kind != "none"}
        if len(axes) != 1 or 0 in axes:
            names = sorted({b.attn.encoding.name for b in self.blocks})
            raise ValueError(f"positions of shape {tuple(positions.shape)} are coordinates, which a model takes only "
                             "when the encoding of every attention layer takes them (mrope) or is none; this model's "
                             f"layers use {names}: give (T,) or (B, T) positions")
        if self.config.attention == "linear":
            raise ValueError("positions with coordinates are not supported with attention='linear': give (T,) or "
                             "(B, T) positions")
        B, T = inputs.shape[:2]
        return as_position_tensor(positions, T, B, inputs.device, "positions", coords=axes.pop())

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Continue `prompt` (B, T0) by `max_new_tokens` tokens; returns (B, T0 + max_new_tokens).

        attention_mask: (B, T0), 1/True = real prompt token, 0 = padding (Hugging Face's convention). Left and
        right padding are both handled: each row continues from its last real token, pads are hidden and not
        counted as positions, so a padded row generates what its prompt generates alone (new tokens are
        appended after the padded prompt). Every row needs at least one real token.

        temperature 0 is greedy; otherwise tokens are sampled from softmax(logits / temperature), restricted
        to the `top_k` most likely tokens when given. With `use_cache` the prompt is encoded once and every
        new token attends to the key/value cache; without it the whole sequence is re-run at every step
        (the reference the cache is tested against).
        """
        if not self.config.causal:
            raise ValueError("generate needs a causal model: this one is bidirectional (ModelConfig.causal=False, "
                             "an encoder such as a masked-language model), whose outputs depend on tokens not yet "
                             "generated")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        if not float(temperature) >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        if prompt.dim() != 2 or prompt.shape[1] < 1:
            raise ValueError(f"prompt must be a (B, T0) tensor with T0 >= 1, got {tuple(prompt.shape)}")
        real = None
        if attention_mask is not None:
            real = real_tokens(attention_mask, prompt.shape[0], prompt.shape[1], prompt.device)
            empty = (~real.any(-1)).nonzero().flatten().tolist()
            if empty:
                raise ValueError(f"attention_mask rows {empty} have no real token: generate needs at least one "
                                 "prompt token per row to continue")
        was_training = self.training
        self.eval()
        try:
            out = prompt
            # allocated once for the whole generation: no step copies the cache
            cache = KVCache(len(self.blocks), max_length=prompt.shape[1] + max_new_tokens) if use_cache else None
            step_input, step_mask = prompt, real
            for _ in range(max_new_tokens):
                if use_cache:
                    logits = self(step_input, cache=cache, attention_mask=step_mask)
                else:
                    logits = self(out, attention_mask=real)
                nxt = self._pick(_last_real(logits, step_mask if use_cache else real).float(), temperature, top_k,
                                 generator)  # (B, 1)
                out = torch.cat((out, nxt), dim=1)
                step_input, step_mask = nxt, None  # generated tokens are real
                if real is not None:
                    real = torch.cat((real, torch.ones_like(nxt, dtype=torch.bool)), dim=1)
            return out
        finally:
            self.train(was_training)

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator) -> torch.Tensor:
        # logits (B, V) -> (B, 1) token ids
        if temperature == 0:
            return logits.argmax(-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)


def _are_coordinates(positions) -> bool:
    """Whether model positions carry a trailing coordinate axis ((1|B, T, n): M-RoPE's time, height, width)."""
    return isinstance(positions, torch.Tensor) and positions.dim() == 3


def _last_real(logits: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """(B, V): the logits at each row's last real token (the last column when there is no padding)."""
    if real is None:
        return logits[:, -1]
    index = torch.arange(real.shape[1], device=real.device).masked_fill(~real, -1).amax(-1)  # (B,)
    return logits[torch.arange(logits.shape[0], device=logits.device), index]


def check_token_ids(tokens, name: str, vocab_size: int) -> None:
    """ValueError naming `name` unless tokens is a (B, T) integer tensor of ids in [0, vocab_size)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point() \
            or tokens.is_complex() or tokens.dtype == torch.bool:
        shape = f"a {tokens.dtype} tensor of shape {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor) \
            else type(tokens).__name__
        raise ValueError(f"{name} must be a (B, T) integer tensor, got {shape}")
    if tokens.numel() and not torch.compiler.is_compiling():  # (a traced graph cannot branch on values)
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} ids must be in [0, {vocab_size - 1}] (vocab_size {vocab_size}), got ids in "
                             f"[{low}, {high}]")
