"""An encoder-decoder Transformer (Vaswani et al.'s layout) that takes any poskit encoding.

Where the positional encoding enters, by the kind the encoding declares (never by its name):

- absolute (sinusoidal, learned, legendre): vectors added to the source and the target embeddings, one
  instance per stream (a learned table is not shared between German and English positions);
- every other kind: one instance per self-attention layer, in the encoder's bidirectional self-attention and
  the decoder's causal self-attention (RoFormer, paper 002 §4.1, puts RoPE in the self-attention blocks).

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
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import poskit
from poskit.encodings.base import encoding_class
from poskit.attention.kv_cache import KVCache
from poskit.attention.padding import padded_positions, real_token_mask
from poskit.config_check import ConfigError, check_field_types, from_known_fields
from poskit.nn import Attention as SelfAttention

NORMS = ("post", "pre")
CROSS_POSITIONS = ("none", "aligned")


@dataclass
class EncoderDecoderConfig:
    """Every knob of `EncoderDecoder`. Defaults: a small CPU-scale model (the papers' base model is
    d_model 512, 8 heads, d_ff 2048, 6 + 6 layers, dropout 0.1: `paper_base()`)."""

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
        if self.encoding not in poskit.available_encodings():
            raise ConfigError("encoding", f"one of {poskit.available_encodings()}", self.encoding)
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
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderDecoderConfig":
        return from_known_fields(cls, d, "encoder-decoder config")


def paper_base(**changes) -> EncoderDecoderConfig:
    """The Transformer-base of papers 002 and 003 (Vaswani et al.): d_model 512, 8 heads, d_ff 2048, 6 + 6."""
    base = dict(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1)
    return EncoderDecoderConfig(**{**base, **changes})


def _build(cfg: EncoderDecoderConfig):
    return poskit.build_encoding(cfg.encoding, head_dim=cfg.head_dim, num_heads=cfg.n_heads, dim=cfg.d_model,
                                 **cfg.encoding_options)


class FeedForward(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


class CrossAttention(nn.Module):
    """Target queries over the encoder's output. `encoding` is "none" unless cross_attention_positions is
    "aligned"; the memory's keys and values are projected once per source (`memory_kv`) and reused by every
    decoding step."""

    def __init__(self, cfg: EncoderDecoderConfig, encoding):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.encoding = encoding

    def _heads(self, x):  # (B, T, d_model) -> (B, H, T, head_dim)
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def memory_kv(self, memory):
        return self._heads(self.k_proj(memory)), self._heads(self.v_proj(memory))

    def forward(self, x, kv, src_keep, tgt_positions, src_positions):
        # x (B, Tt, d); kv: keys and values (B, H, Ts, hd); src_keep (B, Ts) bool, True = real source token
        B, T, _ = x.shape
        k, v = kv
        out = poskit.attention(self._heads(self.q_proj(x)), k, v, self.encoding, attn_mask=src_keep[:, None, None, :],
                               q_positions=tgt_positions, k_positions=src_positions)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class _Residual(nn.Module):
    """One sub-layer with its residual sum and LayerNorm, post-norm or pre-norm."""

    def __init__(self, cfg: EncoderDecoderConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.pre = cfg.norm == "pre"

    def forward(self, x, branch):
        if self.pre:
            return x + self.drop(branch(self.norm(x)))
        return self.norm(x + self.drop(branch(x)))


def _layer_encoding(cfg: EncoderDecoderConfig, probe):
    # absolute encodings are in the embeddings: attention layers then use none
    if probe.kind == "absolute":
        return "none", {}
    return cfg.encoding, dict(cfg.encoding_options)


class EncoderBlock(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig, probe):
        super().__init__()
        name, options = _layer_encoding(cfg, probe)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, encoding=name, bias=True, **options)
        self.ff = FeedForward(cfg)
        self.res1, self.res2 = _Residual(cfg), _Residual(cfg)

    def forward(self, x, positions, keep):
        x = self.res1(x, lambda h: self.attn(h, positions=positions, attention_mask=keep))
        return self.res2(x, self.ff)


class DecoderBlock(nn.Module):
    def __init__(self, cfg: EncoderDecoderConfig, probe, layer_idx: int):
        super().__init__()
        name, options = _layer_encoding(cfg, probe)
        self.layer_idx = layer_idx
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, encoding=name, bias=True, **options)
        cross = (poskit.build_encoding(name, head_dim=cfg.head_dim, num_heads=cfg.n_heads, **options)
                 if cfg.cross_attention_positions == "aligned" else
                 poskit.build_encoding("none", head_dim=cfg.head_dim, num_heads=cfg.n_heads))
        self.cross_attn = CrossAttention(cfg, cross)
        self.ff = FeedForward(cfg)
        self.res1, self.res2, self.res3 = _Residual(cfg), _Residual(cfg), _Residual(cfg)

    def forward(self, y, positions, keep, memory_kv, src_keep, src_positions, cache):
        y = self.res1(y, lambda h: self.self_attn(h, is_causal=True, positions=positions, attention_mask=keep,
                                                  cache=cache, layer_idx=self.layer_idx))
        y = self.res2(y, lambda h: self.cross_attn(h, memory_kv, src_keep, positions, src_positions))
        return self.res3(y, self.ff)


class Memory:
    """The encoded source of one batch: the encoder output, its padding and positions, and every decoder
    layer's cross-attention keys and values (computed once, reused at each decoding step)."""

    def __init__(self, output, keep, positions, kv):
        self.output, self.keep, self.positions, self.kv = output, keep, positions, kv

    def select(self, index: torch.Tensor) -> "Memory":
        """The rows `index` (B',) of the batch, e.g. each source repeated once per beam."""
        pos = self.positions if self.positions.shape[0] == 1 else self.positions.index_select(0, index)
        return Memory(self.output.index_select(0, index), self.keep.index_select(0, index), pos,
                      [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.kv])


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
        self.encoder = nn.ModuleList(EncoderBlock(cfg, probe) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderBlock(cfg, probe, i) for i in range(cfg.n_decoder_layers))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if pre else nn.Identity()
        self.out_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_output:
            self.out_proj.weight = self.tgt_embed.weight

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

    @staticmethod
    def _check_tokens(tokens, name: str, vocab: int):
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point \
                or tokens.dtype == torch.bool:
            raise ValueError(f"{name} must be a (B, T) integer tensor, got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(f"{name} ids must be in [0, {vocab - 1}], got ids in [{int(tokens.min())}, "
                             f"{int(tokens.max())}]")

    @staticmethod
    def _mask(mask, tokens, name: str) -> torch.Tensor:
        B, T = tokens.shape
        if mask is None:
            return torch.ones(B, T, dtype=torch.bool, device=tokens.device)
        try:
            return real_token_mask(mask, B, T, tokens.device)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> Memory:
        """Run the encoder once: src (B, Ts) ids, src_mask (B, Ts) 1/True = real token (default: all real)."""
        self._check_tokens(src, "src", self.config.src_vocab_size)
        keep = self._mask(src_mask, src, "src_mask")
        empty = (~keep.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"src_mask rows {empty} have no real token: every source needs at least one")
        positions = padded_positions(keep)  # (B, Ts): a padded source gets the positions it has alone
        x = self._embed(self.src_embed, self.src_abs, src, positions)
        for block in self.encoder:
            x = block(x, positions, keep)
        out = self.enc_norm(x)
        return Memory(out, keep, positions, [b.cross_attn.memory_kv(out) for b in self.decoder])

    def decode(self, tgt: torch.Tensor, memory: Memory, tgt_mask: torch.Tensor | None = None,
               positions: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """Decoder logits (B, Tt, V) for target inputs tgt (B, Tt) given an encoded source. With `cache`
        (a KVCache(n_decoder_layers)) the new tokens are appended to it: incremental decoding, equal to
        running the whole prefix. positions default: counting real tokens only, after the cached ones."""
        self._check_tokens(tgt, "tgt", self.config.tgt_vocab_size)
        if tgt.shape[0] != memory.output.shape[0]:
            raise ValueError(f"tgt must have the memory's batch size {memory.output.shape[0]}, got {tgt.shape[0]}")
        if cache is not None and cache.num_layers != len(self.decoder):
            raise ValueError(f"cache must have num_layers={len(self.decoder)}, got {cache.num_layers}")
        keep = None if tgt_mask is None else self._mask(tgt_mask, tgt, "tgt_mask")
        if positions is None:
            if cache is not None and cache.length:
                start = cache.next_positions()
                real = keep if keep is not None else torch.ones_like(tgt, dtype=torch.bool)
                positions = padded_positions(real, start)
            else:
                positions = padded_positions(keep) if keep is not None else torch.arange(tgt.shape[1],
                                                                                         device=tgt.device)[None]
        positions = torch.as_tensor(positions, device=tgt.device).long()
        positions = positions[None] if positions.dim() == 1 else positions
        y = self._embed(self.tgt_embed, self.tgt_abs, tgt, positions)
        for block in self.decoder:
            y = block(y, positions, keep, memory.kv[block.layer_idx], memory.keep, memory.positions, cache)
        return self.out_proj(self.dec_norm(y))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None) -> torch.Tensor:
        """Teacher-forced logits (B, Tt, tgt_vocab_size): `tgt` is the target input (BOS + target[:-1])."""
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask)

    def encoding_modules(self) -> list[nn.Module]:
        """The positional-encoding modules (absolute: one per stream; otherwise one per attention layer)."""
        mods = [m for m in (self.src_abs, self.tgt_abs) if m is not None]
        mods += [b.attn.encoding for b in self.encoder]
        mods += [m for b in self.decoder for m in (b.self_attn.encoding, b.cross_attn.encoding)]
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
