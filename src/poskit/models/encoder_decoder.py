"""An encoder-decoder Transformer (Vaswani et al.'s layout) that takes any poskit encoding.

Where the positional encoding enters, by the kind the encoding declares (never by its name):

- absolute (sinusoidal, learned, legendre): vectors added to the source and the target embeddings, one
  instance per stream (a learned table is not shared between German and English positions);
- every other kind: one instance per self-attention layer, in the encoder's bidirectional self-attention and
  the decoder's causal self-attention (RoFormer, Su et al., §4.1, puts RoPE in the self-attention blocks).

Cross-attention (decoder queries over encoder keys) carries no positional encoding by default
(`cross_attention_positions="none"`): the two streams are different sequences, and with an absolute encoding
their positions already reach it through both streams. `"aligned"` instead applies the layer's encoding in
cross-attention with the target position as the query position and the source position as the key position,
as if both sequences started at 0 on one axis (RoPE then sees t - s: a diagonal prior for languages with
similar word order). It is refused for absolute encodings (they are in the embeddings already) and for
contextual ones (CoPE counts gated keys up to the query within one sequence, which has no meaning across
two).

Layout: embeddings scaled by sqrt(d_model), post-norm blocks (LayerNorm after each residual sum, as in both
papers) or pre-norm (`norm="pre"`, with a final LayerNorm per stack), ReLU feed-forward, dropout on the
embeddings and each residual branch, the decoder embedding tied to the output projection by default.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from poskit.encodings.base import encoding_class
from poskit.encodings import build_encoding
from poskit.encodings.spec import EncodingSpec
from poskit.attention.kv_cache import KVCache, undone_on_error
from poskit.util.config_check import ConfigError, check_field_types, from_known_fields

from .attention import Attention
from .batch import ModelBatch, as_batch_positions, positions_for, real_tokens
from .block import MLP, Block, Context, SelfAttention, run_block
from .decoder import check_token_ids

NORMS = ("post", "pre")
CROSS_POSITIONS = ("none", "aligned")


@dataclass
class EncoderDecoderConfig:
    """Every knob of `EncoderDecoder`. Defaults: a small CPU-scale model (Vaswani et al.'s base model is
    d_model 512, 8 heads, d_ff 2048, 6 + 6 layers, dropout 0.1)."""

    src_vocab_size: int = 8000
    """Source token ids (padding id 0 included)."""
    tgt_vocab_size: int = 8000
    """Target token ids (padding id 0 included)."""
    d_model: int = 128
    """Width of the residual streams."""
    n_heads: int = 4
    """Heads of every attention layer."""
    n_encoder_layers: int = 2
    """Encoder blocks."""
    n_decoder_layers: int = 2
    """Decoder blocks."""
    d_ff: int = 512
    """Hidden width of the ReLU feed-forward layers."""
    dropout: float = 0.1
    """Dropout on the embeddings and on every residual branch (no attention-weight dropout: poskit has none)."""
    encoding: str = "sinusoidal"
    """Positional encoding name (see `poskit.available_encodings()`)."""
    encoding_options: dict = field(default_factory=dict)
    """Keyword options for `poskit.build_encoding`."""
    cross_attention_positions: str = "none"
    """"none": no positional encoding in cross-attention; "aligned": the self-attention encoding with target
    positions for queries and source positions for keys (not for absolute or contextual encodings)."""
    norm: str = "post"
    """"post" (LayerNorm after each residual sum, Vaswani et al.) or "pre" (before each branch)."""
    share_embeddings: bool = False
    """One embedding matrix for source and target (a joint vocabulary: the two vocab sizes must be equal)."""
    tie_output: bool = True
    """Use the target embedding matrix as the output projection (Vaswani et al. share it)."""
    norm_eps: float = 1e-5
    """Epsilon of LayerNorm."""

    def __post_init__(self):
        check_field_types(self)
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_encoder_layers",
                     "n_decoder_layers", "d_ff"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "a positive int", getattr(self, name))
        if self.d_model % self.n_heads:
            raise ConfigError("d_model", f"divisible by n_heads={self.n_heads}", self.d_model)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", "in [0, 1)", self.dropout)
        if self.norm not in NORMS:
            raise ConfigError("norm", f"one of {list(NORMS)}", self.norm)
        if self.cross_attention_positions not in CROSS_POSITIONS:
            raise ConfigError("cross_attention_positions", f"one of {list(CROSS_POSITIONS)}",
                              self.cross_attention_positions)
        self.encoding_options = self.encoding_spec.options  # checked and typed (bool words become bools)
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("share_embeddings", f"false unless src_vocab_size == tgt_vocab_size (got "
                              f"{self.src_vocab_size} and {self.tgt_vocab_size})", self.share_embeddings)
        if not self.norm_eps > 0:
            raise ConfigError("norm_eps", "> 0", self.norm_eps)
        kind = encoding_class(self.encoding).kind
        if self.cross_attention_positions == "aligned" and kind in ("absolute", "contextual"):
            why = ("it already reaches cross-attention through both streams' embeddings" if kind == "absolute" else
                   "a contextual encoding counts gated keys up to the query within one sequence, which is not "
                   "defined across the source and the target")
            raise ConfigError("cross_attention_positions", f"'none' for the {kind} encoding {self.encoding!r} ({why})",
                              self.cross_attention_positions)

    @property
    def encoding_spec(self) -> EncodingSpec:
        """The encoding and its options as one EncodingSpec; a bad one is a ConfigError naming the field."""
        return EncodingSpec.from_config(self.encoding, self.encoding_options, fields=("encoding", "encoding_options"))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderDecoderConfig":
        return from_known_fields(cls, d, "encoder-decoder config")


def _build(cfg: EncoderDecoderConfig):
    return cfg.encoding_spec.build(head_dim=cfg.head_dim, num_heads=cfg.n_heads, dim=cfg.d_model)


def _layer_encoding(cfg: EncoderDecoderConfig, probe) -> EncodingSpec:
    # absolute encodings are in the embeddings: attention layers then use none
    if probe.kind == "absolute":
        return EncodingSpec("none")
    return cfg.encoding_spec


def _norm(cfg: EncoderDecoderConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


def encoder_block(cfg: EncoderDecoderConfig, probe) -> Block:
    """Bidirectional self-attention and a ReLU feed-forward, post- or pre-norm (parts registered in the order
    of the checkpoints written before: attention, feed-forward, then the norms)."""
    spec = _layer_encoding(cfg, probe)
    return Block(attn=SelfAttention(cfg.d_model, cfg.n_heads, encoding=spec.name, bias=True, causal=False,
                                    **spec.options),
                 mlp=MLP(cfg.d_model, cfg.d_ff, "relu", bias=True), norm1=_norm(cfg), norm2=_norm(cfg),
                 pre_norm=cfg.norm == "pre", dropout=cfg.dropout, order=("attn", "mlp", "norm1", "norm2"))


def decoder_block(cfg: EncoderDecoderConfig, probe, layer_idx: int) -> Block:
    """Causal self-attention (at `layer_idx` of the decoding cache), cross-attention over the encoder's output
    (positions only with cross_attention_positions "aligned"), a ReLU feed-forward."""
    spec = _layer_encoding(cfg, probe)
    self_attn = SelfAttention(cfg.d_model, cfg.n_heads, encoding=spec.name, bias=True, causal=True,
                              layer_idx=layer_idx, **spec.options)
    cross = (spec.build(head_dim=cfg.head_dim, num_heads=cfg.n_heads)
             if cfg.cross_attention_positions == "aligned" else
             build_encoding("none", head_dim=cfg.head_dim, num_heads=cfg.n_heads))
    return Block(attn=self_attn, cross_attn=Attention(cfg.d_model, cfg.n_heads, encoding=cross, bias=True),
                 mlp=MLP(cfg.d_model, cfg.d_ff, "relu", bias=True), norm1=_norm(cfg), norm_cross=_norm(cfg),
                 norm2=_norm(cfg), pre_norm=cfg.norm == "pre", dropout=cfg.dropout,
                 order=("attn", "cross_attn", "mlp", "norm1", "norm_cross", "norm2"))


# state-dict names of the blocks before they shared poskit.models.block.Block: old -> new, within a block
_RENAMED = {
    "encoder": (("res1.norm.", "norm1."), ("res2.norm.", "norm2."), ("ff.", "mlp.")),
    "decoder": (("self_attn.", "attn."), ("res1.norm.", "norm1."), ("res2.norm.", "norm_cross."),
                ("res3.norm.", "norm2."), ("ff.", "mlp.")),
}


def _rename_old_keys(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: weights saved under the blocks' earlier names load into today's."""
    pattern = re.compile(rf"^{re.escape(prefix)}(encoder|decoder)\.(\d+)\.(.*)$")
    for key in list(state_dict):
        m = pattern.match(key)
        if not m:
            continue
        stack, index, rest = m.groups()
        for old, new in _RENAMED[stack]:
            if rest.startswith(old):
                state_dict[f"{prefix}{stack}.{index}.{new}{rest[len(old):]}"] = state_dict.pop(key)
                break


class Memory:
    """The encoded source of one batch: the encoder output, its padding and positions, and every decoder
    layer's cross-attention keys and values (computed once, reused at each decoding step)."""

    def __init__(self, output, keep, positions, kv):
        self.output, self.keep, self.positions, self.kv = output, keep, positions, kv

    def select(self, index: torch.Tensor) -> "Memory":
        """The rows `index` (B',) of the batch, e.g. each source repeated once per beam."""
        pos = self.positions if self.positions.shape[0] == 1 else self.positions.index_select(0, index)
        return Memory(self.output.index_select(0, index), self.keep.index_select(0, index), pos,
                      [tuple(t.index_select(0, index) for t in kv) for kv in self.kv])


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer: (source (B, Ts), target input (B, Tt)) -> logits (B, Tt, tgt_vocab_size).

    Token id 0 is padding by convention of poskit's vocabularies, but padding is given explicitly by masks
    (Hugging Face's convention: 1/True = real token): `src_mask` (B, Ts), `tgt_mask` (B, Tt); left or right
    padding alike, pads are hidden as keys and not counted as positions.
    """

    def __init__(self, config: EncoderDecoderConfig):
        super().__init__()
        if not isinstance(config, EncoderDecoderConfig):
            raise ValueError(f"config must be an EncoderDecoderConfig, got {type(config).__name__}")
        self.config = cfg = config
        probe = _build(cfg)
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, cfg.d_model)
        self.src_abs = probe if probe.kind == "absolute" else None
        self.tgt_abs = _build(cfg) if probe.kind == "absolute" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(encoder_block(cfg, probe) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(decoder_block(cfg, probe, i) for i in range(cfg.n_decoder_layers))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if pre else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_output:
            self.out_proj.weight = self.tgt_embed.weight
        self.gradient_checkpointing = False  # True: blocks recompute their activations in backward (block.run_block)
        self.register_load_state_dict_pre_hook(_rename_old_keys)

    def _init_weights(self):
        # fairseq's Transformer initialisation: Xavier-uniform projections, N(0, d^-1/2) embeddings (which the
        # sqrt(d_model) scale brings back to unit variance)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=self.config.d_model ** -0.5)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- pieces --------------------------------------------------------------------------------------------
    def _embed(self, table, abs_enc, tokens, positions):
        x = table(tokens) * math.sqrt(self.config.d_model)
        if abs_enc is not None:
            x = x + abs_enc.embed(positions).to(x.dtype)
        return self.drop(x)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> Memory:
        """Run the encoder once: src (B, Ts) ids, src_mask (B, Ts) 1/True = real token (default: all real)."""
        check_token_ids(src, "src", self.config.src_vocab_size)
        B, T = src.shape
        keep = real_tokens(src_mask, B, T, src.device, name="src_mask")
        if keep is None:  # cross-attention reads the source's padding at every decoding step: kept explicit
            keep = torch.ones(B, T, dtype=torch.bool, device=src.device)
        empty = (~keep.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"src_mask rows {empty} have no real token: every source needs at least one")
        # a padded source gets the positions it has alone
        batch = ModelBatch(src, positions_for(T, src.device, real=keep), keep)
        x = self._embed(self.src_embed, self.src_abs, src, batch.positions)
        for block in self.encoder:
            x = run_block(self, block, x, batch.positions, real=batch.real)
        out = self.enc_norm(x)
        return Memory(out, batch.real, batch.positions, [b.cross_attn.project_kv(out) for b in self.decoder])

    def decode(self, tgt: torch.Tensor, memory: Memory, tgt_mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """Decoder logits (B, Tt, V) for target inputs tgt (B, Tt) given an encoded source. With `cache`
        (a KVCache(n_decoder_layers)) the new tokens are appended to it: incremental decoding, equal to
        running the whole prefix. positions default: counting real tokens only, after the cached ones."""
        check_token_ids(tgt, "tgt", self.config.tgt_vocab_size)
        if not isinstance(memory, Memory):
            raise ValueError(f"memory must be the Memory that encode() returns, got {type(memory).__name__}")
        if tgt.shape[0] != memory.output.shape[0]:
            raise ValueError(f"tgt must have the memory's batch size {memory.output.shape[0]}, got {tgt.shape[0]}")
        if memory.output.shape[-1] != self.config.d_model or len(memory.kv) != len(self.decoder):
            raise ValueError(f"memory must come from an encoder of this model (d_model {self.config.d_model}, "
                             f"{len(self.decoder)} decoder layers), got width {memory.output.shape[-1]} and "
                             f"{len(memory.kv)} layers of keys")
        if cache is not None and cache.num_layers != len(self.decoder):
            raise ValueError(f"cache must have num_layers={len(self.decoder)}, got {cache.num_layers}")
        B, T = tgt.shape
        keep = real_tokens(tgt_mask, B, T, tgt.device, name="tgt_mask")
        if positions is None:
            positions = positions_for(T, tgt.device, real=keep, cache=cache)
        batch = ModelBatch(tgt, as_batch_positions(positions, B, T, tgt.device), keep)
        y = self._embed(self.tgt_embed, self.tgt_abs, tgt, batch.positions)
        with undone_on_error(cache):  # a later layer failing takes the earlier layers' new tokens back out
            for i, block in enumerate(self.decoder):
                context = Context(memory.kv[i], memory.positions, memory.keep)
                y = run_block(self, block, y, batch.positions, cache=cache, real=batch.real, context=context)
        return self.out_proj(self.dec_norm(y))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None) -> torch.Tensor:
        """Teacher-forced logits (B, Tt, tgt_vocab_size): `tgt` is the target input (BOS + target[:-1])."""
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask)

    def encoding_modules(self) -> list[nn.Module]:
        """The positional-encoding modules (absolute: one per stream; otherwise one per attention layer)."""
        mods = [m for m in (self.src_abs, self.tgt_abs) if m is not None]
        mods += [b.attn.encoding for b in self.encoder]
        mods += [m for b in self.decoder for m in (b.attn.encoding, b.cross_attn.encoding)]
        return mods

    # -- decoding ------------------------------------------------------------------------------------------
    def decoder_state(self, src: torch.Tensor, src_mask: torch.Tensor | None = None,
                      use_cache: bool = True) -> "DecoderState":
        """An incremental scorer over `src` for poskit.beam (greedy_search, beam_search)."""
        return DecoderState(self, self.encode(src, src_mask), use_cache)

    @torch.no_grad()
    def translate(self, src: torch.Tensor, src_mask: torch.Tensor | None = None, *, bos: int, eos: int,
                  max_len: int, beam_size: int = 4, length_penalty: float = 0.6,
                  use_cache: bool = True) -> list[list[int]]:
        """Decode every source row: beam search (beam_size > 1) or greedy (beam_size 1); token lists without
        BOS and EOS. use_cache=False re-runs the decoder on the whole prefix at every step (the reference the
        cache is tested against)."""
        from .beam import beam_search, greedy_search

        was_training = self.training
        self.eval()
        try:
            state = self.decoder_state(src, src_mask, use_cache)
            if beam_size == 1:
                return greedy_search(state, src.shape[0], bos=bos, eos=eos, max_len=max_len)
            return beam_search(state, src.shape[0], bos=bos, eos=eos, max_len=max_len, beam_size=beam_size,
                               length_penalty=length_penalty)
        finally:
            self.train(was_training)


class DecoderState:
    """The decoder's incremental scorer (poskit.beam's protocol): the encoded source, and either a KV cache
    of the target prefix (use_cache) or the prefix itself, re-run in full at every step."""

    def __init__(self, model: EncoderDecoder, memory: Memory, use_cache: bool):
        self.model, self.memory = model, memory
        self.cache = KVCache(len(model.decoder)) if use_cache else None
        self.prefix = None

    def log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(self.memory.output.device)
        if self.cache is not None:
            logits = self.model.decode(tokens, self.memory, cache=self.cache)
        else:
            self.prefix = tokens if self.prefix is None else torch.cat((self.prefix, tokens), 1)
            logits = self.model.decode(self.prefix, self.memory)
        return torch.log_softmax(logits[:, -1].float(), -1)

    def select(self, index: torch.Tensor) -> None:
        index = index.to(self.memory.output.device)
        self.memory = self.memory.select(index)
        if self.cache is not None and self.cache.length:
            self.cache.select_batch(index)
        elif self.prefix is not None:
            self.prefix = self.prefix.index_select(0, index)
