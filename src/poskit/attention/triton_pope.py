"""Fused PoPE flash attention (forward + backward) in Triton.

PoPE (Polar Coordinate Positional Embedding, eq. 2-9 of the paper) scores a
query ``q_t`` against a key ``k_s`` as

    logit[t, s] = scale * sum_c mu_q[t, c] * mu_k[s, c] * cos(a_k[s, c] - a_q[t, c] + delta[h, c])

with ``mu = softplus(x)`` (or ``x`` itself when ``softplus=False``) and angles
``a_q[t, c] = q_pos[t] * theta_c``, ``a_k[s, c] = k_pos[s] * theta_c``.  In
Cartesian form (eq. 9) this is ``scale * (q'_x . k'_x + q'_y . k'_y)`` with

    q'_x = mu_q * cos(a_q - delta),  q'_y = mu_q * sin(a_q - delta)
    k'_x = mu_k * cos(a_k),          k'_y = mu_k * sin(a_k)

(the phase bias sits on the query side so that GQA keys stay shared).

The kernels read ``q``/``k``/``v`` plus the d-wide ``cos``/``sin`` tables of
the angles (computed by the caller in float64 and cast to fp32, so that large
positions keep their precision), build ``q'``/``k'`` in registers and never
write the 2d-wide Cartesian tensors to global memory.  The backward pass is
FlashAttention-2 style: the forward saves the row logsumexp, the backward
recomputes P; one kernel computes dk/dv (looping over the query heads of a GQA
group, so no atomics), another computes dq and per-block partials of
d delta, which are reduced in torch.

Masking is by *position*: with ``is_causal=True`` key ``s`` is visible to query
``t`` iff ``k_positions[s] <= q_positions[t]`` (so a block of new queries
against a KV cache works).  Whole key/query blocks are skipped using per-block
min/max positions computed on the host side with a few tiny torch ops (no
device sync); skipping is exact for any ordering and most effective when
queries and keys are sorted ascending by position, which is what all callers
do.  Masking inside the remaining blocks is always element-wise.  Rows with
no visible key produce 0 output and zero gradients.

On CPU the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``
must be set before ``triton`` is imported).

Layers, as in FlashAttention, one module each: ``pope_attention_triton`` (argument
checks) -> the ``torch.library`` op ``poskit::pope_attn_fwd`` with its registered
autograd formula (``poskit::pope_attn_bwd``; both opaque to ``torch.compile``) ->
``_launch_fwd`` / ``_launch_bwd`` (launch set-up), all in this module -> the forward
kernel (triton_pope_fwd.py, with the device helpers both directions share) and the
backward kernels (triton_pope_bwd.py).  What the CoPE kernels share with these
(checks, launch set-up, the online softmax step, block ranges) lives in
triton_core.py and blocks.py, with the naming scheme described there.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .inputs import deprecated_causal

from .blocks import cdiv, key_block_bounds, query_block_bounds
from .triton_core import HAS_TRITON, LOG2E, check_position_shape, check_qkv, is_interpreted, launch_setup, next_pow2

if HAS_TRITON:
    from .triton_pope_bwd import _pope_bwd_dkdv_kernel, _pope_bwd_dq_kernel, _pope_bwd_preprocess
    from .triton_pope_fwd import _pope_fwd_kernel

__all__ = ["pope_attention_triton", "pope_attention_for", "kernels_interpreted", "HAS_TRITON",
           "BLOCK_CONFIG_OVERRIDE", "GQA_DKDV_MODE"]

# Optional overrides of the launch configuration, e.g. from a benchmark sweep:
#   BLOCK_CONFIG_OVERRIDE["fwd"] = (BLOCK_M, BLOCK_N, num_warps, num_stages)
# keys: "fwd", "bwd_dkdv", "bwd_dq".
BLOCK_CONFIG_OVERRIDE: dict = {}
# GQA dk/dv strategy: "loop" (each program loops over the query heads of its kv group,
# no extra memory), "split" (one program per query head writing fp32 partials summed in
# torch: GROUP x more programs, for small B * Hkv * Tk), "auto" (split when looping would
# launch fewer than 2 programs per SM).
GQA_DKDV_MODE: str = "auto"


# ---------------------------------------------------------------------------
# launch set-up
# ---------------------------------------------------------------------------
def _config(kind: str, block_d: int, device: torch.device, tq: int, dtype: torch.dtype = torch.float32):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a kernel.

    BLOCK_M indexes queries and BLOCK_N keys in every kernel.  Chosen by the
    padded head dim; untuned guesses for H100-class GPUs (sweep with
    benchmarks/triton_pope.py and set BLOCK_CONFIG_OVERRIDE), reduced where a
    launch found that they do not fit the GPU's shared memory (_launch_fitting)."""
    if kind in BLOCK_CONFIG_OVERRIDE:
        return tuple(BLOCK_CONFIG_OVERRIDE[kind])
    if device.type != "cuda":  # interpreter: small blocks are fastest
        return (32, 32, 4, 1)
    bm, bn, warps, stages = _FITTED.get(_fit_key(kind, block_d, dtype, device)) or _gpu_config(kind, block_d)
    if kind != "bwd_dkdv":  # few queries (decode): don't waste a 128-row tile
        bm = min(bm, next_pow2(tq))
    return bm, bn, warps, stages


# (kernel, padded head dim, dtype, device) -> the configuration a launch shrank the default to
_FITTED: dict = {}


def _fit_key(kind, block_d, dtype, device):
    return kind, block_d, dtype, str(device)


def _smaller(config):
    """The next configuration to try when `config` needs more shared memory than the GPU has: fewer pipeline
    stages first, then smaller key blocks, then smaller query blocks; None when nothing is left to shrink."""
    bm, bn, warps, stages = config
    if stages > 1:
        return bm, bn, warps, stages - 1
    if bn > 16:
        return bm, bn // 2, warps, stages
    if bm > 16:
        return bm // 2, bn, warps, stages
    return None


def _launch_fitting(kind, block_d, device, tq, dtype, launch):
    """launch(BM, BN, warps, stages) with the kernel's configuration, shrunk (_smaller) for as long as Triton
    refuses it for want of shared memory. The refusal comes when the compiled kernel is loaded, before anything
    runs, so a retry starts from clean outputs. The defaults were chosen on an H100 for bf16; fp32 tiles at head
    dims 128 and 256 need more than its 227 KiB, and other GPUs have less. What fitted is remembered (_FITTED)."""
    from triton.runtime.errors import OutOfResources

    key = _fit_key(kind, block_d, dtype, device)
    first = config = _config(kind, block_d, device, tq, dtype)
    while True:
        try:
            return launch(*config)
        except OutOfResources:
            config = _smaller(config) if kind not in BLOCK_CONFIG_OVERRIDE else None
            if config is None:
                raise
            # remembered for every call: BLOCK_M as the default had it unless this shrink lowered it (a call
            # with few queries starts from a lower BLOCK_M than the default)
            remembered_bm = (_FITTED.get(key) or _gpu_config(kind, block_d))[0] if config[0] == first[0] else config[0]
            _FITTED[key] = (remembered_bm, *config[1:])


def _gpu_config(kind: str, block_d: int):
    if kind == "fwd":
        if block_d <= 64:
            return (128, 64, 4, 3)
        if block_d <= 128:
            return (128, 64, 8, 2)
        return (64, 32, 4, 2)
    if kind == "bwd_dkdv":
        if block_d <= 64:
            return (32, 64, 4, 3)
        if block_d <= 128:
            return (32, 64, 8, 2)
        return (32, 32, 8, 1)
    if kind == "bwd_dq":
        if block_d <= 64:
            return (64, 64, 4, 3)
        if block_d <= 128:
            return (64, 32, 8, 2)
        return (32, 32, 8, 1)
    raise KeyError(kind)


def _gqa_head_split(group: int, n_programs: int, device: torch.device) -> bool:
    """Whether the dk/dv kernel should split GQA groups across programs."""
    mode = GQA_DKDV_MODE
    if mode not in ("auto", "loop", "split"):
        raise ValueError(f"GQA_DKDV_MODE must be 'auto', 'loop' or 'split', got {mode!r}")
    if group == 1 or mode == "loop":
        return False
    if mode == "split":
        return True
    if device.type != "cuda":
        return False
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return n_programs < 2 * sms


def _pos2d(pos: torch.Tensor) -> torch.Tensor:
    return pos.unsqueeze(0) if pos.dim() == 1 else pos


def _tab_strides(t: torch.Tensor):
    # batch stride 0 for an unbatched or size-1 leading dim: every sequence reads the same rows
    if t.dim() == 3:
        return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1), t.stride(2)
    return 0, t.stride(0), t.stride(1)


def _pos_strides(p: torch.Tensor):
    if p.dim() == 2:
        return (p.stride(0) if p.shape[0] > 1 else 0), p.stride(1)
    return 0, p.stride(0)


def kernels_interpreted() -> bool:
    """True when the kernels were built for the Triton interpreter (TRITON_INTERPRET=1
    was set when this module was imported), i.e. they can run on CPU tensors."""
    return HAS_TRITON and is_interpreted(_pope_fwd_kernel)


def _setup(q, k, v):
    return launch_setup(q, k, v, interpreted=kernels_interpreted(), op="pope_attention_triton", module=__name__,
                        tf32=torch.backends.cuda.matmul.allow_tf32)


def _phase_tables(delta):
    """cos and sin of the phase bias, fp32 (H, D)."""
    dtf = delta.detach().to(torch.float32)
    return torch.cos(dtf).contiguous(), torch.sin(dtf).contiguous()


def _padding(key_padding_mask, stand_in):
    """(pointer argument, (batch stride, key stride)) of the key padding mask; stand_in when there is none
    (HAS_PAD=False switches its loads off)."""
    if key_padding_mask is None:
        return stand_in, (0, 0)
    pad = key_padding_mask.view(torch.uint8)
    return pad, (pad.stride(0), pad.stride(1))


def _causal_bounds(bounds_fn, causal, q_positions, k_positions, stand_in, *blocks):
    """(pointer argument, (batch stride, block stride)) of the block ranges bounds_fn computes from the
    positions; without causal masking the kernels derive them from the lengths and never read it."""
    if not causal:
        return stand_in, (0, 0)
    bounds = bounds_fn(_pos2d(q_positions), _pos2d(k_positions), *blocks)
    return bounds, (bounds.stride(0) if bounds.shape[0] > 1 else 0, bounds.stride(1))


def _launch_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                key_padding_mask, causal, scale, softplus):
    L = _setup(q, k, v)
    pcos, psin = _phase_tables(delta)
    out = torch.empty((L.B, L.H, L.Tq, L.Dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((L.B, L.H, L.Tq), device=q.device, dtype=torch.float32)
    pad, pad_strides = _padding(key_padding_mask, pcos)
    _launch_fitting("fwd", L.block_d, q.device, L.Tq, q.dtype,
                    lambda BM, BN, warps, stages: _fwd_kernel(L, q, k, v, pcos, psin, q_cos, q_sin, k_cos, k_sin,
                                                              q_positions, k_positions, pad, pad_strides, out, lse,
                                                              causal, scale, softplus, key_padding_mask, BM, BN,
                                                              warps, stages))
    return out, lse


def _fwd_kernel(L, q, k, v, pcos, psin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad, pad_strides,
                out, lse, causal, scale, softplus, key_padding_mask, BM, BN, warps, stages):
    bounds, bound_strides = _causal_bounds(key_block_bounds, causal, q_positions, k_positions, pcos, L.Tk, BM, BN)
    _pope_fwd_kernel[(cdiv(L.Tq, BM), L.H, L.B)](
        q, k, v, pcos, psin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad, bounds, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *_tab_strides(q_cos), *_tab_strides(k_cos),
        *_pos_strides(q_positions), *_pos_strides(k_positions), *pad_strides, *bound_strides,
        L.H, L.group, L.Tq, L.Tk, float(scale) * LOG2E,
        CAUSAL=bool(causal), HAS_PAD=key_padding_mask is not None, SOFTPLUS=bool(softplus),
        HEAD_D=L.D, HEAD_DV=L.Dv, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=L.block_d, BLOCK_DV=L.block_dv,
        DOT_DTYPE=L.dot_dtype, PRECISION=L.precision, num_warps=warps, num_stages=stages,
    )


def _launch_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                key_padding_mask, causal, scale, softplus, out, lse, dout):
    L = _setup(q, k, v)
    pcos, psin = _phase_tables(delta)
    pad, pad_strides = _padding(key_padding_mask, pcos)
    # arguments every backward kernel takes the same way
    inputs = (q, k, v, pcos, psin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad)
    table_strides = (*_tab_strides(q_cos), *_tab_strides(k_cos))
    pos_strides = (*_pos_strides(q_positions), *_pos_strides(k_positions))
    flags = dict(CAUSAL=bool(causal), HAS_PAD=key_padding_mask is not None, SOFTPLUS=bool(softplus),
                 HEAD_D=L.D, HEAD_DV=L.Dv, BLOCK_D=L.block_d, BLOCK_DV=L.block_dv,
                 DOT_DTYPE=L.dot_dtype, PRECISION=L.precision)

    # rowwise sum(o * do)
    dsum = torch.empty((L.B, L.H, L.Tq), device=q.device, dtype=torch.float32)
    pm = 32 if q.device.type != "cuda" else 64
    _pope_bwd_preprocess[(cdiv(L.Tq, pm), L.H, L.B)](
        out, dout, dsum, *out.stride(), *dout.stride(), L.H, L.Tq,
        HEAD_DV=L.Dv, BLOCK_M=pm, BLOCK_DV=L.block_dv,
    )

    # dk, dv: one program per (key block, kv head) looping over the group's query heads,
    # or, when that leaves the GPU idle, per (key block, query head) + a sum over groups
    def dkdv(BM, BN, warps, stages):
        n_n = cdiv(L.Tk, BN)
        head_split = _gqa_head_split(L.group, L.B * L.Hkv * n_n, q.device)
        if head_split:
            dk = torch.empty((L.B, L.H, L.Tk, L.D), device=q.device, dtype=torch.float32)
            dv = torch.empty((L.B, L.H, L.Tk, L.Dv), device=q.device, dtype=torch.float32)
        else:
            dk = torch.empty_like(k)
            dv = torch.empty_like(v)
        bounds, bound_strides = _causal_bounds(query_block_bounds, causal, q_positions, k_positions, pcos, BM, BN)
        _pope_bwd_dkdv_kernel[(n_n, L.H if head_split else L.Hkv, L.B)](
            *inputs, bounds, dout, lse, dsum, dk, dv,
            *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
            *table_strides, *pos_strides, *pad_strides, *bound_strides, L.H, L.group, L.Tq, L.Tk, float(scale),
            BLOCK_M=BM, BLOCK_N=BN, HEAD_SPLIT=head_split, num_warps=warps, num_stages=stages, **flags,
        )
        return dk, dv, head_split

    dk, dv, head_split = _launch_fitting("bwd_dkdv", L.block_d, q.device, L.Tq, q.dtype, dkdv)
    if head_split:
        dk = dk.view(L.B, L.Hkv, L.group, L.Tk, L.D).sum(2).to(k.dtype)
        dv = dv.view(L.B, L.Hkv, L.group, L.Tk, L.Dv).sum(2).to(v.dtype)

    # dq and per-block partials of d delta
    def dq_kernel(BM, BN, warps, stages):
        n_m = cdiv(L.Tq, BM)
        dq = torch.empty_like(q)
        ddelta_part = torch.empty((L.B, L.H, n_m, L.D), device=q.device, dtype=torch.float32)
        bounds, bound_strides = _causal_bounds(key_block_bounds, causal, q_positions, k_positions, pcos, L.Tk, BM, BN)
        _pope_bwd_dq_kernel[(n_m, L.H, L.B)](
            *inputs, bounds, dout, lse, dsum, dq, ddelta_part,
            *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
            *table_strides, *pos_strides, *pad_strides, *bound_strides, L.H, L.group, L.Tq, L.Tk, float(scale),
            BLOCK_M=BM, BLOCK_N=BN, num_warps=warps, num_stages=stages, **flags,
        )
        return dq, ddelta_part

    dq, ddelta_part = _launch_fitting("bwd_dq", L.block_d, q.device, L.Tq, q.dtype, dq_kernel)
    ddelta = ddelta_part.sum(dim=(0, 2)).to(delta.dtype)
    return dq, dk, dv, ddelta


# ---------------------------------------------------------------------------
# torch.library ops (opaque to torch.compile) and their autograd
# ---------------------------------------------------------------------------
@torch.library.custom_op("poskit::pope_attn_fwd", mutates_args=())
def _pope_attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
                   q_cos: torch.Tensor, q_sin: torch.Tensor, k_cos: torch.Tensor, k_sin: torch.Tensor,
                   q_positions: torch.Tensor, k_positions: torch.Tensor,
                   key_padding_mask: Optional[torch.Tensor],
                   causal: bool, scale: float, softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                       key_padding_mask, causal, scale, softplus)


@_pope_attn_fwd.register_fake
def _(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
      causal, scale, softplus):
    B, H, Tq, _ = q.shape
    out = q.new_empty((B, H, Tq, v.shape[3]))
    lse = q.new_empty((B, H, Tq), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("poskit::pope_attn_bwd", mutates_args=())
def _pope_attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
                   q_cos: torch.Tensor, q_sin: torch.Tensor, k_cos: torch.Tensor, k_sin: torch.Tensor,
                   q_positions: torch.Tensor, k_positions: torch.Tensor,
                   key_padding_mask: Optional[torch.Tensor],
                   causal: bool, scale: float, softplus: bool,
                   out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                       key_padding_mask, causal, scale, softplus, out, lse, dout)


@_pope_attn_bwd.register_fake
def _(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
      causal, scale, softplus, out, lse, dout):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(delta)


# The autograd layer (FlashAttention's autograd.Function) is registered on the op itself: dynamo cannot trace
# autograd.Function.apply when one tensor is passed twice (the same tables or positions for queries and keys,
# as self-attention passes them), while a registered formula keeps torch.compile fullgraph working.
def _setup_context(ctx, inputs, output):
    (q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
     causal, scale, softplus) = inputs
    out, lse = output
    ctx.has_pad = key_padding_mask is not None
    saved = [q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, out, lse]
    if ctx.has_pad:
        saved.append(key_padding_mask)
    ctx.save_for_backward(*saved)
    ctx.causal, ctx.scale, ctx.softplus = causal, scale, softplus


def _backward(ctx, dout, dlse):
    # the forward saved the row log-sum-exp; the backward kernels recompute the probabilities from it
    saved = ctx.saved_tensors
    (q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, out, lse) = saved[:12]
    key_padding_mask = saved[12] if ctx.has_pad else None
    dq, dk, dv, ddelta = _pope_attn_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin,
                                        q_positions, k_positions, key_padding_mask,
                                        ctx.causal, ctx.scale, ctx.softplus, out, lse,
                                        dout.contiguous())
    return dq, dk, dv, ddelta, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("poskit::pope_attn_fwd", _backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def _check_table(name, t, T, D, B):
    # a leading 1 broadcasts over the batch (the engine's positions are (1|B, T)); its stride is read as 0
    allowed = f"({T}, {D}), (1, {T}, {D}) or ({B}, {T}, {D})"
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of shape {allowed}")
    if tuple(t.shape) not in ((T, D), (1, T, D), (B, T, D)):
        raise ValueError(f"{name} must have shape {allowed} (T, D of the matching q/k), got {tuple(t.shape)}")


def _check_positions(name, p, T, B):
    if not isinstance(p, torch.Tensor) or p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of shape ({T},), (1, {T}) or ({B}, {T})")
    check_position_shape(name, p, T, B)


def _check_inputs(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
                  scale):
    """Raise ValueError naming the first argument that pope_attention_triton cannot take."""
    check_qkv(q, k, v)
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if not 16 <= D <= 256:
        raise ValueError(f"head dim D must be in [16, 256], got {D}")
    if not 1 <= Dv <= 256:
        raise ValueError(f"value head dim Dv must be in [1, 256], got {Dv}")
    if not isinstance(delta, torch.Tensor) or not delta.is_floating_point() or tuple(delta.shape) != (H, D):
        raise ValueError(f"delta must be a floating-point tensor of shape (H={H}, D={D}), got "
                         f"{tuple(delta.shape) if isinstance(delta, torch.Tensor) else type(delta)}")
    for name, t, T in (("q_cos", q_cos, Tq), ("q_sin", q_sin, Tq), ("k_cos", k_cos, Tk), ("k_sin", k_sin, Tk)):
        _check_table(name, t, T, D, B)
    if q_cos.shape != q_sin.shape:
        raise ValueError(f"q_cos and q_sin shapes differ: {tuple(q_cos.shape)} vs {tuple(q_sin.shape)}")
    if k_cos.shape != k_sin.shape:
        raise ValueError(f"k_cos and k_sin shapes differ: {tuple(k_cos.shape)} vs {tuple(k_sin.shape)}")
    _check_positions("q_positions", q_positions, Tq, B)
    _check_positions("k_positions", k_positions, Tk, B)
    if key_padding_mask is not None and (not isinstance(key_padding_mask, torch.Tensor)
                                         or key_padding_mask.dtype != torch.bool
                                         or tuple(key_padding_mask.shape) != (B, Tk)):
        raise ValueError(f"key_padding_mask must be a bool tensor of shape (B={B}, Tk={Tk}) (True = keep)")
    for name, t in (("k", k), ("v", v), ("delta", delta), ("q_cos", q_cos), ("q_sin", q_sin),
                    ("k_cos", k_cos), ("k_sin", k_sin), ("q_positions", q_positions),
                    ("k_positions", k_positions)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all inputs must share a device")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite float, got {scale}")


def pope_attention_triton(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, *, is_causal: bool | None = None,
                          scale: float, q_positions, k_positions, softplus: bool = True,
                          key_padding_mask=None, **renamed) -> torch.Tensor:
    """Fused PoPE attention (Triton, forward + backward).

    Args:
        q: (B, H, Tq, D) queries; k: (B, Hkv, Tk, D) keys; v: (B, Hkv, Tk, Dv) values.
            H % Hkv == 0 (GQA, HF ``repeat_kv`` order: query head h uses kv head h // (H // Hkv)).
            16 <= D <= 256, 1 <= Dv <= 256; dtype float32, float16 or bfloat16 (all equal).
        delta: (H, D) phase bias, already clamped (zeros for no phase bias); may require grad.
            Used in fp32 whatever the input dtype (phases of half-precision deltas would be off by up
            to ~3e-3 rad), and its gradient is accumulated and returned in fp32 (cast back to delta's
            dtype by autograd).
        q_cos, q_sin: cos/sin of the query angles q_pos * theta, (Tq, D), (1, Tq, D) or (B, Tq, D), fp32.
        k_cos, k_sin: same for keys, (Tk, D), (1, Tk, D) or (B, Tk, D).
        is_causal: mask by position: key s visible to query t iff k_positions[s] <= q_positions[t]
            (required; the former spelling causal= still works, with a DeprecationWarning).
        scale: logit scale (e.g. 1/sqrt(D)).
        q_positions, k_positions: integer (Tq,)/(1, Tq)/(B, Tq) and (Tk,)/(1, Tk)/(B, Tk); used for the
            causal mask.
            Block skipping is exact for any order but only effective for ascending positions.
        softplus: magnitudes are softplus(x) (paper) or x itself.
        key_padding_mask: optional (B, Tk) bool, True = keep.

    Returns (B, H, Tq, Dv) in q's dtype.  Rows with no visible key are 0.
    """
    causal = deprecated_causal("pope_attention_triton", is_causal, renamed)
    if renamed:
        raise TypeError(f"pope_attention_triton() got an unexpected keyword argument {next(iter(renamed))!r}")
    _check_inputs(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask, scale)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.contiguous()
    q_cos, q_sin, k_cos, k_sin = (t.to(torch.float32) for t in (q_cos, q_sin, k_cos, k_sin))
    # phases and the delta gradient in fp32 (a no-op for the fp32 delta the engine passes)
    delta = delta.to(torch.float32)
    out, _ = _pope_attn_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                            key_padding_mask, bool(causal), float(scale), bool(softplus))
    return out


def pope_attention_for(enc, q, k, v, *, q_positions, k_positions, scale: float, causal: bool,
                       softplus: bool, key_padding_mask=None, angles=None) -> torch.Tensor:
    """`pope_attention_triton` with the tables and the fp32 phase bias taken from a pope encoding.

    positions are (1|B, T), so the tables are (1|B, T, d); the kernel broadcasts a leading 1.
    softplus=False feeds magnitudes (a KV cache of softplus(k)) straight to the kernel.
    angles: (q_angles, k_angles), each (1|B, T, 2d) = [cos | sin] of the positions, where the caller has them
    (a KV cache keeps its keys' angles: a decode step then computes none over the whole cache).
    """
    if angles is None:
        qc, qs = enc.cos_sin(q_positions, torch.float32)
        kc, ks = enc.cos_sin(k_positions, torch.float32)
    else:
        d = q.shape[-1]
        (qc, qs), (kc, ks) = ((a[..., :d], a[..., d:]) for a in angles)
    return pope_attention_triton(q, k, v, enc.clamped_delta_fp32(q.device), qc, qs, kc, ks, is_causal=causal,
                                 scale=scale, q_positions=q_positions, k_positions=k_positions, softplus=softplus,
                                 key_padding_mask=key_padding_mask)
