"""What runs each path of the engine's plan: one function per path, `runner(inp, enc, gate_keys) -> (B, H, Tq, Dv)`.

The engine (engine.py) decides which runner serves a call, from the encoding's declarations and the inputs,
and names it in its `Plan`; a runner takes no decision of its own between paths. Inside a path, what depends
on the values stays where the values are read (SDPA's mask form from the positions, the materialised formula
for inputs holding NaN or inf, the blocked path's per-block key ranges).
"""
from __future__ import annotations

import torch

from . import cpu_flash
from .inputs import AttentionInputs, all_finite, repeat_kv
from .reference import scores_from_inputs, softmax_rows
from .sdpa import blocked, sdpa
from .traced import traced_sdpa

GATE_KEYS_REFUSED = "gate_keys is only accepted by contextual encodings (cope, cope-alibi) with gates='separate'"


def _refuse_gate_keys(gate_keys) -> None:
    if gate_keys is not None:  # the sdpa backend serves no contextual encoding, so none that takes gate keys
        raise ValueError(GATE_KEYS_REFUSED)


def run_reference(inp: AttentionInputs, enc, gate_keys):
    """The materialised logits (reference.py), every encoding, any dtype."""
    logits, visible = scores_from_inputs(inp, enc, gate_keys)
    return softmax_rows(logits, visible).to(inp.v.dtype) @ repeat_kv(inp.v, inp.groups)


def run_traced_sdpa(inp: AttentionInputs, enc, gate_keys):
    """The sdpa backend under torch.compile: no decision that reads tensor values (traced.py)."""
    _refuse_gate_keys(gate_keys)
    return traced_sdpa(inp, enc)


def run_sdpa_qk(inp: AttentionInputs, enc, gate_keys):
    """q and k encoded by the encoding's transform_qk, then SDPA."""
    _refuse_gate_keys(gate_keys)
    q, k = enc.transform_qk(inp.q, inp.k, inp.q_positions, inp.k_positions)
    return sdpa(inp, q, k, inp.v)


def run_sdpa_plain(inp: AttentionInputs, enc, gate_keys):
    """q and k as given (kind "none"), then SDPA."""
    _refuse_gate_keys(gate_keys)
    return sdpa(inp, inp.q, inp.k, inp.v)


def run_blocked_qk(inp: AttentionInputs, enc, gate_keys):
    """q/k wider than v on the blocked CPU path (blocked.py); the attention scale rides on the encoded query."""
    _refuse_gate_keys(gate_keys)
    q = enc.encode_q(inp.q, inp.q_positions, scale=inp.scale)
    return blocked(inp, q, enc.encode_k(inp.k, inp.k_positions), inp.v, prescaled=True)


def run_cpu_flash(inp: AttentionInputs, enc, gate_keys, served=cpu_flash.QK):
    """The compiled CPU kernel (cpu_flash.py): `served` is what cpu_flash.serves returned when the call was
    planned, QK (encoded q/k, the attention scale folded into q), QK_EQUAL (transform_qk's q/k, as SDPA gets
    them) or the KernelBias of a bias encoding."""
    _refuse_gate_keys(gate_keys)
    if served == cpu_flash.QK_EQUAL:
        q, k = enc.transform_qk(inp.q, inp.k, inp.q_positions, inp.k_positions)
        return cpu_flash.cpu_flash_attention(q, k, inp.v, scale=inp.scale, q_positions=inp.q_positions,
                                             k_positions=inp.k_positions, causal=inp.causal,
                                             key_padding_mask=inp.key_padding_mask)
    if served is cpu_flash.QK:
        q = enc.encode_q(inp.q, inp.q_positions, scale=inp.scale)
        return cpu_flash.cpu_flash_attention(q, enc.encode_k(inp.k, inp.k_positions), inp.v, scale=1.0,
                                             q_positions=inp.q_positions, k_positions=inp.k_positions,
                                             causal=inp.causal, key_padding_mask=inp.key_padding_mask)
    from .blocked_bias import check_positions_by_block

    check_positions_by_block(enc, inp)  # (relative without cap refuses offsets past its table)
    return cpu_flash.cpu_flash_attention(inp.q, inp.k, inp.v, scale=inp.scale, q_positions=inp.q_positions,
                                         k_positions=inp.k_positions, causal=inp.causal,
                                         key_padding_mask=inp.key_padding_mask, bias=served)


def run_cpu_flash_contextual(inp: AttentionInputs, enc, gate_keys):
    """A contextual encoding (CoPE, cope-alibi) with gates from the keys through the compiled CPU kernel."""
    enc.gate_source(inp.k, inp.v, gate_keys)  # refuses gate keys the encoding does not take
    enc.check_positions(inp.q_positions, inp.k_positions, None)  # keys in order, as the gates' sums need
    pos_emb, slopes = enc.fused_operands()
    return cpu_flash.cpu_flash_contextual_attention(
        inp.q, inp.k, inp.v, scale=inp.scale, p_max=enc.p_max, pos_emb=pos_emb, slopes=slopes,
        q_positions=inp.q_positions, k_positions=inp.k_positions, causal=inp.causal,
        key_padding_mask=inp.key_padding_mask)


def run_blocked_static_bias(inp: AttentionInputs, enc, gate_keys):
    """A bias of positions alone (ALiBi) generated block by block on the blocked CPU path, instead of a T x T
    float mask (which slows CPU SDPA ~1.7x)."""
    from .blocked_bias import check_positions_by_block

    _refuse_gate_keys(gate_keys)
    check_positions_by_block(enc, inp)  # no (Tq, Tk) visibility mask on the CPU paths
    q, qp, kp = inp.q, inp.q_positions, inp.k_positions
    return blocked(inp, q, inp.k, inp.v,
                   bias_fn=lambda i, j, ke: enc.bias(q[:, :, i:j], qp[:, i:j], kp[:, :ke], inp.scale))


def run_blocked_bias(inp: AttentionInputs, enc, gate_keys):
    """A bias that reads q or trains (relative), and its gradient, per query block (blocked_bias.py)."""
    from .blocked_bias import blocked_bias_attention, check_positions_by_block

    _refuse_gate_keys(gate_keys)
    check_positions_by_block(enc, inp)
    return blocked_bias_attention(inp.q, inp.k, inp.v, enc, scale=inp.scale, q_positions=inp.q_positions,
                                  k_positions=inp.k_positions, causal=inp.causal,
                                  key_padding_mask=inp.key_padding_mask)


def run_sdpa_bias(inp: AttentionInputs, enc, gate_keys):
    """The encoding's bias, computed for this call, as SDPA's float mask (merged with any attn_mask)."""
    _refuse_gate_keys(gate_keys)
    enc.check_positions(inp.q_positions, inp.k_positions, inp.visible())
    return sdpa(inp, inp.q, inp.k, inp.v, bias=enc.bias(inp.q, inp.q_positions, inp.k_positions, inp.scale))


def run_sdpa_static_bias(inp: AttentionInputs, enc, gate_keys):
    """A bias of positions alone, built once per shape and positions and reused, as SDPA's float mask."""
    _refuse_gate_keys(gate_keys)
    enc.check_positions(inp.q_positions, inp.k_positions, inp.visible())
    return sdpa(inp, inp.q, inp.k, inp.v, bias=_static_bias(enc, inp))


def _static_bias(enc, inp: AttentionInputs):
    cache = enc.__dict__.setdefault("_bias_cache", {})
    # the tensors' versions: frozen weights changed in place (load_state_dict, a step elsewhere) give a new key
    versions = tuple(t._version for t in (*enc.parameters(), *enc.buffers()))
    key = (inp.q_positions.shape, inp.k_positions.shape, inp.q.device, inp.q.dtype, versions)
    entry = cache.get(key)
    if entry is not None and torch.equal(entry[0], inp.q_positions) and torch.equal(entry[1], inp.k_positions):
        return entry[2]
    bias = enc.bias(inp.q, inp.q_positions, inp.k_positions, inp.scale)
    if len(cache) > 8:
        cache.clear()
    cache[key] = (inp.q_positions, inp.k_positions, bias)
    return bias


def _run_blocked_cope(inp: AttentionInputs, enc, gate_keys):
    from .blocked_cope import blocked_cope_attention

    source = enc.gate_source(inp.k, inp.v, gate_keys)
    pos_emb, slopes = enc.fused_operands()
    return blocked_cope_attention(
        inp.q, inp.k, inp.v, scale=inp.scale, q_positions=inp.q_positions, k_positions=inp.k_positions,
        causal=inp.causal, p_max=enc.p_max, pos_emb=pos_emb, slopes=slopes,
        gate_keys=None if source is inp.k else source, key_padding_mask=inp.key_padding_mask)


# `fused_kernel` declared by a contextual encoding -> its exact blocked CPU counterpart, which reads the same
# declared operands (p_max, gate_source, fused_operands)
BLOCKED_CONTEXTUAL = {"triton_cope": _run_blocked_cope}


def run_blocked_contextual(inp: AttentionInputs, enc, gate_keys):
    """A contextual encoding on CPU in query blocks (blocked_cope.py), never T x T."""
    return BLOCKED_CONTEXTUAL[enc.fused_kernel](inp, enc, gate_keys)


def _run_triton_pope(inp: AttentionInputs, enc, gate_keys):
    from .triton_pope import pope_attention_for

    enc.gate_source(inp.k, inp.v, gate_keys)  # refuses gate keys
    return pope_attention_for(enc, inp.q, inp.k, inp.v, q_positions=inp.q_positions, k_positions=inp.k_positions,
                              scale=inp.scale, causal=inp.causal, softplus=enc.softplus,
                              key_padding_mask=inp.key_padding_mask)


def _run_triton_cope(inp: AttentionInputs, enc, gate_keys):
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
        is_causal=inp.causal, scale=inp.scale, q_positions=inp.q_positions, k_positions=inp.k_positions,
        p_max=enc.p_max, gate_keys=None if source is inp.k else source, key_padding_mask=inp.key_padding_mask,
        slopes=slopes,
    )


# `fused_kernel` declared by an encoding -> the runner that calls that kernel's module
TRITON = {"triton_pope": _run_triton_pope, "triton_cope": _run_triton_cope}


def run_triton(inp: AttentionInputs, enc, gate_keys):
    """The fused Triton kernel the encoding declares (`fused_kernel`)."""
    return TRITON[enc.fused_kernel](inp, enc, gate_keys)


def run_sdpa_encoded_keys(inp: AttentionInputs, enc, gate_keys):
    """Keys cached already encoded (cache_form "encoded"): encode the queries alone, then SDPA."""
    return sdpa(inp, enc.encode_q(inp.q, inp.q_positions), inp.k, inp.v)


def run_cpu_flash_encoded_keys(inp: AttentionInputs, enc, gate_keys):
    """Keys cached already encoded, equal widths: encode the queries alone (the scale folded in), the CPU kernel."""
    return cpu_flash.cpu_flash_attention(enc.encode_q(inp.q, inp.q_positions, scale=inp.scale), inp.k, inp.v,
                                         scale=1.0, q_positions=inp.q_positions, k_positions=inp.k_positions,
                                         causal=inp.causal, key_padding_mask=inp.key_padding_mask)


def run_blocked_encoded_keys(inp: AttentionInputs, enc, gate_keys):
    """Keys cached already encoded, q/k wider than v: encode the queries alone (the scale folded in), blocked path."""
    return blocked(inp, enc.encode_q(inp.q, inp.q_positions, scale=inp.scale), inp.k, inp.v, prescaled=True)


def run_magnitude_decode(inp: AttentionInputs, enc, gate_keys, layer):
    """Append the new key magnitudes to the cache `layer`, then attend to it on CPU (pope_decode.py)."""
    from .pope_decode import cached_pope_attention

    return cached_pope_attention(enc, inp, layer, use_triton=False)


def run_magnitude_triton(inp: AttentionInputs, enc, gate_keys, layer):
    """Append the new key magnitudes to the cache `layer`, then attend to it with the fused kernel."""
    from .pope_decode import cached_pope_attention

    return cached_pope_attention(enc, inp, layer, use_triton=True)
