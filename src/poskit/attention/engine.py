"""`poskit.attention`: picks the fastest exact path for the encoding and the input.

backend="reference": materialised logits (attention/reference.py), every encoding, any dtype.
backend="sdpa":      F.scaled_dot_product_attention on encoded q/k (none, absolute, rope family, pope)
                     or with an additive float mask (alibi, relative, cope-alibi is contextual: not served).
backend="triton":    the fused kernel an encoding declares (`fused_kernel`: pope, cope) on CUDA tensors.
backend="auto":      triton for encodings with a fused kernel on CUDA when triton is importable, else sdpa
                     where it serves the encoding, else the reference. Triton is never chosen on CPU.
                     On CPU, contextual encodings whose fused kernel has a blocked counterpart (cope) take
                     attention/blocked_cope.py instead of the reference ("blocked-contextual").
On CPU the sdpa backend never builds a T x T bias: a static bias (alibi) runs through attention/blocked.py,
a learned one (relative) through attention/blocked_bias.py ("blocked-bias"), both generated per query block.
With POSKIT_CPU_KERNEL=1, fp32 q/k wider than v (qk_width > 1, PoPE) with more than one query on CPU run the
compiled tiled kernel of attention/cpu_flash.py ("cpu-flash") when it builds, instead of padded SDPA or the blocked path.

Every choice here reads the encoding's declared capabilities (`kind`, `qk_width`, `cache_form`,
`fused_kernel`, `needs_gate_keys`: encodings/base.py), never its name.
"""
from __future__ import annotations

import functools

import torch

from ..encodings.base import PositionalEncoding, encoding_class, registered_names
from .inputs import AttentionInputs, prepare, refuse_renamed
from .padding import real_token_mask
from .reference import scores_from_inputs, softmax_rows
from .inputs import repeat_kv
from . import cpu_flash
from .sdpa import all_finite, blocked, sdpa, use_blocked
from .traced import traced_sdpa

BACKENDS = ("auto", "reference", "sdpa", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _is_static_bias(enc) -> bool:
    # a bias of positions alone (ALiBi) can be built once per shape and reused; one that reads q (relative PE,
    # even with frozen embeddings) cannot: a cache keyed by positions would hand a later call a stale bias
    return (enc.kind == "bias" and not enc.bias_reads_q
            and not any(p.requires_grad for p in enc.parameters()))


def _static_bias(enc, inp: AttentionInputs) -> torch.Tensor:
    cache = enc.__dict__.setdefault("_bias_cache", {})
    key = (inp.q_positions.shape, inp.k_positions.shape, inp.q.device, inp.q.dtype)
    entry = cache.get(key)
    if entry is not None and torch.equal(entry[0], inp.q_positions) and torch.equal(entry[1], inp.k_positions):
        return entry[2]
    bias = enc.bias(inp.q, inp.q_positions, inp.k_positions, inp.scale)
    if len(cache) > 8:
        cache.clear()
    cache[key] = (inp.q_positions, inp.k_positions, bias)
    return bias


def sdpa_serves(enc: PositionalEncoding) -> bool:
    return enc.kind in ("none", "absolute", "qk", "bias")


def triton_serves(enc: PositionalEncoding) -> bool:
    # the kernels compute angles from scalar positions: an axial encoding (position_coords > 0) is routed to
    # the sdpa/blocked paths, which call its encode_q / encode_k
    return enc.fused_kernel in _TRITON_RUNNERS and enc.position_coords == 0


def _run_reference(inp, enc, gate_keys):
    logits, visible = scores_from_inputs(inp, enc, gate_keys)
    return softmax_rows(logits, visible).to(inp.v.dtype) @ repeat_kv(inp.v, inp.groups)


def _is_learned_bias_on_cpu(enc, q) -> bool:
    return enc.kind == "bias" and not _is_static_bias(enc) and q.device.type == "cpu"


def _run_blocked_bias(inp, enc):
    from .blocked_bias import blocked_bias_attention

    return blocked_bias_attention(inp.q, inp.k, inp.v, enc, scale=inp.scale, q_positions=inp.q_positions,
                                  k_positions=inp.k_positions, causal=inp.causal,
                                  key_padding_mask=inp.key_padding_mask)


def _run_blocked_cope(inp, enc, gate_keys):
    from .blocked_cope import blocked_cope_attention

    source = enc.gate_source(inp.k, inp.v, gate_keys)
    pos_emb, slopes = enc.fused_operands()
    return blocked_cope_attention(
        inp.q, inp.k, inp.v, scale=inp.scale, q_positions=inp.q_positions, k_positions=inp.k_positions,
        causal=inp.causal, p_max=enc.p_max, pos_emb=pos_emb, slopes=slopes,
        gate_keys=None if source is inp.k else source, key_padding_mask=inp.key_padding_mask)


# `fused_kernel` declared by a contextual encoding -> its exact blocked CPU counterpart, which reads the same
# declared operands (p_max, gate_source, fused_operands)
_BLOCKED_CONTEXTUAL = {"triton_cope": _run_blocked_cope}


def _run_blocked_contextual(inp, enc, gate_keys):
    return _BLOCKED_CONTEXTUAL[enc.fused_kernel](inp, enc, gate_keys)


def _run_sdpa(inp, enc, gate_keys):
    if gate_keys is not None:  # sdpa serves no contextual encoding, so none that takes gate keys
        raise ValueError("gate_keys is only accepted by contextual encodings (cope, cope-alibi) with gates='separate'")
    if torch.compiler.is_compiling():  # no data-dependent path choice: traced.py says why
        return traced_sdpa(inp, enc)
    if enc.kind == "qk":
        if cpu_flash.serves(inp, enc):  # opt-in compiled kernel (POSKIT_CPU_KERNEL=1): fp32 on CPU, any length
            return _run_cpu_flash(inp, enc)
        if use_blocked(inp, enc):  # the attention scale rides on the encoded query for free
            q = enc.encode_q(inp.q, inp.q_positions, scale=inp.scale)
            return blocked(inp, q, enc.encode_k(inp.k, inp.k_positions), inp.v, prescaled=True)
        q, k = enc.transform_qk(inp.q, inp.k, inp.q_positions, inp.k_positions)
        return sdpa(inp, q, k, inp.v)
    if enc.kind == "bias" and inp.q.device.type == "cpu" and inp.attn_mask is None:
        # (a general attn_mask goes to SDPA with the mask merged into the bias, below)
        from .blocked_bias import check_positions_by_block

        check_positions_by_block(enc, inp)  # no (Tq, Tk) visibility mask on the CPU paths
        if _is_learned_bias_on_cpu(enc, inp.q):  # the bias and its gradient per query block, never T x T
            return _run_blocked_bias(inp, enc)
        if _is_static_bias(enc):
            # generate the constant bias block by block instead of a T x T float mask (which slows CPU SDPA ~1.7x)
            q, qp, kp = inp.q, inp.q_positions, inp.k_positions
            return blocked(inp, q, inp.k, inp.v,
                           bias_fn=lambda i, j, ke: enc.bias(q[:, :, i:j], qp[:, i:j], kp[:, :ke], inp.scale))
    if enc.kind == "bias":
        enc.check_positions(inp.q_positions, inp.k_positions, inp.visible())
        bias = _static_bias(enc, inp) if _is_static_bias(enc) else enc.bias(inp.q, inp.q_positions, inp.k_positions, inp.scale)
        return sdpa(inp, inp.q, inp.k, inp.v, bias=bias)
    return sdpa(inp, inp.q, inp.k, inp.v)


def _run_cpu_flash(inp, enc):
    q = enc.encode_q(inp.q, inp.q_positions, scale=inp.scale)  # the scale rides on the encoded query
    k = repeat_kv(enc.encode_k(inp.k, inp.k_positions), inp.groups)
    return cpu_flash.cpu_flash_attention(q, k, repeat_kv(inp.v, inp.groups), scale=1.0, q_positions=inp.q_positions,
                                         k_positions=inp.k_positions, causal=inp.causal)


def _run_triton_pope(inp, enc, gate_keys):
    from .triton_pope import pope_attention_for

    enc.gate_source(inp.k, inp.v, gate_keys)  # refuses gate keys
    return pope_attention_for(enc, inp.q, inp.k, inp.v, q_positions=inp.q_positions, k_positions=inp.k_positions,
                              scale=inp.scale, causal=inp.causal, softplus=enc.softplus,
                              key_padding_mask=inp.key_padding_mask)


def _run_triton_cope(inp, enc, gate_keys):
    from .triton_cope import cope_attention_triton

    source = enc.gate_source(inp.k, inp.v, gate_keys)
    if not all_finite(inp.q, source):
        # a NaN gate logit has no position: the kernel would turn it into an integer index and read out of
        # bounds, so it is refused before the launch (the reference path propagates the NaN instead)
        raise ValueError(f"q and the gate {'keys' if source is inp.k else 'source'} must be finite for cope on the "
                         "triton path, got NaN or inf; backend='reference' returns NaN rows instead")
    pos_emb, slopes = enc.fused_operands()
    return cope_attention_triton(
        inp.q, inp.k, inp.v, pos_emb,
        causal=inp.causal, scale=inp.scale, q_positions=inp.q_positions, k_positions=inp.k_positions,
        p_max=enc.p_max, gate_keys=None if source is inp.k else source, key_padding_mask=inp.key_padding_mask,
        slopes=slopes,
    )


# `fused_kernel` declared by an encoding -> the runner that calls that kernel's module
_TRITON_RUNNERS = {"triton_pope": _run_triton_pope, "triton_cope": _run_triton_cope}


def _run_triton(inp, enc, gate_keys):
    return _TRITON_RUNNERS[enc.fused_kernel](inp, enc, gate_keys)


def _triton_served_names() -> str:
    """The registered encodings with a fused kernel, kernel by kernel: "pope, cope and cope-alibi"."""
    names = [n for kernel in _TRITON_RUNNERS for n in registered_names() if encoding_class(n).fused_kernel == kernel]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def choose_backend(enc: PositionalEncoding, q: torch.Tensor, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        if q.is_cuda and triton_available() and triton_serves(enc):
            return "triton"
        if q.device.type == "cpu" and enc.kind == "contextual" and enc.fused_kernel in _BLOCKED_CONTEXTUAL:
            return "blocked-contextual"
        return "sdpa" if sdpa_serves(enc) else "reference"
    if backend == "sdpa" and not sdpa_serves(enc):
        raise ValueError(f"backend='sdpa' cannot serve the {enc.kind} encoding {enc.name!r}; use 'reference' or 'triton'")
    if backend == "triton":
        if enc.fused_kernel in _TRITON_RUNNERS and enc.position_coords:
            raise ValueError(f"backend='triton' takes scalar positions only; the encoding {enc.name!r} has axial_dims "
                             f"({enc.position_coords} coordinates per position): use backend='auto' or 'sdpa'")
        if not triton_serves(enc):
            raise ValueError(f"backend='triton' serves only {_triton_served_names()}, got {enc.name!r}")
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package (pip install 'poskit[triton]')")
        if not q.is_cuda:
            # triton's own reading of TRITON_INTERPRET (so "0" means off, "true" on), not mere presence
            from triton import knobs

            if not knobs.runtime.interpret:
                raise ValueError(f"backend='triton' needs CUDA tensors, got q on {q.device} (CPU tensors run only "
                                 "under the Triton interpreter: TRITON_INTERPRET=1 before triton is imported)")
    return backend


def route(enc: PositionalEncoding, q: torch.Tensor, k: torch.Tensor | None = None, backend: str = "auto") -> str:
    """The path `attention(q, k, ...)` takes: "reference", "sdpa", "blocked" (the exact CPU path of
    attention/blocked.py, taken inside the sdpa backend by PoPE's wide q/k and by ALiBi's generated bias),
    "blocked-bias" (attention/blocked_bias.py: a learned bias such as relative's, on CPU),
    "blocked-contextual" (attention/blocked_cope.py: cope and cope-alibi on CPU under auto), "cpu-flash"
    (attention/cpu_flash.py: the opt-in compiled kernel for qk_width > 1 in fp32, POSKIT_CPU_KERNEL=1)
    or "triton".
    k defaults to q's length."""
    chosen = choose_backend(enc, q, backend)
    if q.shape[-2] == 0 or (k is not None and k.shape[-2] == 0):
        return "reference"  # no query or no key: attention() answers on the reference path, whatever the backend
    if chosen == "sdpa" and q.device.type == "cpu":
        if _is_static_bias(enc):
            return "blocked"
        if _is_learned_bias_on_cpu(enc, q):
            return "blocked-bias"
        inp = AttentionInputs(q, q if k is None else k, None, None, None, 1.0, True, None)
        if cpu_flash.serves(inp, enc):
            return "cpu-flash"
        if use_blocked(inp, enc):
            return "blocked"
    return chosen


_RUNNERS = {"reference": _run_reference, "sdpa": _run_sdpa, "triton": _run_triton,
            "blocked-contextual": _run_blocked_contextual}


def _check_dropout(dropout_p) -> None:
    # accepted for drop-in compatibility with SDPA calls that spell out dropout_p=0.0; attention-weight dropout
    # is not implemented by any poskit path
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0 (poskit.attention has no attention-weight dropout), got {dropout_p!r}")


def attention(q, k, v, enc, *, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None,
              enable_gqa: bool = False, q_positions=None, k_positions=None, gate_keys=None, backend: str = "auto",
              **removed) -> torch.Tensor:
    """(B, H, Tq, Dv) == softmax(attention_scores(q, k, enc, ...)) @ v, by the fastest exact path.

    The keywords are those of `F.scaled_dot_product_attention`, with the same meanings and defaults, plus
    the encoding `enc` and poskit's own `q_positions`, `k_positions`, `gate_keys`, `backend`:

    attn_mask: bool (True = attend) or float of q's dtype (added to the logits), broadcastable to
        (B, H, Tq, Tk). May be combined with is_causal (both apply).
    is_causal: causal *by position*: key s is visible to query t iff k_positions[s] <= q_positions[t]. With
        the default positions (arange) that is SDPA's top-left aligned mask, for any Tq and Tk; to attend a
        few new queries to a longer cache (bottom-right), give their positions, e.g.
        q_positions=torch.arange(Tk - Tq, Tk).
    scale: default 1/sqrt(head_dim) of q (before any encoding widens it).
    enable_gqa: False requires H == H_kv, as SDPA; True lets H_kv divide H (query head h reads kv head
        h // (H // H_kv)).
    dropout_p: only 0.0 (no attention-weight dropout).

    A query that sees no key outputs zeros on every path (CPU SDPA of torch 2.13 also gives 0 there).
    See `poskit.attention_scores` for the other conventions (shapes, positions).
    """
    refuse_renamed("attention", removed)
    _check_dropout(dropout_p)
    if v is None:
        raise ValueError("v must be a tensor (B, H_kv, Tk, Dv), got None")
    inp = prepare(q, k, v, enc, causal=is_causal, q_positions=q_positions, k_positions=k_positions, scale=scale,
                  attn_mask=attn_mask, enable_gqa=enable_gqa)
    chosen = choose_backend(enc, q, backend)
    if not inp.has_pairs:  # no query or no key: empty rows, or rows of zeros (no visible key), on every path
        chosen = "reference"
    elif inp.attn_mask is not None and chosen in ("triton", "blocked-contextual"):  # key padding only
        if backend == "triton":
            raise ValueError("backend='triton' serves attn_mask only when it varies along the keys alone (a key "
                             "padding mask, shape (B, 1, 1, Tk)); use backend='auto' for a general mask")
        chosen = "sdpa" if sdpa_serves(enc) else "reference"  # the paths that are exact with a general mask
    return _RUNNERS[chosen](inp, enc, gate_keys)


def cached_attention(q, k, v, enc, cache, layer_idx: int, q_positions, *, attention_mask=None, gate_keys=None,
                     backend: str = "auto", **removed):
    """Append the new keys/values at `q_positions` to layer `layer_idx` of `cache`, then attend the new
    queries to everything cached, causally by position. Equals the corresponding rows of a full forward.

    q: (B, H, Tn, D); k, v: (B, H_kv, Tn, .) for the same Tn new tokens (H_kv dividing H: grouped-query
    attention is implicit here); q_positions (Tn,) or (B, Tn), required
    (e.g. `torch.arange(cache.next_position(), cache.next_position() + Tn)`): a default of arange(Tn) would
    silently put a later token at position 0.
    attention_mask: (B, Tn) bool or 0/1 ints, True/1 = real token, 0 = padding (Hugging Face's convention),
    for the new tokens; stored in the cache beside their keys, so that no later query attends to a pad, and
    for CoPE pads count in no gate sum. Give pads positions that keep each row's real tokens at 0, 1, 2, ...
    (`poskit.attention.padding.padded_positions`).
    The encoding's `cache_form` says what is cached: rope (static frequencies) caches the rotated key and pope
    the key magnitude softplus(k) (attention/pope_decode.py), so a decode step encodes only the new token;
    every other encoding caches raw keys (CoPE recomputes its gates per query, dynamic NTK re-rotates).

    Everything is validated before the cache is touched (shapes, dtypes and widths against the cached ones,
    gate keys, the positions the encoding accepts over the whole cache): a refused step leaves it unchanged.
    """
    refuse_renamed("cached_attention", removed)
    if v is None:
        raise ValueError("v must be a tensor (B, H_kv, Tn, Dv), got None")
    if q_positions is None:
        raise ValueError("q_positions must be given to cached_attention: the (Tn,) or (B, Tn) positions of the new "
                         "tokens, e.g. torch.arange(cache.next_position(), cache.next_position() + Tn)")
    real = None if attention_mask is None else real_token_mask(attention_mask, q.shape[0], q.shape[2], q.device)
    inp = prepare(q, k, v, enc, causal=True, q_positions=q_positions, k_positions=q_positions, scale=None,
                  key_padding_mask=real)
    chosen = choose_backend(enc, q, backend)
    if not inp.has_pairs:  # no new token: nothing to append, and no query to answer
        return _run_reference(inp, enc, gate_keys)
    layer = cache.layer(layer_idx)
    enc.gate_source(inp.k, inp.v, gate_keys)  # refuses gate keys the encoding does not take, or lacks
    if enc.cache_form == "magnitude" and chosen != "reference":
        from .pope_decode import cached_pope_attention

        _check_positions_over_cache(enc, inp, layer)
        return cached_pope_attention(enc, inp, layer, use_triton=chosen == "triton")  # its append validates first
    encoded = enc.cache_form == "encoded" and chosen == "sdpa"
    keys = enc.encode_k(k, inp.k_positions) if encoded else k
    layer.check_append(keys, v, inp.k_positions, gate_keys=gate_keys, encoded=encoded, key_mask=real)
    _check_positions_over_cache(enc, inp, layer)
    layer = layer._write(keys, v, inp.k_positions, gate_keys, encoded, None, real)  # checked above
    if not encoded:
        pad = layer.key_mask
        return attention(q, layer.keys, layer.values, enc, is_causal=True, enable_gqa=True,
                         q_positions=inp.q_positions, k_positions=layer.positions, gate_keys=layer.gate_keys,
                         attn_mask=None if pad is None else pad[:, None, None, :], backend=backend)
    full = AttentionInputs(q, layer.keys, layer.values, inp.q_positions, layer.positions, inp.scale, True,
                           layer.key_mask, False)
    if use_blocked(full, enc):
        q_enc = enc.encode_q(q, inp.q_positions, scale=inp.scale)
        return blocked(full, q_enc, layer.keys, layer.values, prescaled=True)
    return sdpa(full, enc.encode_q(q, inp.q_positions), layer.keys, layer.values)


def _check_positions_over_cache(enc: PositionalEncoding, inp: AttentionInputs, layer) -> None:
    """Raise ValueError, before appending, for key positions the encoding cannot represent over the whole
    cache once the new tokens are added (e.g. CoPE decoding a position earlier than a cached one)."""
    if type(enc).check_positions is PositionalEncoding.check_positions:
        return  # accepts every position: skip building the key positions and the visibility mask
    kp = inp.k_positions
    if layer.length:
        cached = layer.positions
        if kp.shape[0] != cached.shape[0] and 1 not in (kp.shape[0], cached.shape[0]):
            raise ValueError(f"q_positions must have batch 1 or {cached.shape[0]} to extend the cache, got "
                             f"{tuple(kp.shape)}")
        b = max(cached.shape[0], kp.shape[0])
        kp = torch.cat((cached.expand(b, -1), kp.expand(b, -1)), -1)
    visible = kp[:, None, None, :] <= inp.q_positions[:, None, :, None]
    real = _key_mask_after_append(layer, inp)
    if real is not None:
        visible = visible & real[:, None, None, :]
    enc.check_positions(inp.q_positions, kp, visible)


def _key_mask_after_append(layer, inp: AttentionInputs):
    """(B, L + Tn) bool: the layer's key mask once the new tokens are appended, or None when all are real."""
    new, cached = inp.key_padding_mask, layer.key_mask
    if new is None and cached is None:
        return None
    B, Tn = inp.k.shape[0], inp.k.shape[2]
    if new is None:
        new = torch.ones(B, Tn, dtype=torch.bool, device=inp.k.device)
    if cached is None:
        cached = torch.ones(B, layer.length, dtype=torch.bool, device=inp.k.device)
    return torch.cat((cached, new), -1)
