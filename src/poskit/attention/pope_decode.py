"""PoPE attention against a KV cache that holds key *magnitudes* mu_k = softplus(k), d wide.

Decoding is memory-bound: every step reads the whole cache. The Cartesian key mu_k [cos(s theta), sin(s theta)]
is 2d wide, so a Cartesian cache reads 3d numbers per token (keys + values) against RoPE's 2d, and measured
0.3-0.5x RoPE's decode speed (benchmarks/attention.py). The magnitude cache reads d + d like RoPE; the
angles cos(s theta), sin(s theta) are tables shared by every batch row and head, small enough to stay in
cache. The logits need them multiplied in per element,

    logit[r, s] = sum_c mu_k[s, c] * (a[r, c] cos(s theta_c) + b[r, c] sin(s theta_c)),
    [a | b] = scale * mu_q [cos(t theta - delta), sin(t theta - delta)]   (the Cartesian query, eq. 6-9),

which no GEMM expresses: eager PyTorch would write a (rows, L, d) temporary. So the sum is one fused loop. On
CPU, for fp32 and bf16, the compiled CPU kernel's decode (cpu_flash.magnitude_decode: logits, online softmax and
weighted values in one pass over the cache); for float16, where that kernel is switched off (POSKIT_CPU_KERNEL=0)
or cannot be built, or for a one-token step where this machine's calibration measured them faster than the
kernel, two `torch.compile`d loops (compiled once per process, shapes dynamic;
POSKIT_FUSED_DECODE=0 turns them off); on CUDA the fused Triton PoPE kernel (fed magnitudes with its softplus
off). Where none applies (float64, gradients, a prefill, more than KERNEL_MAX_NEW_TOKENS new tokens with a
causal mask inside the cache, no compiler), the Cartesian keys are rebuilt from the magnitudes: exact, slower.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import torch
import torch.nn.functional as F

from . import cpu_flash
from .grouped import bmm_in_place
from .inputs import AttentionInputs
from .reference import softmax_rows
from .sdpa import blocked, mask_plan, sdpa, use_blocked

_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_fused_failed = False  # set when compilation failed once: never retried in this process


def fused_decode_enabled() -> bool:
    """The torch.compile'd loops are used unless POSKIT_FUSED_DECODE=0 (or they failed to compile here)."""
    return os.environ.get("POSKIT_FUSED_DECODE", "1") != "0" and not _fused_failed


def _query_rows(mu_q, q_angles, delta, scale: float, kv_heads: int):
    """[a | b] = scale * mu_q [cos(t theta - delta), sin(t theta - delta)], PoPE's Cartesian query (eq. 6-9),
    as (B, Hkv, groups * Tq, d) fp32 each: query head h = kv * groups + j, as repeat_kv orders them.

    mu_q (B, H, Tq, d) fp32 magnitudes; q_angles (1|B, Tq, 2d) = [cos | sin] of the query positions * theta;
    delta (H, d) fp32.
    """
    B, H, Tq, d = mu_q.shape
    qc, qs = q_angles[:, None, :, :d], q_angles[:, None, :, d:]  # (1|B, 1, Tq, d)
    cd, sd = delta.cos()[:, None], delta.sin()[:, None]  # (H, 1, d)
    a = (scale * mu_q * (qc * cd + qs * sd)).reshape(B, kv_heads, -1, d)
    b = (scale * mu_q * (qs * cd - qc * sd)).reshape(B, kv_heads, -1, d)
    return a, b


def _magnitude_logits(mu_k, a, b, k_angles):
    """(B, Hkv, R, L) fp32: sum_c mu_k[s, c] (a[r, c] cos(s theta_c) + b[r, c] sin(s theta_c)).

    mu_k (B, Hkv, L, d); a, b (B, Hkv, R, d); k_angles (1|B, L, 2d) = [cos | sin] of the key positions.
    Compiled apart from _query_rows: in one graph the compiler inlines the query's softplus, cos and sin into
    this loop and recomputes them for every key (measured 2x slower).
    """
    d = mu_k.shape[-1]
    kc, ks = k_angles[:, None, None, :, :d], k_angles[:, None, None, :, d:]  # (1|B, 1, 1, L, d)
    return (mu_k.float()[:, :, None] * (a[..., None, :] * kc + b[..., None, :] * ks)).sum(-1)


# Keys per partial sum of the weighted values (64 and 128 measured alike, 256 and 512 slower).
VALUE_CHUNK = 128


def _weighted_values(weights, v):
    """(B, Hkv, 1, Dv) fp32: weights (B, Hkv, 1, L) fp32 @ v (B, Hkv, L, Dv) as one loop over the values where they
    lie, for a KV cache's bf16/fp16 values with room to grow: torch's batched product copies such a view whole,
    and one product per head measured slower for one query row (docs/benchmarks.md, "Decode against a cache with
    room to grow"). One row only: the loop reads the values once per row, a product once in all."""
    return (weights[..., None] * v[:, :, None].float()).sum(-2)


def _chunked_weighted_values(weights, v):
    """_weighted_values for L a multiple of VALUE_CHUNK, summed in two stages: VALUE_CHUNK keys at a time, then over
    the chunks. As one reduction over all L keys the compiled loop took twice as long (bf16, B=8, Hkv=8, 8192
    keys, 2 threads on the AVX-512 AMD EPYC: 4.0-4.2 against 2.1-2.2 ms). Apart from _weighted_values, which sums
    the last L % VALUE_CHUNK keys: in one graph, a length below one chunk gave the compiler an empty range."""
    chunks = weights.shape[-1] // VALUE_CHUNK
    return (weights.unflatten(-1, (chunks, VALUE_CHUNK))[..., None]
            * v[:, :, None].unflatten(3, (chunks, VALUE_CHUNK)).float()).sum(-2).sum(-2)


@functools.lru_cache(maxsize=1)
def _compiled():
    compile_ = functools.partial(torch.compile, dynamic=True, fullgraph=True)
    return (compile_(_query_rows), compile_(_magnitude_logits), compile_(_weighted_values),
            compile_(_chunked_weighted_values))


# Even with dynamic shapes, torch.compile specialises sizes 0 and 1 and the input dtypes: batch 1 or more, one kv
# head or more, one query per kv head or more, per-sequence or shared positions, and the cache's dtype give up
# to 48 variants of each of these functions in one process. torch's default of 8 per function was exhausted by a
# process that decoded at batch 1 and 2 with two head layouts (tests/test_pope_decode.py), after which every
# call fell back. A variant past that limit is compiled again with the limit raised for that call alone: only
# there, where a compile happens anyway, because the patch costs about 28 us, too much for every decode step.
# (torch logs its recompile-limit warning on each such first attempt: noise, in a process past 8 variants only.)
_RECOMPILE_LIMIT = 64
_limit_warned = False


def _run_logits(mu_q, q_angles, delta, mu_k, k_angles, scale: float):
    query_rows, magnitude_logits, _, _ = _compiled()
    a, b = query_rows(mu_q, q_angles, delta, scale, mu_k.shape[1])
    return magnitude_logits(mu_k, a, b, k_angles)


def _run_weighted_values(weights, v):
    _, _, weighted_values, chunked_weighted_values = _compiled()
    whole = v.shape[2] // VALUE_CHUNK * VALUE_CHUNK
    if whole == 0:
        return weighted_values(weights, v)
    out = chunked_weighted_values(weights[..., :whole], v[:, :, :whole])
    if whole < v.shape[2]:
        out = out + weighted_values(weights[..., whole:], v[:, :, whole:])
    return out


def _is_recompile_limit(err: Exception) -> bool:
    from torch._dynamo.exc import FailOnRecompileLimitHit

    return isinstance(err, FailOnRecompileLimitHit)


def _fused_logits(q, q_angles, delta, mu_k, k_angles, scale: float, softplus: bool):
    """(B, Hkv, groups * Tq, L) fp32 logits by the compiled kernels, or None when they cannot run here (then
    the caller takes the exact fallback)."""
    qf = q.float()
    mu_q = F.softplus(qf) if softplus else qf  # outside the graph: one compiled variant serves both settings
    return _run_guarded(_run_logits, mu_q, q_angles, delta, mu_k, k_angles, scale)


def _run_guarded(run, *args):
    """run(*args) with torch.compile's recompile limit raised where it was reached; None where the compiled
    kernels cannot run (warned once; after a failure to compile, never tried again in this process)."""
    global _fused_failed, _limit_warned
    try:
        try:
            return run(*args)
        except Exception as err:
            if not _is_recompile_limit(err):
                raise
        with torch._dynamo.config.patch(recompile_limit=max(_RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
            return run(*args)
    except Exception as err:
        if _is_recompile_limit(err):  # more variants than even the raised limit: this call falls back, later ones try
            if not _limit_warned:
                _limit_warned = True
                warnings.warn(f"poskit: the fused PoPE decode kernel reached torch.compile's recompile limit ({err}); "
                              "calls of new shapes or dtypes take the eager path instead, which is exact but slower",
                              RuntimeWarning)
            return None
        # no C++ compiler, an unsupported platform: warn once, fall back for good
        _fused_failed = True
        warnings.warn(f"poskit: the fused PoPE decode kernel could not be compiled ({type(err).__name__}: {err}); "
                      "falling back to the eager path (Cartesian keys rebuilt from the magnitudes), which is exact "
                      "but slower", RuntimeWarning)
        return None


def _weights_times_values(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """weights (B, Hkv, R, L) fp32 @ v (B, Hkv, L, Dv), in v's dtype. A KV cache's values are a view with gaps
    between heads, which torch's batched bf16/fp16 product copies whole first (the cache's size at every decode
    step): one query row (a decode step without grouped heads) takes the compiled loop (_weighted_values), more
    rows one product per head (grouped.bmm_in_place), which reads each head where it lies."""
    if v.dtype == torch.float32 or v.dtype == torch.float64 or v.is_contiguous():
        return weights.to(v.dtype) @ v
    if weights.shape[2] == 1 and fused_decode_enabled():
        out = _run_guarded(_run_weighted_values, weights, v)
        if out is not None:
            return out.to(v.dtype)
    B, Hkv, R, L = weights.shape
    return bmm_in_place(weights.to(v.dtype).reshape(B * Hkv, R, L), v.flatten(0, 1)).view(B, Hkv, R, v.shape[-1])


# Up to this many new tokens per step (a chunk of draft tokens, a prompt continuing the cache) the kernel's decode
# takes the step with a causal mask by position (from 16 rows per kv head by products of tiles inside it); more take
# the blocked path on Cartesian keys rebuilt from the magnitudes. On the 2-core AMD EPYC (B=8, H=8, 8192 cached keys)
# the kernel was 1.2-12x faster than the rebuilt keys from 4 to 512 new tokens (docs/benchmarks.md, "Several new
# tokens in one step"); 512 is the largest count measured, not a measured crossover.
KERNEL_MAX_NEW_TOKENS = 512


def _no_gradient_wanted(q: torch.Tensor, mu_k: torch.Tensor) -> bool:
    return not (torch.is_grad_enabled() and (q.requires_grad or mu_k.requires_grad))


def _kernel_serves(inp: AttentionInputs, q: torch.Tensor, mu_k: torch.Tensor, v: torch.Tensor) -> bool:
    """The compiled CPU kernel's decode: a step of at most KERNEL_MAX_NEW_TOKENS against keys cached before it (a
    prefill takes the full-sequence path, as training does), no gradient wanted, and a causal mask, if any, by
    scalar positions."""
    return (q.device.type == "cpu" and q.shape[2] <= KERNEL_MAX_NEW_TOKENS and mu_k.shape[2] > q.shape[2]
            and _no_gradient_wanted(q, mu_k)
            and inp.q_positions.dim() == 2 and inp.k_positions.dim() == 2
            and cpu_flash.serves_magnitude_decode(mu_k, v))


def _can_fuse(inp: AttentionInputs, q: torch.Tensor, mu_k: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype in _FUSED_DTYPES and fused_decode_enabled()
            and _no_gradient_wanted(q, mu_k)
            and mask_plan(dataclasses.replace(inp, key_padding_mask=None)) == "none")  # padding: applied below


def cache_entry(enc, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a magnitude cache holds for keys k (B, Hkv, T, d) at positions (1|B, T): the magnitudes
    enc.magnitude(k) and the angle table [cos | sin] of positions * theta, (1|B, T, 2d), looked up once per token
    and kept (fp32; float64 for float64 keys)."""
    table_dtype = torch.float64 if k.dtype == torch.float64 else torch.float32
    kcos, ksin = enc.cos_sin(positions, table_dtype)
    return enc.magnitude(k), torch.cat((kcos, ksin), -1)


def cached_pope_attention(enc, inp: AttentionInputs, layer, use_triton: bool) -> torch.Tensor:
    """Append the new tokens of `inp` (k = v positions = q positions) to `layer` as magnitudes, with the
    cos/sin of their positions, then attend the new queries to the whole layer. Returns (B, H, Tn, Dv)."""
    magnitudes, angles = cache_entry(enc, inp.k, inp.k_positions)
    layer = layer.append(magnitudes, inp.v, inp.k_positions, encoded=True, angles=angles,
                         key_mask=inp.key_padding_mask)
    return attend_magnitudes(enc, inp.q, angles, layer.keys, layer.values, inp.q_positions, layer.positions,
                             layer.angles, inp.scale, use_triton, key_mask=layer.key_mask)


def attend_magnitudes(enc, q: torch.Tensor, q_angles: torch.Tensor, mu_k: torch.Tensor, v: torch.Tensor,
                      q_positions: torch.Tensor, k_positions: torch.Tensor, k_angles: torch.Tensor, scale: float,
                      use_triton: bool, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(PoPE logits of q against cached magnitudes) @ v; causal by position.

    q (B, H, Tq, d) raw queries; q_angles (1|B, Tq, 2d) = [cos | sin] of q_positions * theta;
    mu_k (B, Hkv, L, d) = enc.magnitude(k); v (B, Hkv, L, Dv); q_positions (1|B, Tq), k_positions (1|B, L);
    k_angles (1|B, L, 2d) likewise; key_mask (B, L) bool, True = real key, or None. Returns (B, H, Tq, Dv).
    """
    inp = AttentionInputs(q, mu_k, v, q_positions, k_positions, scale, True, key_mask, False)
    if use_triton:
        from .triton_pope import pope_attention_for

        # the kernel takes magnitudes when its softplus is off
        return pope_attention_for(enc, enc.magnitude(q), mu_k, v, q_positions=q_positions, k_positions=k_positions,
                                  scale=scale, causal=True, softplus=False, key_padding_mask=key_mask,
                                  angles=(q_angles, k_angles))
    d = mu_k.shape[-1]
    # where the compiled loops could take the step too (one new token), this machine's calibration may have
    # measured them faster than the kernel (kernel_calibration, "magnitude_decode")
    # (the calibration's answer first: a lookup, where _can_fuse plans the mask)
    if _kernel_serves(inp, q, mu_k, v) and (cpu_flash.magnitude_decode_kernel_wins(mu_k.dtype)
                                            or not _can_fuse(inp, q, mu_k)):
        rows = enc.encode_q(q.float(), q_positions, scale=scale)  # (B, H, Tq, 2d): the phase bias and scale in
        # several new tokens: keys later than some query inside the cache, masked by position in the kernel
        causal = mask_plan(dataclasses.replace(inp, key_padding_mask=None)) != "none"
        out = cpu_flash.magnitude_decode(rows.reshape(mu_k.shape[0], mu_k.shape[1], -1, rows.shape[-1]), mu_k, v,
                                         k_angles, key_mask, *((q_positions, k_positions) if causal else ()))
        return out.to(v.dtype).reshape(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])
    if _can_fuse(inp, q, mu_k):
        logits = _fused_logits(q, q_angles.float(), enc.clamped_delta_fp32(q.device), mu_k, k_angles.float(),
                               scale, enc.softplus)
        if logits is not None:
            if key_mask is not None:  # padded keys; a query that sees no key gets zero weights, not NaN
                logits = logits.masked_fill(~key_mask[:, None, None, :], float("-inf"))
                weights = softmax_rows(logits, key_mask[:, None, None, :].expand(logits.shape))
            else:
                weights = torch.softmax(logits, dim=-1)
            out = _weights_times_values(weights, v)  # (B, Hkv, groups * Tq, Dv)
            return out.reshape(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])
    from ..encodings.polar_pair import polar_pair

    q2 = enc.encode_q(q, q_positions, scale=scale)  # (B, H, Tq, 2d), the scale folded in
    kcos, ksin = k_angles[:, None, :, :d].to(mu_k.dtype), k_angles[:, None, :, d:].to(mu_k.dtype)
    k2 = polar_pair(mu_k, kcos, ksin, False)  # (B, Hkv, L, 2d)
    if use_blocked(inp, enc):
        return blocked(inp, q2, k2, v, prescaled=True)
    return sdpa(AttentionInputs(q2, k2, v, q_positions, k_positions, 1.0, True, key_mask, False), q2, k2, v)
